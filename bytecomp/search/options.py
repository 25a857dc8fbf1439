"""How a plan is searched, as one value, and the planning defaults.

:class:`SearchOptions` travels from the command line through
:meth:`bytecomp.search.Planner.search` and the adaptive planner
(:func:`bytecomp.search.ladder.plan_ladder`) unchanged; the baselines a plan is
compared with are named by :class:`BaselineKind`, not by their display names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from bytecomp.errors import BytecompError
from bytecomp.options import ALGORITHMS, MAX_EVALUATIONS  # noqa: E402  (declared with plan's)

# The default margin (a fraction) by objective: what ``bytecomp plan`` asks a searched plan
# to win by over fp32 DDP and the baselines (Planner.search's own default is 0: the
# searched plan as it is). Effective time carries two errors, the iteration's (mixed plans
# measured up to 21% slower than predicted on the emulated 100 Mbit/s link) and the steps
# factor's (the probe's factors were 6-11% above the steps measured). An adaptive plan's
# levels are searched by time.
MIN_GAIN = {"time": 0.05, "effective": 0.10}


def default_min_gain(objective: str) -> float:
    """``bytecomp plan``'s margin for an objective (``time`` or ``effective``)."""
    return MIN_GAIN[objective]


@dataclass(frozen=True)
class SearchOptions:
    """What :meth:`~bytecomp.search.Planner.search` does (see it for the steps).

    * ``caps``: candidate DDP bucket caps in MB (None: the profiled cap and
      :data:`~bytecomp.buckets.SEARCHED_CAPS_MB`; 0: one bucket per tensor);
    * ``algorithm``: ``auto``, ``greedy``, ``local`` (annealing over every option) or
      ``exact``;
    * ``budget_s``: a wall-clock cap on the annealing (None: none);
    * ``min_gain``: the margin (a fraction) a searched plan must win by over fp32 DDP,
      then over the best baseline, to be chosen over them;
    * ``evaluations``: the annealing's evaluations of the model (None: by the size);
    * ``seed``: of the annealing's random moves;
    * ``stop_gap``: stop once within this fraction of the lower bound (None: 1% unless
      ``evaluations`` or ``budget_s`` is given, else 0).
    """

    caps: tuple[float, ...] | None = None
    algorithm: str = "auto"
    budget_s: float | None = None
    min_gain: float = 0.0
    evaluations: int | None = None
    seed: int = 0
    stop_gap: float | None = None

    def __post_init__(self) -> None:
        if self.caps is not None:
            object.__setattr__(self, "caps", tuple(float(cap) for cap in self.caps))
        if self.algorithm not in ALGORITHMS:
            raise BytecompError(f"the search algorithm must be {', '.join(ALGORITHMS[:-1])} "
                                f"or {ALGORITHMS[-1]}, got {self.algorithm!r}")
        if self.budget_s is not None and not 0 <= self.budget_s < math.inf:
            raise BytecompError(f"the search budget must be a non-negative number of seconds, "
                                f"got {self.budget_s:g}")
        if not 0 <= self.min_gain < 1:
            raise BytecompError(f"the margin (min_gain) must be a fraction in [0, 1), got "
                                f"{self.min_gain:g}")
        if self.evaluations is not None and not 0 <= self.evaluations <= MAX_EVALUATIONS:
            raise BytecompError(f"the evaluations must be an integer from 0 to "
                                f"{MAX_EVALUATIONS:,}, got {self.evaluations}")
        if self.stop_gap is not None and not 0 <= self.stop_gap < 1:
            raise BytecompError(f"the stop gap must be a fraction in [0, 1), got "
                                f"{self.stop_gap:g}")


class BaselineKind(Enum):
    """The plans a user would pick by hand, which every searched plan is compared with."""

    FP32_DDP = "fp32 DDP"
    FP16_HOOK = "fp16 hook"
    POWERSGD_HOOK = "PowerSGD hook"
    EVERY_TENSOR = "on every tensor"  # one compressor on every tensor, its own scheme
