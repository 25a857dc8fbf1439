"""An adaptive plan at run time: the ranks agree on what each step measured, the
controller picks the level, and a move hands the residuals of the level left to the
next gradients.

At the first bucket of every step the executor calls :meth:`Adaptation.boundary`:
it composes the gain that the last step's compression kept
(:meth:`Adaptation.squared_gain`); every ``agree_every`` steps the ranks agree on
those steps' gains and durations (one small allreduce on a group of their own,
issued now and completed by the next agreement), and the controller
(:mod:`bytecomp.runtime.controller`) observes the agreed measurements in order and
picks this step's level. Every rank therefore takes the same decisions at the same
step. On a move, each tensor's error-feedback residuals of the level it leaves are
folded into its next gradient (never dropped): for a compressor of the same family
that is what its own residual would have done.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from bytecomp.comm.schemes import take_residuals
from bytecomp.comm.topology import Topology, new_group, release_groups
from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan
from bytecomp.runtime.controller import Controller, Switch
from bytecomp.runtime.groups import GroupSpec
from bytecomp.runtime.state import GroupStates, Stats
from bytecomp.runtime.trial import Trial

log = logging.getLogger("bytecomp.runtime")

Entry = list  # an agreed measurement: [level, gain, step ms or None]


class Adaptation:
    """The controller of an adaptive plan, its agreement between the ranks and its moves
    between the ``ladder``'s levels (each a list of groups). ``use_level(level)`` makes
    the executor run a level."""

    def __init__(self, plan: Plan, ladder: list[list[GroupSpec]], states: GroupStates,
                 stats: Stats, use_level: Callable[[int], None]) -> None:
        assert plan.adaptive is not None and plan.levels
        self.plan = plan
        self.agree_every = plan.adaptive.agree_every
        self.ladder, self.states, self.stats, self.use_level = ladder, states, stats, use_level
        self.controller = Controller(
            plan.adaptive, len(plan.levels), [level.predicted_ms for level in plan.levels],
            [level.calibration for level in plan.levels],
            [level.fidelity for level in plan.levels])
        self.topology: Topology | None = None  # where residuals are laid out (set_topology)
        self.pending: dict[str, torch.Tensor] = {}  # residuals to fold into the next gradients
        self._last_boundary: float | None = None
        self._reported_ms: float | None = None  # report_step_ms: the last step's duration
        # steps measured here and not yet shared: (level, squared gain, ms)
        self._batch: list[tuple[int, float, float]] = []
        self._early: list[Entry] = []  # of the batch, agreed early (state_dict): not yet due
        self._inflight: tuple | None = None  # (levels, early, measurements, allreduce)
        self.controller_pending: list[Entry] = []  # agreed [level, gain, ms or None], due
        settings = plan.adaptive
        self.trial = Trial(list(settings.trial), settings.trial_warmup, settings.trial_steps,
                           [level.steps_factor or 1.0 for level in plan.levels]) \
            if settings.trial else None
        # the agreement travels on a group of its own, on the host
        self.control: dist.ProcessGroup | None = new_group(list(range(dist.get_world_size())),
                                                           backend="gloo")

    @property
    def level(self) -> int:
        return self.controller.level

    @property
    def groups(self) -> list[GroupSpec]:
        return self.ladder[self.controller.level]

    def report_step_ms(self, ms: float) -> None:
        self._reported_ms = float(ms)

    # -- between two steps ---------------------------------------------------------------
    def boundary(self) -> None:
        """Between two steps: note this rank's measurement of the step just done; every
        ``agree_every`` steps share the measurements noted (an allreduce issued now and
        completed by the next boundary), and let the controller observe, in order, the
        agreed measurements of the batch before and choose this step's level.

        Waiting for the agreement here would hold every rank's backward pass until the
        slowest rank got there; a step of delay costs nothing, and every rank still
        decides alike. A measurement taken at another level than the current one (a
        step before a move) is not observed."""
        now = time.perf_counter()
        elapsed_ms = 1000 * (now - self._last_boundary) if self._last_boundary else 0.0
        if self._reported_ms is not None:
            elapsed_ms, self._reported_ms = self._reported_ms, None
        self._last_boundary = now
        if self.states.step == 0:
            return  # nothing compressed yet
        due = self._due()
        self._batch.append((self.controller.level, self.squared_gain(), elapsed_ms))
        if self.states.step % self.agree_every == 0:
            self._inflight = self._share(async_op=True)
        if self.trial is not None and not self.trial.decided:
            self._trial_turn(due)
            return
        for level, gain, time_ms in due:
            if level != self.controller.level:
                continue
            before = self.controller.level
            after = self.controller.observe(self.states.step, gain, time_ms)
            if after != before:
                self._switch(before, after)

    def _trial_turn(self, due: list[tuple[int, float, float | None]]) -> None:
        """A step of the runtime trial: take the agreed measurements, move to this step's
        candidate (or the plan's choice), and keep the best once every trial step is
        measured."""
        assert self.trial is not None
        for level, _, time_ms in due:
            self.trial.observe(level, time_ms)
        step, before, rounds = self.states.step, self.controller.level, self.trial.rounds
        if step == max(1, self.trial.warmup):
            names = ", ".join(f"{level} ({self._name(level)})" for level in self.trial.candidates)
            self._announce(f"bytecomp: step {step}: the runtime trial times levels {names} "
                           f"in turn for {self.trial.steps} steps ({self.trial.steps} more "
                           f"where they tie), then keeps the best")
        chosen = self.trial.decide()
        if self.trial.rounds != rounds:
            log.info("bytecomp: step %d: the trial's candidates are within its measured noise "
                     "(one step's %.1f%%): it repeats the comparison over %d more steps",
                     step, 100 * self.trial.noise(), self.trial.steps)
        if chosen is not None:
            reason = f"the trial: {self.trial.verdict}"
            self._announce(f"bytecomp: step {step}: the runtime trial keeps level {chosen} "
                           f"({self._name(chosen)}): {self.trial.verdict}")
            self.controller.move_to(step, chosen, reason)
        else:
            target = self.trial.level_for(step, self.plan.adaptive.start)  # type: ignore[union-attr]
            if target != before:
                self.controller.move_to(step, target, "the trial's turn", settle=False)
        if self.controller.level != before:
            self._switch(before, self.controller.level)

    def _name(self, level: int) -> str:
        assert self.plan.levels  # an adaptive plan's
        return self.plan.levels[level].setting

    def _announce(self, line: str) -> None:
        """One line of the runtime trial's (its start, its decision): printed on rank 0's
        stderr, logged on the ``bytecomp.runtime`` logger and kept in the stats."""
        if dist.get_rank() == 0:
            print(line, file=sys.stderr, flush=True)
        log.info("%s", line)
        self.stats.trial.append(line)

    def _share(self, async_op: bool) -> tuple:
        """Allreduce the batch's measurements (squared gain, ms, measured) over the ranks:
        (levels, early, measurements, work); the batch starts again."""
        levels = [level for level, _, _ in self._batch]
        measured = torch.tensor([[squared, ms, float(ms > 0)] for _, squared, ms in self._batch],
                                dtype=torch.float64).reshape(-1, 3)
        early, self._batch, self._early = self._early, [], []
        return levels, early, measured, dist.all_reduce(measured, group=self.control,
                                                        async_op=async_op)

    def _agreed_entries(self, levels: list[int], measured: torch.Tensor) -> list[Entry]:
        """[level, gain, step ms or None] per step, from the ranks' summed measurements."""
        world = dist.get_world_size()
        return [[level, math.sqrt(max(0.0, squared / world)),
                 ms / world if flag == world else None]
                for level, (squared, ms, flag) in zip(levels, measured.tolist())]

    def _collect(self) -> None:
        """Finish the allreduce in flight: its agreed measurements (after those agreed
        early) are due at the next boundary."""
        if self._inflight is None:
            return
        levels, early, measured, work = self._inflight
        work.wait()
        self.controller_pending = early + self._agreed_entries(levels, measured)
        self._inflight = None

    def _due(self) -> list[tuple[int, float, float | None]]:
        """The agreed measurements to observe now, once: (level, gain, step ms or None)."""
        self._collect()
        due, self.controller_pending = self.controller_pending, []
        return [(int(level), float(gain), None if ms is None else float(ms))
                for level, gain, ms in due]

    def squared_gain(self) -> float:
        """This rank's last step: the groups' squared gains weighted by their parameters
        (a group that measured nothing, uncompressed or 16-bit, counts 1)."""
        return squared_gain(self.groups, self.states)

    def _switch(self, source: int, target: int) -> None:
        """Leave level ``source`` for ``target``: its residuals wait for the next gradients."""
        assert self.topology is not None  # an adaptive plan always runs the executor's groups
        for group in self.ladder[source]:
            state = self.states.by_group.get(group.key)
            residual = take_residuals(state, group.scheme, group.numel,
                                      self.topology) if state else None
            if residual is None:
                continue
            offset = 0
            for name, shape in zip(group.names, group.shapes):
                size = math.prod(shape)
                piece = residual[offset:offset + size].reshape(shape)
                self.pending[name] = piece + self.pending[name] if name in self.pending else piece
                offset += size
        self.use_level(target)
        self.stats.add(switches=1)
        move = self.controller.switches[-1]
        log.info("bytecomp: step %d: level %d -> %d (gain %.3f: %s)", move.step, move.source,
                 move.target, move.gain, move.reason)

    def fold(self, named_gradients: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Add to each gradient the residual a level left for it (after a move)."""
        for name, grad in named_gradients:
            carried = self.pending.pop(name, None)
            if carried is not None:
                grad.add_(carried.to(grad.device, grad.dtype).view_as(grad))

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The controller's state and the agreed measurements not yet observed (those of
        the batch in progress are agreed now: collective)."""
        self._collect()  # agreed on, and kept for the next step
        if self._batch:  # agreed now, observed when the batch would have been
            levels, early, measured, _ = self._share(async_op=False)
            self._early = early + self._agreed_entries(levels, measured)
        saved = {**self.controller.state_dict(), "pending": self.controller_pending,
                 "early": self._early}
        if self._reported_ms is not None:  # the step just finished, not yet measured
            saved["reported_ms"] = self._reported_ms
        if self.trial is not None:
            saved["trial"] = self.trial.state_dict()
        return saved

    def load_state_dict(self, saved) -> None:
        if not isinstance(saved, dict):
            raise BytecompError("this executor state has no controller (saved with a "
                                "static plan?)")
        self.controller.load_state_dict(saved)
        pending = saved.get("pending")
        if pending is not None and len(pending) == 3 and not isinstance(pending[0], list):
            pending = [pending]  # saved before agree_every: one measurement
        self.controller_pending = _entries_of(pending, "pending")
        self._early = _entries_of(saved.get("early"), "early")
        reported = saved.get("reported_ms")
        if reported is not None and (isinstance(reported, bool) or
                                     not isinstance(reported, (int, float)) or
                                     not 0 <= reported < math.inf):
            raise BytecompError("the executor state's controller is damaged (reported_ms)")
        self._reported_ms = None if reported is None else float(reported)
        if self.trial is not None:
            self.trial.load_state_dict(saved.get("trial"))
        self._batch, self._inflight = [], None
        self.use_level(self.controller.level)

    @property
    def switches(self) -> list[Switch]:
        return list(self.controller.switches)

    def close(self) -> None:
        """Finish the agreement in flight, destroy the control group and let go of the
        executor's topology (its groups are freed only once nothing holds them)."""
        if self._inflight is not None:
            self._inflight[3].wait()
            self._inflight = None
        release_groups(self.control)
        self.control = self.topology = None


def squared_gain(groups: list[GroupSpec], states: GroupStates) -> float:
    """What the groups' compression kept of the last step's gradient on this rank: their
    squared gains weighted by their parameters (a group that measured nothing,
    uncompressed or 16-bit, counts 1)."""
    total = sum(group.numel for group in groups) or 1
    shares, taken = [], []
    for group in groups:
        shares.append(group.numel / total)
        taken.append(states.take_gain(group.key))
    values = iter(_read_together([t for measured in taken if measured is not None
                                  for t in measured]))
    squared = 0.0
    for share, measured in zip(shares, taken):
        norm, error = (next(values), next(values)) if measured is not None else (0.0, 0.0)
        squared += share if norm <= 0 else share * max(0.0, 1.0 - error / norm)
    return squared


def _entries_of(saved, what: str) -> list[Entry]:
    """Saved agreed measurements, [level, gain, ms or None] each, checked."""
    if saved is None:
        return []
    if not isinstance(saved, list) or not all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], int) and
            isinstance(e[1], (int, float)) and (e[2] is None or isinstance(e[2], (int, float)))
            for e in saved):
        raise BytecompError(f"the executor state's controller is damaged ({what})")
    return [list(e) for e in saved]


def _read_together(tensors: list[torch.Tensor]) -> list[float]:
    """The values of 0-d tensors, in order, read with one copy per device: each read of a
    GPU tensor waits for the GPU, so a step's gains wait once, not twice per group."""
    values: list[float | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    for indices in by_device.values():
        read = torch.stack([tensors[i] for i in indices]).tolist()
        for index, value in zip(indices, read):
            values[index] = value
    return [float(v) for v in values if v is not None]
