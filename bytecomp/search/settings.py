"""How a plan is searched, as one value, and the planning defaults.

:class:`SearchOptions` travels from the command line through
:meth:`bytecomp.search.Planner.search` and the adaptive planner
(:func:`bytecomp.search.ladder.plan_ladder`) unchanged; the baselines a plan is
compared with are named by :class:`BaselineKind`, not by their display names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from bytecomp.buckets import SEARCHED_CAPS_MB
from bytecomp.options import check_search

# The default margin (a percentage) by objective: what ``bytecomp plan`` asks a searched
# plan to win by over fp32 DDP and the baselines (Planner.search's own default is 0: the
# searched plan as it is). Effective time carries two errors, the iteration's (mixed plans
# measured up to 21% slower than predicted on the emulated 100 Mbit/s link) and the steps
# factor's (the probe's factors were 6-11% above the steps measured). An adaptive plan's
# levels are searched by time.
MIN_GAIN = {"time": 5.0, "effective": 10.0}
# How SearchOptions' range checks name its fields (by the names they have in PlanOptions).
LABELS = {"algorithm": "the search algorithm", "budget": "the search budget",
          "evaluations": "the evaluations", "min_gain": "the margin (min_gain)",
          "stop_gap": "the stop gap"}


def default_min_gain(objective: str) -> float:
    """``bytecomp plan``'s margin for an objective (``time`` or ``effective``), in percent."""
    return MIN_GAIN[objective]


@dataclass(frozen=True)
class SearchOptions:
    """What :meth:`~bytecomp.search.Planner.search` does (see it for the steps), in the
    units of ``bytecomp plan``'s options of the same names.

    * ``caps``: candidate DDP bucket caps in MB (None: the profiled cap and
      :data:`~bytecomp.buckets.SEARCHED_CAPS_MB`; 0: one bucket per tensor);
    * ``algorithm``: ``auto``, ``greedy``, ``local`` (annealing over every option) or
      ``exact``;
    * ``budget_s``: a wall-clock cap on the annealing (None: none);
    * ``min_gain``: the margin (percent) a searched plan must win by over fp32 DDP,
      then over the best baseline, to be chosen over them;
    * ``evaluations``: the annealing's evaluations of the model (None: by the size);
    * ``seed``: of the annealing's random moves;
    * ``stop_gap``: stop once within this many percent of the lower bound (None: 1%
      unless ``evaluations`` or ``budget_s`` is given, else 0).
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
        check_search(LABELS.__getitem__, self.algorithm, self.budget_s, self.evaluations,
                     self.min_gain, self.stop_gap)

    @property
    def margin(self) -> float:
        """``min_gain`` as a fraction."""
        return self.min_gain / 100

    @property
    def gap(self) -> float | None:
        """``stop_gap`` as a fraction (None: the search's default)."""
        return None if self.stop_gap is None else self.stop_gap / 100


class BaselineKind(Enum):
    """The plans a user would pick by hand, which every searched plan is compared with."""

    FP32_DDP = "fp32 DDP"
    FP16_HOOK = "fp16 hook"
    POWERSGD_HOOK = "PowerSGD hook"
    EVERY_TENSOR = "on every tensor"  # one compressor on every tensor, its own scheme


DEFAULT_CAPS = SEARCHED_CAPS_MB  # and the profiled cap; 0: one bucket per tensor
# Above this many tensors the default caps leave out 0 (one bucket per tensor) and the
# lower bound is the channel bound alone (the relaxed one took seconds at 50,000)
LARGE_TENSORS = 5_000


def default_evaluations(tensors: int) -> int:
    """Evaluations of the annealing when none are asked: 100,000 / tensors, from 600 to
    4,000 (an evaluation's cost grows with the tensors, so this keeps the default
    search's time roughly flat; the scale and classic sets of ``benchmarks/search.py``
    measure it). Half what it was before the annealing began with a descent: since
    then the same plans or better come from half the walk (docs/search.md)."""
    return min(4000, max(600, 100_000 // max(1, tensors)))


def default_caps(profiled_mb: float, tensors: int) -> list[float]:
    """The bucket caps searched unless some are asked: the profiled cap and
    :data:`DEFAULT_CAPS`, less 0 (one bucket per tensor) above
    :data:`LARGE_TENSORS` tensors: a collective per tensor does not pay there, and
    pricing each of that many buckets was most of the search's time."""
    caps = [profiled_mb, *DEFAULT_CAPS]
    return caps if tensors <= LARGE_TENSORS else [cap for cap in caps if cap > 0]
