"""How well a profile's sweeps fit the models the planner prices with.

The planner prices collectives with a line fitted to each (collective, group, dtype)
sweep and compression with a monotone curve fitted to each (spec, device) sweep
(:mod:`bytecomp.costs.fits`). A fit whose R^2 is below :data:`MIN_R2` or whose worst
relative error is above :data:`MAX_WORST_ERROR` is *poor*: predictions that use it
may be off by more than the margins the planner decides by. The relative error is
taken at the sizes whose time is at least :data:`FLOOR_SHARE` of the sweep's largest:
below, a fixed cost dominates that neither a line nor the curve follows to 25% (a
1 KiB gloo allgather at 0.1 ms against an intercept of 0.3), and the absolute errors
are a fraction of a millisecond. Broadcast, which no scheme uses, and the identity
compressor, which does no work, are not judged. The profiler measures a poor sweep
again (:mod:`bytecomp.profiler.quality`); ``plan`` warns about what stayed poor among
the fits its plan uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from bytecomp.compress import from_spec
from bytecomp.costs.fits import fit_linear, fit_piecewise

MIN_R2 = 0.9
MAX_WORST_ERROR = 0.25
FLOOR_SHARE = 0.1
UNJUDGED_COLLECTIVES = ("broadcast",)
COLLECTIVE_KEY = ("collective", "group", "dtype")
COMPRESSOR_KEY = ("spec", "device")


@dataclass(frozen=True)
class FitQuality:
    """One fitted series: its name (``collective allreduce/world/float32``), R^2 and worst
    relative error."""

    name: str
    r2: float
    worst_relative_error: float

    @property
    def poor(self) -> bool:
        return self.r2 < MIN_R2 or self.worst_relative_error > MAX_WORST_ERROR

    def describe(self) -> str:
        return f"{self.name} (R^2 {self.r2:.3f}, worst relative error " \
               f"{100 * self.worst_relative_error:.0f}%)"

    def to_meta(self) -> dict:
        return {"fit": self.name, "r2": round(self.r2, 4),
                "worst_relative_error": round(self.worst_relative_error, 4)}


def groups_of(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in key), []).append(row)
    return groups


def worst_error_above_floor(fit, sizes, times) -> float:
    """The fit's worst relative error at the sizes whose time is at least FLOOR_SHARE of
    the sweep's largest (see the module docstring)."""
    largest = max(times, default=0.0)
    errors = [abs(fit(size) - time) / time for size, time in zip(sizes, times)
              if time > 0 and time >= FLOOR_SHARE * largest]
    return max(errors, default=0.0)


def collective_quality(rows: list[dict]) -> dict[tuple, FitQuality]:
    """Each collective sweep's line fit (bytes -> time_ms), broadcast left out."""
    out = {}
    for key, series in groups_of(rows, COLLECTIVE_KEY).items():
        if key[0] in UNJUDGED_COLLECTIVES:
            continue
        sizes, times = [r["bytes"] for r in series], [r["time_ms"] for r in series]
        fit = fit_linear(sizes, times)
        out[key] = FitQuality("collective " + "/".join(map(str, key)), fit.r2,
                              worst_error_above_floor(fit, sizes, times))
    return out


def compressor_quality(rows: list[dict]) -> dict[tuple, FitQuality]:
    """Each compressor sweep's curves (numel -> encode_ms and decode_ms), the worse of
    the two; the identity compressor left out."""
    out = {}
    for key, series in groups_of(rows, COMPRESSOR_KEY).items():
        if not from_spec(key[0]).compresses:
            continue
        numels = [r["numel"] for r in series]
        r2, worst = 1.0, 0.0
        for column in ("encode_ms", "decode_ms"):
            times = [r[column] for r in series]
            fit = fit_piecewise(numels, times)
            r2, worst = min(r2, fit.r2), max(worst, worst_error_above_floor(fit, numels, times))
        out[key] = FitQuality("compressor " + "/".join(map(str, key)), r2, worst)
    return out
