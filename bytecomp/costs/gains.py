"""Gradient fidelity from a profile: each tensor's gain under each compressor
(``fidelity.csv``; see :mod:`bytecomp.profiler.fidelity` for the definitions).

A plan's fidelity composes its tensors' gains, ``sqrt(sum over tensors of
weight * gain^2)`` with weights summing to 1, uncompressed tensors counting 1;
its *effective time* is iteration time / fidelity (GraVAC's throughput x gain,
inverted): the time an iteration costs per unit of gradient it delivers.

The weights (``WEIGHTS``):

* ``params`` (default): each tensor's share of the parameters. Every parameter's
  update counts alike, as with Adam and other optimizers that normalize each
  parameter's step, where a small layer's bad gradient hurts as much as a large
  one's. Measured on a character-level transformer trained with Adam (see the
  time-to-accuracy benchmark in docs/benchmarks.md), this order of the strategies matched
  their steps to the target loss; the norm-weighted one did not (a plan that
  kept the dominant output layer exact but sent random-k and ACP-SGD on most
  other layers scored 0.92 by norm and 0.62 by parameters, and needed 1.49x
  fp32's steps).
* ``norm``: each tensor's share of the squared norm of the whole gradient: the
  gain of the whole gradient vector itself (GraVAC's), what matters for plain
  SGD, whose update is that vector.

Calibration by the convergence probe (:mod:`bytecomp.training.probe`): a gain
says how much of a step's gradient a compressor keeps, not how many more steps
training then needs, and the two disagree from one model to the next. Where
the profile trained a compressor on every tensor and measured its *steps
factor* s, and ``1 / s`` is below what its gains compose to on every tensor,
its gains are raised to the power that makes that composition ``1 / s``: mixed
plans then compose gains whose level is measured in steps, while the gains
still rank the tensors (a tensor that loses more still loses more). The
calibration only lowers: a compressor counts as good as the worse of its
gain and its probe, because a short probe can miss a late plateau (measured:
EF-signSGD on the digits convnet kept up for 100 steps, factor 1.14, then never
reached fp32's loss at step 240; its gain, 0.55, had said so). Effective time
= iteration time / fidelity is then predicted time per step of fp32 DDP.
An adaptive plan's levels are calibrated both ways (``lower_only=False``):
there the controller watches the gain live and leaves a level whose gain falls,
so the probe is taken at its word (measured: PowerSGD rank 8 on the
transformer kept 0.82 of the gradient but needed only 1.17x fp32's steps in
the probe, 1.10x to the target).
"""

from __future__ import annotations

from bytecomp.compress import canonical
from bytecomp.errors import BytecompError
from bytecomp.plan_types import UNCOMPRESSED
from bytecomp.profile_store import Profile

WEIGHTS = ("params", "norm")
MAX_POWER = 1e5  # a gain of 0.9999 raised to it is 0.00005: beyond any factor worth planning


class FidelityModel:
    """Gains by tensor name and canonical spec, and each tensor's weight."""

    def __init__(self, profile: Profile, weights: str = "params", calibrate: bool = True,
                 lower_only: bool = True) -> None:
        if weights not in WEIGHTS:
            raise BytecompError(f"unknown fidelity weights {weights!r}; choose from "
                                f"{', '.join(WEIGHTS)}")
        if not profile.has_fidelity:
            raise BytecompError(f"{profile.label}: the profile has no fidelity table "
                                f"(fidelity.csv); re-run bytecomp profile, or plan with "
                                f"--objective time")
        self.label = profile.label
        table = profile.fidelity
        self.gains = {(row.tensor, canonical(row.spec)): float(row.gain)
                      for row in table.itertuples()}
        names = list(profile.tensors["name"])
        if weights == "params":
            numel = dict(zip(profile.tensors["name"], profile.tensors["numel"]))
            count = sum(numel.values())
            self.shares = {name: numel[name] / count for name in names}
        else:
            # normalized over the tensors (medians over steps need not sum to 1); a tensor
            # the table lacks has no measured share: it counts as none of the norm
            norm = {row.tensor: float(row.norm_share) for row in table.itertuples()}
            total = sum(norm.values())
            self.shares = {name: (norm.get(name, 0.0) / total if total > 0
                                  else 1.0 / len(names)) for name in names}
        self.specs = {spec for _, spec in self.gains}
        self.powers: dict[str, float] = {}  # by spec: the calibration's power on its gains
        self.lower_only = lower_only
        self.factors = {canonical(spec): factor for spec, factor in
                        profile.steps_factors.items()} if calibrate else {}
        for spec, factor in self.factors.items():
            if spec in self.specs:
                self._calibrate(spec, 1.0 / max(factor, 1.0), names)

    def uniform(self, spec: str, names: list[str]) -> float:
        """``spec``'s gains composed over ``names``, as if it compressed every one."""
        return compose([self.shares[n] for n in names],
                       [self.gains.get((n, spec), 1.0) for n in names])

    def _calibrate(self, spec: str, target: float, names: list[str]) -> None:
        """Raise ``spec``'s gains to the power whose uniform composition is ``target``,
        where that is below what the gains compose to (a power of at least 1), or, not
        ``lower_only``, wherever it differs."""
        uniform = self.uniform(spec, names)
        if target >= uniform if self.lower_only else (target == uniform or uniform >= 1.0):
            self.powers[spec] = 1.0
            return
        gains = [self.gains.get((name, spec), 1.0) for name in names]
        shares = [self.shares[name] for name in names]

        def composed(power: float) -> float:
            return compose(shares, [g ** power for g in gains])

        low, high = 0.0, 1.0
        while composed(high) > target and high < MAX_POWER:
            low, high = high, high * 2
        for _ in range(60):  # bisection: composed() falls as the power grows
            middle = (low + high) / 2
            low, high = (middle, high) if composed(middle) > target else (low, middle)
        self.powers[spec] = high
        for name, gain in zip(names, gains):
            if (name, spec) in self.gains:
                self.gains[(name, spec)] = gain ** high

    def check(self, spec: str) -> None:
        """A one-line error unless the profile measured ``spec``'s fidelity."""
        if canonical(spec) not in self.specs:
            raise BytecompError(f"{self.label}: the profile has no fidelity for {spec} "
                                f"(profile it with --compressor {spec}, or plan with "
                                f"--objective time)")

    def gain(self, tensor: str, spec: str) -> float:
        """The tensor's median gain under ``spec`` (1 for no compression)."""
        if spec == UNCOMPRESSED:
            return 1.0
        return self.gains.get((tensor, spec), 1.0)  # absent: not measured (not trainable)


def compose(shares: list[float], gains: list[float]) -> float:
    """A plan's fidelity from its tensors' weights (summing to 1) and gains."""
    return sum(s * g * g for s, g in zip(shares, gains)) ** 0.5
