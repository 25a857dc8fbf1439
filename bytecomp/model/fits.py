"""Linear models ``time = a + b * size`` fitted to sweeps with scipy.

A sweep has two regimes: small sizes measure the fixed cost (latency, launch
overhead), large ones the cost per byte or element (bandwidth). A single
least-squares line is pulled by whichever regime has more points; worse, on a
shaped link the small sizes ride the token bucket's burst and look faster than
the link, which no straight line reconciles. So the two are fitted apart, as
an alpha-beta model is meant: ``a`` is the intercept of the line through the
three smallest sizes, ``b`` the least-squares slope of the sizes within 16x of
the largest, through ``a`` (scipy's bounded least squares, both non-negative,
so extrapolation never predicts negative times). Exact linear data gives its
exact coefficients back.

Compression is different (:func:`fit_compute`): its time per element has no
bandwidth regime to find at the largest sizes, where it runs out of cache and
competes for memory with the other ranks instead (on the emulated 2 x 2
profiles, 16M elements cost 2.4x per element what 1M did, while a plan's
groups are at most a bucket). Its slope is therefore the relative least-squares
slope over every size, each point's relative error weighing the same, so that
one outlying size cannot set the cost of all the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear


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


SMALLEST = 3
LARGE_RANGE = 16.0


def _intercept(x: np.ndarray, y: np.ndarray) -> float:
    """Non-negative intercept of the least-squares line through the smallest sizes."""
    order = np.argsort(x)[:SMALLEST]
    xs, ys = x[order], y[order]
    if np.ptp(xs) == 0:
        return float(max(0.0, ys.min()))
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(np.clip(intercept, 0.0, ys.min()))


def fit_linear(x, y) -> LinearFit:
    """Fit non-negative ``a + b x`` to a sweep ``(x, y)`` (see the module docstring)."""
    return _fit(x, y, relative_slope=False)


def fit_compute(x, y) -> LinearFit:
    """Like :func:`fit_linear`, with the slope fitted to every size by relative error
    (for compression times; see the module docstring)."""
    return _fit(x, y, relative_slope=True)


def _fit(x, y, relative_slope: bool) -> LinearFit:
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size == 0:
        raise ValueError("no points to fit")
    weights = 1.0 / np.maximum(y, 1e-9)
    if x.size == 1 or np.ptp(x) == 0:
        a, b = 0.0, float(np.mean(y / np.maximum(x, 1e-12)))
    else:
        a = _intercept(x, y) if x.size > SMALLEST else 0.0
        scale = weights if relative_slope else np.ones_like(x)
        every_size = relative_slope or x.size <= SMALLEST
        used = np.ones_like(x, dtype=bool) if every_size else x >= x.max() / LARGE_RANGE
        system = (x * scale)[used].reshape(-1, 1)
        b = float(lsq_linear(system, ((y - a) * scale)[used], bounds=(0, np.inf)).x[0])
    predicted = a + b * x
    residual = float(np.sum((y - predicted) ** 2))
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - residual / spread if spread > 0 else 1.0
    worst = float(np.max(np.abs(predicted - y) * weights))
    return LinearFit(float(a), float(b), r2, worst, int(x.size), float(x.min()), float(x.max()))
