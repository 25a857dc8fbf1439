"""Gradient fidelity from a profile: each tensor's gain under each compressor
(``fidelity.csv``; see :mod:`bytecomp.profile.fidelity` for the definitions).

A plan's fidelity composes its tensors' gains, ``sqrt(sum over tensors of
weight * gain^2)`` with weights summing to 1, uncompressed tensors counting 1;
its *effective time* is iteration time / fidelity (GraVAC's throughput x gain,
inverted): the time an iteration costs per unit of gradient it delivers.

The weights (``WEIGHTS``):

* ``params`` (default): each tensor's share of the parameters. Every parameter's
  update counts alike, as with Adam and other optimizers that normalize each
  parameter's step, where a small layer's bad gradient hurts as much as a large
  one's. Measured on a character-level transformer trained with Adam (see the
  README's time-to-accuracy benchmark), this order of the strategies matched
  their steps to the target loss; the norm-weighted one did not (a plan that
  kept the dominant output layer exact but sent random-k and ACP-SGD on most
  other layers scored 0.92 by norm and 0.62 by parameters, and needed 1.49x
  fp32's steps).
* ``norm``: each tensor's share of the squared norm of the whole gradient: the
  gain of the whole gradient vector itself (GraVAC's), what matters for plain
  SGD, whose update is that vector.
"""

from __future__ import annotations

from bytecomp.compress import canonical
from bytecomp.errors import BytecompError
from bytecomp.profile.store import Profile

WEIGHTS = ("params", "norm")


class FidelityModel:
    """Gains by tensor name and canonical spec, and each tensor's weight."""

    def __init__(self, profile: Profile, weights: str = "params") -> None:
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

    def check(self, spec: str) -> None:
        """A one-line error unless the profile measured ``spec``'s fidelity."""
        if canonical(spec) not in self.specs:
            raise BytecompError(f"{self.label}: the profile has no fidelity for {spec} "
                                f"(profile it with --compressor {spec}, or plan with "
                                f"--objective time)")

    def gain(self, tensor: str, spec: str) -> float:
        """The tensor's median gain under ``spec`` (1 for no compression)."""
        if spec == "none":
            return 1.0
        return self.gains.get((tensor, spec), 1.0)  # absent: not measured (not trainable)


def compose(shares: list[float], gains: list[float]) -> float:
    """A plan's fidelity from its tensors' weights (summing to 1) and gains."""
    return sum(s * g * g for s, g in zip(shares, gains)) ** 0.5
