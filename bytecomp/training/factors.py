"""Steps factors read within fp32 DDP's loss noise floor.

A steps factor compares a strategy's validation curve with fp32 DDP's at the same
losses: for each loss fp32 DDP reached at an evaluation from ``from_step`` on, the
steps the strategy took to reach it over the steps fp32 DDP took (linear between
evaluations), and the median of those. Read at fp32's exact losses, a strategy that
learns as well but ends a hair above them (the fp16 hook, 0.14% above fp32's final
loss over 600 steps) "never" reaches its last levels and gets the cap, an artefact
of the noise, not a measurement. So each loss counts as reached *within the floor*:
at fp32's level plus :func:`loss_floor`, the way the convergence matrix judges
"reached" (``benchmarks/convergence_matrix.py``), for fp32 and the strategy alike
(fp32 against itself is 1 exactly).

The floor is fp32's own noise: the scatter of its validation losses around a smooth
fit over the part of the curve the factor is read on (:func:`curve_scatter`), as the
spread of the difference of two equally good readings (sqrt(2) x that scatter); where
fp32 also trained on a second data order, at least how far the two runs end apart.
A strategy inside the floor gets a finite factor with bounds (:class:`Factor`): the
steps it took to reach the level anywhere within the floor of it, over the steps fp32
took, at their extremes. One outside the floor is never within it, and gets the cap.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from bytecomp.training.convergence import loss_at, steps_to

MIN_SCATTER_POINTS = 3  # a line through three points leaves one degree of freedom


@dataclass(frozen=True)
class Factor:
    """A steps factor and its bounds within the loss's noise floor (``low`` <= ``value``
    <= ``high``; all equal where the floor is 0)."""

    value: float
    low: float
    high: float

    @property
    def uncertain(self) -> bool:
        """Whether the floor leaves the factor a range rather than a number."""
        return self.high > self.low


def curve_scatter(curve: list[tuple[int, float]], from_step: float) -> float:
    """The standard deviation of ``curve``'s finite losses at ``from_step`` and later
    (after step 0) around a smooth fit: a quadratic in the log of the step from four
    points, a line from three, 0 with fewer. How far one evaluation strays from the
    curve's own trend; a curve that still bends more than the fit can follow adds its
    misfit (about 0.1% of the loss on an exponential fall), which widens the floor."""
    points = [(s, loss) for s, loss in curve
              if s >= from_step and s > 0 and math.isfinite(loss)]
    if len(points) < MIN_SCATTER_POINTS:
        return 0.0
    x = np.log(np.array([s for s, _ in points], dtype=float))
    losses = np.array([loss for _, loss in points], dtype=float)
    degree = 2 if len(points) > 3 else 1
    x = x - x.mean()  # a well-conditioned fit
    residuals = losses - np.polyval(np.polyfit(x, losses, degree), x)
    return float(math.sqrt(float(np.sum(residuals ** 2)) / (len(points) - degree - 1)))


def loss_floor(reference: list[tuple[int, float]], from_step: float,
               second: list[tuple[int, float]] | None = None) -> float:
    """fp32 DDP's loss noise floor over the steps from ``from_step``: sqrt(2) x its
    :func:`curve_scatter` (the spread of the difference of two readings that scatter
    so), and, with ``second`` (fp32 on a second data order), at least how far the two
    runs are apart at ``reference``'s last step."""
    floor = math.sqrt(2.0) * curve_scatter(reference, from_step)
    if second:
        last = reference[-1][0]
        apart = abs(loss_at(second, last) - loss_at(reference, last))
        if math.isfinite(apart):
            floor = max(floor, apart)
    return floor


def floored_factor(curve: list[tuple[int, float]], reference: list[tuple[int, float]],
                   from_step: float, floor: float, cap: float) -> Factor:
    """``curve``'s steps factor against ``reference`` (see the module docstring), each
    of ``reference``'s losses from ``from_step`` on counted as reached within ``floor``
    of it. Per loss L: the factor is the steps to L + floor, the strategy's over fp32's;
    its low the strategy's steps to L + 2 floor over fp32's to L, its high the
    strategy's to L over fp32's to L + 2 floor (the extremes of reading both within
    the floor of L + floor); each at most ``cap`` (never reached: ``cap``). The medians
    over the losses; all ``cap`` where no loss counts (fp32 reached every one within
    the floor at step 0: nothing to read)."""
    values, lows, highs = [], [], []
    for step, level in reference:
        if step < from_step or not math.isfinite(level):
            continue
        theirs = steps_to(reference, level + floor)
        if theirs is None or theirs <= 0:
            continue
        soonest = steps_to(reference, level + 2 * floor) or 0.0
        latest = steps_to(reference, level) or theirs
        values.append(_ratio(steps_to(curve, level + floor), theirs, cap))
        lows.append(_ratio(steps_to(curve, level + 2 * floor), latest, cap))
        highs.append(_ratio(steps_to(curve, level), soonest, cap))
    if not values:
        return Factor(cap, cap, cap)
    return Factor(statistics.median(values), statistics.median(lows), statistics.median(highs))


def _ratio(mine: float | None, theirs: float, cap: float) -> float:
    if mine is None or theirs <= 0:
        return cap
    return min(cap, mine / theirs)


def reference_factor(curve: list[tuple[int, float]], reference: list[tuple[int, float]],
                     from_step: float, cap: float,
                     second: list[tuple[int, float]] | None = None) -> Factor:
    """:func:`floored_factor` within fp32's own :func:`loss_floor` over the same steps."""
    return floored_factor(curve, reference, from_step,
                          loss_floor(reference, from_step, second), cap)
