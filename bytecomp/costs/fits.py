"""Cost curves fitted to the profile's sweeps.

Collectives and copies get a line ``time = a + b * size`` (:func:`fit_linear`,
scipy). A sweep has two regimes: small sizes measure the fixed cost (latency, launch
overhead), large ones the cost per byte or element (bandwidth). A single
least-squares line is pulled by whichever regime has more points; worse, on a
shaped link the small sizes ride the token bucket's burst and look faster than
the link, which no straight line reconciles. So the two are fitted apart, as
an alpha-beta model is meant: ``a`` is the median, over the five smallest
sizes, of each one's time less its bandwidth cost, ``b`` the least-squares
slope of the sizes within 16x of the largest, through ``a`` (scipy's bounded
least squares, both non-negative, so extrapolation never predicts negative
times). A median, because small collectives on a busy CPU are noisy: the line
through the three smallest sizes it replaces read 0.50, 0.40 and 1.55 ms as a
latency of 0 (its intercept clipped at zero), which priced a plan of eight tiny
allreduces, one per tensor, at a quarter of what it took. Exact linear data
gives its exact coefficients back.

Compression is different (:func:`fit_piecewise`): its time per element has no
bandwidth regime to find at the largest sizes and is not constant either: top-k
costs 15 ns per element at 64K elements, 46 at 1M and 72 at 16M on the CI
machine (selection grows faster than linearly, and large arrays leave the
cache), which no ``a + b * numel`` line follows. Its fit is monotone and
piecewise: the sweep's times made non-decreasing in size (pool adjacent
violators), then interpolated between neighbouring sizes as a power law (a
straight line in log size and log time, exact for ``c * numel**k`` between two
points), flat below the smallest size (its fixed cost) and extrapolated beyond
the largest with the last segment's slope in milliseconds per element. Each
segment is set by its own two sizes, so one outlying size (16M elements, larger
than any bucket) cannot set the cost of all the others.

Collectives keep the alpha-beta line: on a shaped link the sweep's small sizes
ride the token bucket's burst, which a fit through the points would learn and
an iteration, whose traffic keeps the bucket empty, never sees.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """``intercept + slope * x`` with the quality of the fit on its points."""

    intercept: float
    slope: float
    r2: float
    worst_relative_error: float
    points: int
    x_min: float
    x_max: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


SMALLEST = 3  # a sweep of at most this many sizes is fitted through the origin
SMALL_SIZES = 5  # the fixed cost is read off at most this many of the smallest sizes
LARGE_RANGE = 16.0


def _slope(x: np.ndarray, y: np.ndarray, a: float, used: np.ndarray) -> float:
    """Non-negative least-squares slope of ``y - a`` over the ``used`` sizes."""
    design, target = x[used].reshape(-1, 1), (y - a)[used]
    # lsq_linear's own first step: the unbounded solution, which it returns as is when it
    # is within the bounds (almost always, here); scipy.optimize (a quarter of a second
    # to import) only for the rest
    unbounded = np.linalg.lstsq(design, target, rcond=-1)[0]
    if np.all(unbounded >= 0):
        return float(unbounded[0])
    from scipy.optimize import lsq_linear

    return float(lsq_linear(design, target, bounds=(0, np.inf)).x[0])


def _intercept_and_slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``a``: the median of ``y - b x`` over the smallest sizes (up to ``SMALL_SIZES``,
    never the largest), non-negative; ``b``: the slope of the sizes within
    ``LARGE_RANGE`` of the largest through ``a``. Each sets the other a little (the
    smallest sizes carry a little bandwidth cost, the largest a little latency), so
    the two are alternated to their fixed point, which exact linear data reaches."""
    order = np.argsort(x, kind="stable")[:min(SMALL_SIZES, x.size - 1)]
    large = x >= x.max() / LARGE_RANGE
    a, b = 0.0, _slope(x, y, 0.0, large)
    for _ in range(50):
        a_next = max(0.0, float(np.median(y[order] - b * x[order])))
        b = _slope(x, y, a_next, large)
        if abs(a_next - a) <= 1e-12 * max(1.0, a):
            break
        a = a_next
    return a_next, b


def fit_linear(x, y) -> LinearFit:
    """Fit non-negative ``a + b x`` to a sweep ``(x, y)`` (see the module docstring)."""
    return _fit(x, y)


def _fit(x, y) -> LinearFit:
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size == 0:
        raise ValueError("no points to fit")
    weights = 1.0 / np.maximum(y, 1e-9)
    if x.size == 1 or np.ptp(x) == 0:
        a, b = 0.0, float(np.mean(y / np.maximum(x, 1e-12)))
    elif x.size <= SMALLEST:
        a, b = 0.0, _slope(x, y, 0.0, np.ones_like(x, dtype=bool))
    else:
        a, b = _intercept_and_slope(x, y)
    predicted = a + b * x
    residual = float(np.sum((y - predicted) ** 2))
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - residual / spread if spread > 0 else 1.0
    worst = float(np.max(np.abs(predicted - y) * weights))
    return LinearFit(float(a), float(b), r2, worst, int(x.size), float(x.min()), float(x.max()))


@dataclass(frozen=True)
class PiecewiseFit:
    """A monotone piecewise curve through a sweep (see the module docstring), with the
    quality of the fit on the sweep's points."""

    sizes: tuple[float, ...]
    times: tuple[float, ...]  # non-decreasing
    r2: float
    worst_relative_error: float
    points: int

    @property
    def intercept(self) -> float:
        """The time at (and below) the smallest size: the fixed cost."""
        return self.times[0]

    @property
    def slope(self) -> float:
        """Milliseconds per unit of the last segment (the extrapolation beyond the sweep)."""
        if len(self.sizes) == 1:
            return self.times[0] / max(self.sizes[0], 1e-12)
        return (self.times[-1] - self.times[-2]) / (self.sizes[-1] - self.sizes[-2])

    def __call__(self, x: float) -> float:
        sizes, times = self.sizes, self.times
        if x <= sizes[0]:
            return times[0]
        if x >= sizes[-1]:
            return times[-1] + self.slope * (x - sizes[-1])
        right = bisect_right(sizes, x)
        x0, x1, y0, y1 = sizes[right - 1], sizes[right], times[right - 1], times[right]
        if y0 <= 0.0:  # no power law through zero: a straight line
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return y0 * (y1 / y0) ** (math.log(x / x0) / math.log(x1 / x0))


def _non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing sequence closest to ``values`` (pool adjacent
    violators, equal weights)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            previous = blocks[-1]
            previous[0] = (previous[0] * previous[1] + mean * count) / (previous[1] + count)
            previous[1] += count
    return [mean for mean, count in blocks for _ in range(int(count))]


def fit_piecewise(x, y) -> PiecewiseFit:
    """Fit a monotone piecewise curve to a sweep ``(x, y)`` (see the module docstring);
    repeated sizes count by their median. It passes through every point of a sweep
    that is already non-decreasing."""
    x = np.asarray(x, dtype=float)
    y = np.maximum(np.asarray(y, dtype=float), 0.0)
    if x.size == 0:
        raise ValueError("no points to fit")
    sizes = sorted(set(x.tolist()))
    medians = [float(np.median(y[x == size])) for size in sizes]
    fit = PiecewiseFit(tuple(sizes), tuple(_non_decreasing(medians)), 1.0, 0.0, int(x.size))
    predicted = np.array([fit(value) for value in x])
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - predicted) ** 2)) / spread if spread > 0 else 1.0
    worst = float(np.max(np.abs(predicted - y) / np.maximum(y, 1e-9)))
    return PiecewiseFit(fit.sizes, fit.times, r2, worst, int(x.size))
