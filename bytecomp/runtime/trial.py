"""The runtime trial: the finalists a plan's prediction cannot separate, timed in the
running job before one is kept.

A verified plan (``bytecomp plan``) keeps as levels the finalists whose predicted time x
measured steps factor is within the prediction's error of the best
(:attr:`bytecomp.plan_file.Adaptive.trial`). After ``trial_warmup`` steps at the plan's
choice (DDP rebuilds its buckets, caches warm up), the next ``trial_steps`` steps take
the candidates in turn, one a step; every step's time is the one the ranks agreed on
(:mod:`bytecomp.runtime.adaptive`), so every rank keeps the same. Once the last trial
step's time is agreed, the candidate with the least median step time x its plan's
steps factor is kept, and the gain controller watches it as it watches any level.
Until then the plan's choice runs. Nothing here is random: the same measurements give
the same decision, and a resumed run continues the trial where it stopped.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from bytecomp.errors import BytecompError


@dataclass
class Trial:
    """The trial's schedule and what it measured so far (plain numbers: checkpointed)."""

    candidates: list[int]  # levels, in the order they take turns
    warmup: int  # steps at the plan's choice first
    steps: int  # steps taking the candidates in turn
    factors: list[float]  # per level: the plan's measured steps factor (1 where unknown)
    seen: int = 0  # agreed step measurements observed (step i is the i-th)
    samples: dict[int, list[float]] = field(default_factory=dict)  # level -> step ms
    chosen: int | None = None

    @property
    def decided(self) -> bool:
        return self.chosen is not None

    def level_for(self, step: int, fallback: int) -> int:
        """The level step ``step`` runs at: a candidate in its turn inside the trial's
        window, else ``fallback`` (the plan's choice, until the trial decides)."""
        if self.warmup <= step < self.warmup + self.steps:
            return self.candidates[(step - self.warmup) % len(self.candidates)]
        return fallback

    def observe(self, level: int, time_ms: float | None) -> None:
        """The next step's agreed measurement: its level and its time (None: a rank did
        not time it)."""
        step = self.seen
        self.seen += 1
        if self.warmup <= step < self.warmup + self.steps and time_ms is not None \
                and math.isfinite(time_ms) and time_ms > 0:
            self.samples.setdefault(level, []).append(time_ms)

    def decide(self) -> int | None:
        """Once every trial step is observed: the candidate with the least median step x
        steps factor (a candidate never timed is not kept); None before."""
        if self.chosen is not None or self.seen < self.warmup + self.steps:
            return self.chosen
        scored = {level: statistics.median(times) * self.factors[level]
                  for level, times in self.samples.items() if times}
        if scored:
            self.chosen = min(scored, key=lambda level: (scored[level], level))
        else:
            self.chosen = self.candidates[0]
        return self.chosen

    def scores(self) -> dict[int, float]:
        """Each timed candidate's median step ms x steps factor."""
        return {level: statistics.median(times) * self.factors[level]
                for level, times in self.samples.items() if times}

    def state_dict(self) -> dict:
        return {"seen": self.seen, "chosen": self.chosen,
                "samples": {str(level): list(times) for level, times in self.samples.items()}}

    def load_state_dict(self, saved) -> None:
        try:
            seen = int(saved["seen"])
            chosen = None if saved["chosen"] is None else int(saved["chosen"])
            samples = {int(level): [float(t) for t in times]
                       for level, times in saved["samples"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BytecompError(f"the executor state's trial is damaged ({error})") from None
        if seen < 0 or (chosen is not None and chosen not in self.candidates) or \
                not set(samples) <= set(self.candidates) or \
                not all(math.isfinite(t) and t > 0 for times in samples.values() for t in times):
            raise BytecompError("the executor state's trial does not fit this plan's trial")
        self.seen, self.chosen, self.samples = seen, chosen, samples
