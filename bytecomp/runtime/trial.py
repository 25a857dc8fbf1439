"""The runtime trial: the finalists a plan's prediction cannot separate, timed in the
running job before one is kept.

A verified plan (``bytecomp plan``) keeps as levels the finalists whose predicted time x
measured steps factor is within the margin of the best
(:attr:`bytecomp.plan_types.Adaptive.trial`). After ``trial_warmup`` steps at the plan's
choice (DDP rebuilds its buckets, caches warm up), the next ``trial_steps`` steps take
the candidates in turn, one a step; every step's time is the one the ranks agreed on
(:mod:`bytecomp.runtime.adaptive`), so every rank keeps the same. Once the last trial
step's time is agreed, each candidate's score is its median step time x its plan's
steps factor, and the trial decides only outside its measured noise
(:meth:`Trial.decide`): the best is kept where every other candidate is behind it by
more than :func:`critical` standard errors (:data:`NOISE_Z`'s level, Student's t for
the turns measured), measured turn by turn on the trial's own
steps (:meth:`Trial.paired`); where some are not, the comparison is repeated once over another
``trial_steps`` steps (all samples pooled), and where they are still tied the safer
of the tied levels is kept (the lowest: a verified plan's levels go from fp32 DDP
through the mildest compression), so that identical levels keep the same one. What
decided is :attr:`Trial.verdict`, logged and checkpointed. The gain controller then
watches the kept level as it watches any level; until then the plan's choice runs.
Nothing here is random: the same measurements give the same decision, and a resumed
run continues the trial where it stopped.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from bytecomp.errors import BytecompError
from bytecomp.plan_types import MIN_TRIAL_PAIRS as MIN_PAIRS

# How many standard errors of the paired gap (Trial.paired) a candidate must be ahead
# by to be kept over another: about one wrong call in 700 between identical levels under
# normal noise (one-sided, per comparison), and the MAD is robust to the machine's stalls.
NOISE_Z = 3.0


def critical(pairs: int) -> float:
    """How many standard errors a gap measured over ``pairs`` turns must exceed: Student's
    t at :data:`NOISE_Z`'s one-sided level with ``pairs - 1`` degrees of freedom. The
    standard error is itself estimated from those few turns: with 6 of them, 3 of its
    errors let identical levels be told apart several times in a hundred trials (a
    twin was kept over the safer one on a quiet machine), t's 5.5 do not."""
    if pairs < 2:
        return math.inf
    from scipy.special import ndtr, stdtrit  # at a decision only: not on a step's path

    return max(NOISE_Z, float(stdtrit(pairs - 1, float(ndtr(NOISE_Z)))))
MAX_ROUNDS = 2  # the first comparison and one repeat, then the safer level on a tie
# a sample median's standard error over the samples' standard deviation x sqrt(n) (normal
# samples), and the standard deviation over the median absolute deviation
MEDIAN_SE = math.sqrt(math.pi / 2)
MAD_SIGMA = 1.4826


@dataclass
class Trial:
    """The trial's schedule and what it measured so far (plain numbers: checkpointed)."""

    candidates: list[int]  # levels, in the order they take turns
    warmup: int  # steps at the plan's choice first
    steps: int  # steps taking the candidates in turn, per round
    factors: list[float]  # per level: the plan's measured steps factor (1 where unknown)
    seen: int = 0  # agreed step measurements observed (step i is the i-th)
    samples: dict[int, list[float]] = field(default_factory=dict)  # level -> step ms
    chosen: int | None = None
    rounds: int = 1  # comparisons so far: a tie within the noise repeats it once
    verdict: str | None = None  # what decided, in words (once chosen)

    @property
    def decided(self) -> bool:
        return self.chosen is not None

    @property
    def end(self) -> int:
        """The step after the trial's window (as far as its rounds so far reach)."""
        return self.warmup + self.steps * self.rounds

    def level_for(self, step: int, fallback: int) -> int:
        """The level step ``step`` runs at: a candidate in its turn inside the trial's
        window, else ``fallback`` (the plan's choice, until the trial decides)."""
        if self.warmup <= step < self.end:
            return self.candidates[(step - self.warmup) % len(self.candidates)]
        return fallback

    def observe(self, level: int, time_ms: float | None) -> None:
        """The next step's agreed measurement: its level and its time (None: a rank did
        not time it)."""
        step = self.seen
        self.seen += 1
        if self.warmup <= step < self.end and time_ms is not None \
                and math.isfinite(time_ms) and time_ms > 0:
            self.samples.setdefault(level, []).append(time_ms)

    def paired(self, best: int, other: int) -> tuple[float, float]:
        """How far ``other`` is behind ``best`` and the noise of that: the median, over the
        turns both were timed in, of the log of ``other``'s step x steps factor over
        ``best``'s in the same turn, and that median's standard error (:data:`MEDIAN_SE`
        x :data:`MAD_SIGMA` x the differences' median absolute deviation / sqrt(turns);
        ``inf`` with fewer than :data:`MIN_PAIRS` turns). The candidates take adjacent
        steps, so a machine that slows down for a while slows both: the pairing removes
        that drift, which plain medians would count as a difference."""
        mine, theirs = self.samples.get(best, []), self.samples.get(other, [])
        scale = math.log(self.factors[other] / self.factors[best])
        differences = [math.log(b / a) + scale for a, b in zip(mine, theirs)]
        if len(differences) < MIN_PAIRS:
            return (statistics.median(differences) if differences else 0.0), math.inf
        gap = statistics.median(differences)
        spread = statistics.median(abs(d - gap) for d in differences)
        return gap, MEDIAN_SE * MAD_SIGMA * spread / math.sqrt(len(differences))

    def noise(self) -> float:
        """The comparison's noise, for the log: the largest standard error of the gap
        between the best-scored candidate and another (:meth:`paired`), relative."""
        scored = self.scores()
        if len(scored) < 2:
            return math.inf
        best = min(scored, key=lambda level: (scored[level], level))
        return max(self.paired(best, level)[1] for level in scored if level != best)

    def decide(self) -> int | None:
        """Once every trial step of this round is observed: the candidate kept (see the
        module docstring), with :attr:`verdict` saying why; None before, and when a tie
        starts the repeat (:attr:`rounds` grows and the turns go on)."""
        if self.chosen is not None or self.seen < self.end:
            return self.chosen
        scored = self.scores()
        if not scored:
            self.chosen = self.candidates[0]
            self.verdict = "no candidate was timed: the plan's choice is kept"
            return self.chosen
        best = min(scored, key=lambda level: (scored[level], level))
        gaps = {level: self.paired(best, level) for level in scored if level != best}
        needed = {level: critical(min(len(self.samples.get(best, [])),
                                      len(self.samples.get(level, []))))
                  for level in gaps}
        tied = sorted([best] + [level for level, (gap, error) in gaps.items()
                                if not gap > needed[level] * error])
        detail = self._detail(scored, best, gaps)
        if len(scored) == 1:
            self.chosen = best
            self.verdict = f"level {best} is the only candidate timed ({detail})"
        elif tied == [best]:
            self.chosen = best
            self.verdict = (f"level {best} is ahead of the others by more than "
                            f"{max(needed.values()):.1f} standard errors (Student's t over "
                            f"the turns; {detail})")
        elif self.rounds < MAX_ROUNDS:
            self.rounds += 1
            self.verdict = None
            return None
        else:
            self.chosen = tied[0]
            self.verdict = (f"levels {tied} are within {max(needed.values()):.1f} standard "
                            f"errors of each other after {self.rounds} rounds: the safer, "
                            f"level {tied[0]}, is kept ({detail})")
        return self.chosen

    @staticmethod
    def _detail(scored: dict[int, float], best: int,
                gaps: dict[int, tuple[float, float]]) -> str:
        """The scores and each gap to the best with its standard error, for the verdict."""
        scores = ", ".join(f"level {level} {score:.2f} ms" for level, score in
                           sorted(scored.items()))
        behind = "; ".join(
            f"level {level} behind level {best} by {100 * math.expm1(gap):+.1f}% "
            f"(standard error {'unmeasured' if math.isinf(error) else f'{100 * error:.1f}%'})"
            for level, (gap, error) in sorted(gaps.items()))
        return f"median ms x steps factor: {scores}" + (f"; {behind}" if behind else "")

    def scores(self) -> dict[int, float]:
        """Each timed candidate's median step ms x steps factor."""
        return {level: statistics.median(times) * self.factors[level]
                for level, times in self.samples.items() if times}

    def state_dict(self) -> dict:
        return {"seen": self.seen, "chosen": self.chosen, "rounds": self.rounds,
                "verdict": self.verdict,
                "samples": {str(level): list(times) for level, times in self.samples.items()}}

    def load_state_dict(self, saved) -> None:
        try:
            seen = int(saved["seen"])
            chosen = None if saved["chosen"] is None else int(saved["chosen"])
            samples = {int(level): [float(t) for t in times]
                       for level, times in saved["samples"].items()}
            rounds = int(saved.get("rounds", 1))  # saved before the repeat: one round
            verdict = saved.get("verdict")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BytecompError(f"the executor state's trial is damaged ({error})") from None
        if seen < 0 or (chosen is not None and chosen not in self.candidates) or \
                not set(samples) <= set(self.candidates) or \
                not 1 <= rounds <= MAX_ROUNDS or \
                not (verdict is None or isinstance(verdict, str)) or \
                not all(math.isfinite(t) and t > 0 for times in samples.values() for t in times):
            raise BytecompError("the executor state's trial does not fit this plan's trial")
        self.seen, self.chosen, self.samples = seen, chosen, samples
        self.rounds, self.verdict = rounds, verdict
