"""Gradient fidelity from a profile: each tensor's gain under each compressor and its
share of the squared gradient norm (``fidelity.csv``; see
:mod:`bytecomp.profile.fidelity` for the definitions).

A plan's fidelity is the gain of the whole gradient,
``sqrt(sum over tensors of share * gain^2)``, uncompressed tensors counting 1;
its *effective time* is iteration time / fidelity (GraVAC's throughput x gain,
inverted): the time an iteration costs per unit of gradient it delivers.
"""

from __future__ import annotations

from bytecomp.compress import canonical
from bytecomp.errors import BytecompError
from bytecomp.profile.store import Profile


class FidelityModel:
    """Gains and norm shares by tensor name and canonical spec."""

    def __init__(self, profile: Profile) -> None:
        if not profile.has_fidelity:
            raise BytecompError(f"{profile.label}: the profile has no fidelity table "
                                f"(fidelity.csv); re-run bytecomp profile, or plan with "
                                f"--objective time")
        self.label = profile.label
        table = profile.fidelity
        self.gains = {(row.tensor, canonical(row.spec)): float(row.gain)
                      for row in table.itertuples()}
        shares = {row.tensor: float(row.norm_share) for row in table.itertuples()}
        total = sum(shares.values())
        names = list(profile.tensors["name"])
        # Normalized over the tensors (medians over iterations need not sum to 1); a tensor
        # the table lacks has no measured share: it counts as none of the norm.
        self.shares = {name: (shares.get(name, 0.0) / total if total > 0 else 1.0 / len(names))
                       for name in names}
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
        return self.gains.get((tensor, spec), 1.0)  # absent: a tensor with no norm share


def compose(shares: list[float], gains: list[float]) -> float:
    """The whole gradient's gain from its tensors' norm shares and gains."""
    return sum(s * g * g for s, g in zip(shares, gains)) ** 0.5
