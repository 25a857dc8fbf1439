"""Linear models ``time = a + b * size`` fitted to sweeps with scipy.

The fit minimizes *relative* error (small sizes matter as much as large ones:
a 1 KiB allreduce is latency, a 64 MiB one bandwidth) with both coefficients
kept non-negative, so that extrapolation never predicts negative times.
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


def fit_linear(x, y) -> LinearFit:
    """Fit non-negative ``a + b x`` to points ``(x, y)`` by relative least squares."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size == 0:
        raise ValueError("no points to fit")
    weights = 1.0 / np.maximum(y, 1e-9)
    if x.size == 1 or np.ptp(x) == 0:
        a, b = 0.0, float(np.mean(y / np.maximum(x, 1e-12)))
    else:
        system = np.column_stack([weights, x * weights])
        a, b = lsq_linear(system, np.ones_like(y), bounds=(0, np.inf)).x
    predicted = a + b * x
    residual = float(np.sum((y - predicted) ** 2))
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - residual / spread if spread > 0 else 1.0
    worst = float(np.max(np.abs(predicted - y) * weights))
    return LinearFit(float(a), float(b), r2, worst, int(x.size), float(x.min()), float(x.max()))
