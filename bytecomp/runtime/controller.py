"""The adaptive controller: GraVAC's rule on an adaptive plan's planned levels.

Each step the executor measures the *gain* of what it compressed (per group,
``sqrt(1 - ||C(x) - x||^2 / ||x||^2)`` on the compensated gradient ``x``: two
norms, since with error feedback ``C(x) - x`` is minus the new residual),
composes the groups' gains weighted by their parameters (uncompressed and
16-bit groups count 1), averages the squared gain over the ranks together with
the step's duration (one tiny allreduce every ``agree_every`` steps, for all of
them), and hands both, step by step, to :meth:`Controller.observe`. Every rank therefore sees the same numbers and
takes the same decisions at the same step boundary.

The gain the controller keeps is the measured one *calibrated* as the planner
calibrated the level's fidelity: a level's measured gain ``g`` reads as
``g ** p``, with ``p = log(fidelity) / log(gain)`` from the level's planned
fidelity (the profile's gains calibrated by its convergence probe) and its
planned uncalibrated gain (:attr:`bytecomp.plan_types.Level.calibration`). The
threshold and the scores are on that scale: gain then stands for steps, as in
the static planner's effective time. A level without both numbers reads its
gain as measured (GraVAC's).

The rule, with the plan's ``threshold``, ``window``, ``tolerance``,
``explore_every`` and ``start`` (:class:`bytecomp.plan_types.Adaptive`):

* training starts at level ``start`` (the planner's best predicted effective
  time among the levels it expects to keep the threshold): measuring level 0
  first would cost a window of its slowest steps, and level 0 (uncompressed or
  16-bit) keeps the whole gradient, so its gain needs no measuring;
* the gain and the step time of the current level are smoothed (EWMA of span
  ``window``, restarted on each visit); a decision is taken every ``window``
  steps at a level;
* a level whose smoothed gain is below the threshold is left for the milder
  one below, where the controller settles (and keeps checking);
* climbing (from the start, and again every ``explore_every`` settled steps):
  after a level's window, compare its *score* (gain / step time: GraVAC's
  throughput x gain) with the best level below it (those measured, and level 0
  with gain 1): unless it is better by more than ``tolerance``, settle on the
  better of the two (level 0 not yet measured: go there and judge its window
  too); otherwise go back to a measured level above that scores better by more
  than ``tolerance``, or move up one level if that level may pay, else settle.
  At the top, settle;
* a level *may pay* when its projected score beats the current one by more than
  ``tolerance`` and its projected gain keeps the threshold: its planned
  fidelity ``f``, with what it loses (``1 - f^2``) scaled as the current level's
  measured loss is to its planned one (gains that rise as training goes raise
  every projection, the aggressive levels' most: GraVAC's reason to explore),
  over its step time. A level without a planned fidelity is projected to keep
  the whole gradient (an upper bound: one no faster than the current score is
  never tried). Exploring costs steps, so a level the plan does not expect to
  win is not tried unless the measurements say the plan underrated it.

Step times are the executor's own measurements; a level not yet measured is
scored with the plan's prediction for it, scaled as the current level's
measurement is to its prediction (level 0 only scaled down: a compressed level
slower than predicted says nothing of DDP's own exchange); with ``timing:
predicted`` every level is scored with the plan's predictions (decisions then
depend on the gains alone, the same on every run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bytecomp.errors import BytecompError
from bytecomp.plan_types import Adaptive

CLIMB, SETTLED = "climb", "settled"


@dataclass
class Switch:
    """One move between levels: at the start of ``step``, from ``source`` to ``target``,
    on the smoothed ``gain`` of the level left."""

    step: int
    source: int
    target: int
    gain: float
    reason: str

    def to_list(self) -> list:
        return [self.step, self.source, self.target, self.gain, self.reason]


@dataclass
class Controller:
    """Decides each step's level; its state is plain numbers (checkpointable)."""

    settings: Adaptive
    levels: int
    predicted_ms: list[float | None]
    calibration: list[float] = field(default_factory=list)  # per level; empty: none
    fidelity: list[float | None] = field(default_factory=list)  # planned; empty: unknown
    level: int = 0
    mode: str = CLIMB
    steps_here: int = 0
    settled_steps: int = 0
    gain: list[float | None] = field(default_factory=list)
    time_ms: list[float | None] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.predicted_ms) != self.levels:
            raise BytecompError("the controller needs one prediction per level")
        self.calibration = self.calibration or [1.0] * self.levels
        if len(self.calibration) != self.levels:
            raise BytecompError("the controller needs one calibration per level")
        self.fidelity = self.fidelity or [None] * self.levels
        if len(self.fidelity) != self.levels:
            raise BytecompError("the controller needs one planned fidelity per level")
        self.start = min(self.settings.start, self.levels - 1)
        self.level = self.start  # a resumed run then loads its own (load_state_dict)
        self.gain = self.gain or [None] * self.levels
        self.time_ms = self.time_ms or [None] * self.levels

    @property
    def alpha(self) -> float:
        return 2.0 / (self.settings.window + 1)

    def _smooth(self, values: list[float | None], value: float) -> None:
        old = values[self.level]
        values[self.level] = value if old is None else old + self.alpha * (value - old)

    def score(self, level: int) -> float:
        """Gain per millisecond of step: the smoothed gain measured (level 0 never
        measured: 1, it keeps the whole gradient) over the step time measured (with
        ``timing: predicted``, or before a measurement, the plan's prediction; gain
        alone if neither)."""
        gain = self.gain[level]
        if gain is None and level == 0:
            gain = 1.0
        time_ms = self._time_of(level)
        if gain is None:
            return 0.0
        return gain / time_ms if time_ms else gain

    def projected_gain(self, level: int) -> float | None:
        """What ``level`` is expected to keep now (level 0: 1; None where the plan gives
        it no fidelity): its planned fidelity ``f``, with the part it loses, ``1 - f^2``,
        scaled as the current level's loss measures against its planned one. Gradients
        that become more compressible as training goes shrink what every level loses
        (GraVAC's observation), so a current level keeping more than planned raises the
        projections above it, most for the levels that lose most."""
        if level == 0:
            return 1.0
        planned = self.fidelity[level]
        if planned is None:
            return None
        here, expected = self.gain[self.level], self.fidelity[self.level]
        ratio = 1.0
        if here is not None and expected is not None and expected < 1.0:
            ratio = (1.0 - min(1.0, here) ** 2) / (1.0 - expected ** 2)
        return math.sqrt(max(0.0, 1.0 - (1.0 - planned ** 2) * ratio))

    def observe(self, step: int, gain: float, time_ms: float | None) -> int:
        """The step just finished at the current level had ``gain`` (over all ranks) and
        took ``time_ms`` (None: not measured). Returns the level for step ``step``."""
        self._smooth(self.gain, max(0.0, gain) ** self.calibration[self.level])
        if time_ms is not None and time_ms > 0:
            self._smooth(self.time_ms, time_ms)
        self.steps_here += 1
        if self.mode == SETTLED:
            self.settled_steps += 1
        if self.steps_here < self.settings.window:
            return self.level
        self.steps_here = 0
        current = self.level
        smoothed = self.gain[current] or 0.0
        top = self.levels - 1
        if smoothed < self.settings.threshold and current > 0:
            self._move(step, current - 1, SETTLED, "gain below the threshold")
        elif self.mode == CLIMB:
            below = self._best_below(current)
            above = self._best_measured_above(current)
            if below is not None and self.score(current) <= \
                    self.score(below) * (1 + self.settings.tolerance):
                best = current if self.score(current) >= self.score(below) else below
                # level 0 not yet measured: its window is judged too (CLIMB)
                mode = CLIMB if self.gain[best] is None else SETTLED
                self._move(step, best, mode, "no better than the level below")
            elif above is not None and \
                    self.score(above) > self.score(current) * (1 + self.settings.tolerance):
                self._move(step, above, SETTLED, "a level above measured better")
            elif current < top and self._may_pay(current + 1):
                self._move(step, current + 1, CLIMB, "gain holds: climbing")
            else:
                self.mode, self.settled_steps = SETTLED, 0
        elif self.settled_steps >= self.settings.explore_every:
            if current < top and self._may_pay(current + 1):
                self._move(step, current + 1, CLIMB, "exploring the next level")
            else:
                self.settled_steps = 0
        return self.level

    def _best_below(self, level: int) -> int | None:
        """The best scored level below ``level`` among level 0 and those with a measured
        gain (None: ``level`` is 0)."""
        known = [b for b in range(level) if b == 0 or self.gain[b] is not None]
        return max(known, key=self.score) if known else None

    def _best_measured_above(self, level: int) -> int | None:
        """The best scored level above ``level`` with a measured gain (None: none)."""
        measured = [b for b in range(level + 1, self.levels) if self.gain[b] is not None]
        return max(measured, key=self.score) if measured else None

    def _time_of(self, level: int) -> float | None:
        """A level's step time: measured; not yet measured, the plan's prediction scaled as
        the current level's measurement is to its own prediction (predictions and this
        machine's clock may disagree by a constant factor); with ``timing: predicted``,
        the prediction."""
        predicted = self.predicted_ms[level]
        if self.settings.timing != "measured":
            return predicted
        if self.time_ms[level] is not None:
            return self.time_ms[level]
        here, expected = self.time_ms[self.level], self.predicted_ms[self.level]
        if predicted and here is not None and expected:
            ratio = here / expected
            # level 0 (DDP's own exchange or fp16) is the level predicted best: a
            # compressed level measured slower than predicted (its compression's cost
            # mispredicted) says nothing of level 0, a faster one (a faster machine) does
            return predicted * (min(1.0, ratio) if level == 0 else ratio)
        return predicted

    def _may_pay(self, level: int) -> bool:
        """Whether ``level``'s projected score beats the current level's by more than the
        tolerance, with a projected gain that keeps the threshold (no projection: the
        whole gradient, so that a level no faster is never tried)."""
        gain = self.projected_gain(level)
        if gain is not None and gain < self.settings.threshold:
            return False
        time_ms = self._time_of(level)
        if not time_ms:
            return True  # nothing known of its speed: try it
        bound = 1.0 if gain is None else gain
        return bound / time_ms > self.score(self.level) * (1 + self.settings.tolerance)

    def move_to(self, step: int, target: int, reason: str, settle: bool = True) -> None:
        """Go to ``target`` at ``step`` for a reason of the caller's (a runtime trial's
        turn or its decision), settled there unless ``settle`` is False."""
        self._move(step, target, SETTLED if settle else self.mode, reason)
        self.steps_here = 0

    def _move(self, step: int, target: int, mode: str, reason: str) -> None:
        """Go to ``target`` in ``mode``; settled steps count from here."""
        self.mode, self.settled_steps = mode, 0
        if target == self.level:
            return
        self.switches.append(Switch(step, self.level, target, self.gain[self.level] or 0.0,
                                    reason))
        self.level = target
        self.gain[target] = None  # a new visit: smoothing restarts (times are kept)

    def state_dict(self) -> dict:
        return {"level": self.level, "mode": self.mode, "steps_here": self.steps_here,
                "settled_steps": self.settled_steps, "gain": list(self.gain),
                "time_ms": list(self.time_ms),
                "switches": [s.to_list() for s in self.switches]}

    def load_state_dict(self, saved: dict) -> None:
        try:
            level, mode = int(saved["level"]), str(saved["mode"])
            gain = [None if g is None else float(g) for g in saved["gain"]]
            time_ms = [None if t is None else float(t) for t in saved["time_ms"]]
            switches = [Switch(int(s[0]), int(s[1]), int(s[2]), float(s[3]), str(s[4]))
                        for s in saved["switches"]]
            steps_here, settled_steps = int(saved["steps_here"]), int(saved["settled_steps"])
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise BytecompError(f"the executor state's controller is damaged ({error})") from None
        if not 0 <= level < self.levels or mode not in (CLIMB, SETTLED) or \
                len(gain) != self.levels or len(time_ms) != self.levels:
            raise BytecompError("the executor state's controller does not fit this plan's "
                                "levels")
        numbers = [v for v in gain + time_ms if v is not None] + [s.gain for s in switches]
        if steps_here < 0 or settled_steps < 0 or \
                not all(math.isfinite(v) and v >= 0 for v in numbers):  # NaN steers no level
            raise BytecompError("the executor state's controller is damaged (a negative or "
                                "non-finite number)")
        self.level, self.mode, self.gain, self.time_ms = level, mode, gain, time_ms
        self.steps_here, self.settled_steps, self.switches = steps_here, settled_steps, switches
