"""Whether the profile's sweeps fit their models, and measuring again where they do not.

The planner prices collectives with a line fitted to each (collective, group,
dtype) sweep and compression with a monotone curve fitted to each (spec, device)
sweep (:mod:`bytecomp.costs.fits`). A burst of noise on a shared machine can leave a
sweep that no such model fits (seen: an fp32 allreduce fit of R^2 0.355, worst
relative error 618%, and a plan that changed with it). After the sweeps, a fit
whose R^2 is below :data:`MIN_R2` or whose worst relative error is above
:data:`MAX_WORST_ERROR` is measured again, up to :data:`RETRIES` more times, and each
size takes the least of its attempts' times (a burst of noise only ever adds time;
their ``p90_ms`` the most); what stays poor is kept in profile.yaml's
``quality`` section and warned about by ``profile`` and ``plan``. Every rank sees
the same (reduced) sweep rows, so every rank decides the same retries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bytecomp.costs.fit_quality import (
    COLLECTIVE_KEY,
    COMPRESSOR_KEY,
    MAX_WORST_ERROR,
    MIN_R2,
    FitQuality,
    collective_quality,
    compressor_quality,
    groups_of,
)
from bytecomp.profiler.budget import Allowance, agreed

__all__ = ["COLLECTIVE_KEY", "COMPRESSOR_KEY", "RETRIES", "Checked", "collective_quality",
           "compressor_quality", "merged", "poor_summary", "quality_meta", "remeasure"]

RETRIES = 2

def merged(attempts: list[list[dict]], key: tuple[str, ...], size: str,
           times: tuple[str, ...]) -> list[dict]:
    """One row per (series, size) over several attempts: each time column the least of
    the attempts' (noise only adds time; ``p10_ms`` the least, ``p90_ms`` the most, where
    present)."""
    by_point: dict[tuple, list[dict]] = {}
    for rows in attempts:
        for row in rows:
            by_point.setdefault((*(row[k] for k in key), row[size]), []).append(row)
    out = []
    for points in by_point.values():
        row = dict(points[0])
        for column in times:
            row[column] = min(p[column] for p in points)
        if "p10_ms" in row:
            row["p10_ms"] = min(p["p10_ms"] for p in points)
            row["p90_ms"] = max(p["p90_ms"] for p in points)
        out.append(row)
    return out


@dataclass
class Checked:
    """Sweep rows after the retries, and what the quality section records of them."""

    rows: list[dict]
    remeasured: list[str] = field(default_factory=list)
    poor: list[FitQuality] = field(default_factory=list)


def remeasure(rows: list[dict], quality: Callable[[list[dict]], dict[tuple, FitQuality]],
              measure: Callable[[set[tuple]], list[dict]], key: tuple[str, ...], size: str,
              times: tuple[str, ...], retries: int = RETRIES,
              allowance: Allowance | None = None) -> Checked:
    """Measure the series of ``rows`` whose fit is poor again with ``measure(keys)``, up
    to ``retries`` times while any stays poor and, with ``allowance`` (the stage's time),
    while it has time left (agreed by every rank): a fit that stays poor buys no sweep
    past the stage's share of the budget. Each size of a remeasured series takes the
    least of its attempts."""
    attempts: dict[tuple, list[list[dict]]] = {}
    current = {k: list(series) for k, series in groups_of(rows, key).items()}
    remeasured: list[str] = []
    fits = quality(rows)
    for _ in range(retries):
        bad = {k for k, fit in fits.items() if fit.poor}
        if not bad or (allowance is not None and agreed(allowance.left() <= 0)):
            break
        remeasured += [fits[k].name for k in sorted(bad, key=str) if fits[k].name not in
                       remeasured]
        again = groups_of(measure(bad), key)
        for k in bad:
            attempts.setdefault(k, [current[k]]).append(again.get(k, []))
            current[k] = merged(attempts[k], key, size, times)
        fits = quality([row for series in current.values() for row in series])
    flat = [row for series in current.values() for row in series]
    return Checked(flat, remeasured, [fit for fit in fits.values() if fit.poor])


def poor_summary(poor: list[FitQuality]) -> str | None:
    """One line for every fit that stayed poor: how many, the worst, what it affects
    and what to do (profile.yaml's ``quality.poor`` lists each)."""
    if not poor:
        return None
    worst = min(poor, key=lambda fit: fit.r2)
    return (f"{len(poor)} sweep {'fit stays' if len(poor) == 1 else 'fits stay'} poor (the "
            f"worst: {worst.describe()}): plans using those series are priced less surely "
            f"and plan warns where its plan does; profile.yaml's quality.poor lists them. "
            f"A quieter machine, or a larger --budget (more time to measure again), "
            f"measures them better")


def quality_meta(collectives: Checked, compressors: Checked) -> dict:
    """profile.yaml's ``quality`` section."""
    return {"min_r2": MIN_R2, "max_worst_relative_error": MAX_WORST_ERROR,
            "retries": RETRIES,
            "remeasured": collectives.remeasured + compressors.remeasured,
            "poor": [fit.to_meta() for fit in collectives.poor + compressors.poor]}
