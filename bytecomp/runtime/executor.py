"""Execute a plan inside DDP: a communication hook that runs each group's strategy.

DDP hands the hook one bucket at a time, in the same order on every rank. The
executor files each gradient under its plan group; when a group has all its
members (possibly from several buckets) it is launched on its path
(:mod:`bytecomp.runtime.paths`: encoded on the device or on the host). The
communication thread takes groups in launch order, so every rank issues the
same collectives in the same order. A bucket's future completes when every
group holding one of its gradients has written its average back into the
bucket. Compressor state and error-feedback residuals are kept per group,
keyed by the names of its tensors, and survive ``state_dict``
(:mod:`bytecomp.runtime.state`).

An adaptive plan's levels each have their groups (and states, keyed by level).
At the first bucket of every step the executor composes the gain that the
last step's compression kept; every ``agree_every`` steps it agrees on those
steps' gains and durations with the other ranks (one small allreduce), and
the controller (:mod:`bytecomp.runtime.controller`) observes them in order and
picks this step's level. A level of fp32 allreduce everywhere hands its buckets to
PyTorch's own allreduce hook. On a move, each
tensor's error-feedback residuals of the level it leaves are folded into its
next gradient (never dropped): for a compressor of the same family that is
what its own residual would have done.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from bytecomp.comm.schemes import take_residuals
from bytecomp.comm.topology import Topology, free_retired_groups, new_group, release_groups
from bytecomp.comm.worker import CommWorker
from bytecomp.compress.lowrank import powersgd_compresses
from bytecomp.errors import BytecompError
from bytecomp.plan import Plan, load_plan
from bytecomp.runtime.checks import agree, check_bucket_cap, local_problem
from bytecomp.runtime.controller import Controller, Switch
from bytecomp.runtime.groups import GroupSpec, build_groups
from bytecomp.runtime.paths import DevicePath, HostPath
from bytecomp.runtime.state import GroupStates, Stats
from bytecomp.runtime.steps import Step, WaitingBucket

log = logging.getLogger("bytecomp.runtime")

# A level whose every group is one of these, uncompensated, allreduced on the device over
# the job, is exactly what PyTorch's own hook (or DDP's own allreduce) does with a bucket
# (PyTorch's bf16_compress_hook is left out: it refuses any backend but NCCL and XCCL)
BUILTIN_HOOKS = {"none": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook}
# A static plan of PowerSGD (error feedback and warm start on) on exactly the matrices that
# PyTorch's powerSGD_hook compresses at its rank, and fp32 allreduce on the rest, is what
# that hook does: it runs as the hook. The hook allreduces its first iterations plainly;
# 2 is the fewest it takes with error feedback.
POWERSGD_START_ITER = 2
POWERSGD_KEY = "<powerSGD_hook>"  # its state among the groups' in state_dict
# close() waits this long at most for gloo's threads to let go of the groups: they do
# within microseconds of the last callback returning, unless descheduled
CLOSE_WAIT_S = 2.0


def one_bucket(params, bucket_cap_mb: float) -> bool:
    """Whether DDP keeps every gradient of ``params`` in one bucket at this cap: one dtype,
    fewer bytes than the cap (so no bucket closes early, whatever the ready order).
    PyTorch's powerSGD_hook issues a bucket's second allreduce from the first one's
    completion callback, which may reach the process group before or after the next
    bucket's first allreduce, in another order on each rank (measured: gloo aborted
    with 'Received data size doesn't match expected size' on 2 buckets); in one bucket
    the order is fixed."""
    return len({p.dtype for p in params}) == 1 and \
        sum(p.numel() * p.element_size() for p in params) < bucket_cap_mb * (1 << 20)


class Executor:
    """Runs a plan as a DDP communication hook. Create it with :func:`apply_plan`."""

    def __init__(self, ddp, plan: Plan, fallback: str | None = None,
                 host_workers: int | None = None, native: bool = True,
                 measure_gain: bool = False):
        if fallback not in (None, "fp32"):
            raise BytecompError(f"fallback must be None or 'fp32', got {fallback!r}")
        if not dist.is_initialized():
            raise BytecompError("apply_plan needs torch.distributed initialized "
                                "(dist.init_process_group)")
        # no reference to ddp: DDP's C++ reducer holds this executor (the hook's state), and
        # a cycle through C++ is never collected (the model, its groups and threads with it)
        self.plan = plan
        model = ddp.module
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.name_of = {id(p): n for n, p in self.params.items()}
        self.device = next(iter(self.params.values())).device if self.params else \
            torch.device("cpu")
        agree(plan, local_problem(plan, model, self.params, fallback))
        if plan.levels:
            self.ladder = [build_groups(plan.level(i), self.params, fallback, f"L{i}:")
                           for i in range(len(plan.levels))]
            assert plan.adaptive is not None
            self.controller: Controller | None = Controller(
                plan.adaptive, len(plan.levels), [level.predicted_ms for level in plan.levels],
                [level.calibration for level in plan.levels],
                [level.fidelity for level in plan.levels])
        else:
            self.ladder, self.controller = [build_groups(plan, self.params, fallback)], None
        self._use_level(self.level)
        self.pending: dict[str, torch.Tensor] = {}  # residuals to fold into the next gradients
        self._last_boundary: float | None = None
        self._reported_ms: float | None = None  # report_step_ms: the last step's duration
        # steps measured here and not yet shared: (level, squared gain, ms)
        self._batch: list[tuple[int, float, float]] = []
        self._early: list[list] = []  # of the batch, agreed early (state_dict): not yet due
        self._inflight: tuple | None = None  # (levels, early, measurements, allreduce)
        self.controller_pending: list[list] = []  # agreed [level, gain, ms or None], due
        self.stats = Stats()
        self.measures_gain = measure_gain or self.controller is not None
        self.states = GroupStates(plan, self.device, meter=self.measures_gain)
        self.worker = CommWorker()
        self._fp32_bytes = sum(p.numel() * p.element_size() for p in self.params.values())
        self._current = Step()
        check_bucket_cap(ddp, plan)
        builtin = self._builtin_exchange()
        self.powersgd_rank = self._powersgd_hook_rank() if builtin is None and \
            not self.measures_gain and one_bucket(self.params.values(), plan.bucket_cap_mb) \
            else None
        self.native = native and self.controller is None and \
            (builtin is not None or self.powersgd_rank is not None)
        self.powersgd_state: powersgd.PowerSGDState | None = None
        # groups of its own, so its traffic never interleaves with DDP's (none where native)
        self.device_path: DevicePath | None = None
        self.host_path: HostPath | None = None
        self.topologies: list[Topology] = []
        self.closed = False
        if not self.native:
            self.topologies.append(Topology.build(plan.nodes, plan.ranks_per_node))
            self.device_path = DevicePath(self.topologies[0], self.worker, self.stats,
                                          self.device)
            if any(g.place == "host" for groups in self.ladder for g in groups):
                if dist.get_backend() != "gloo":  # host payloads travel on gloo groups
                    self.topologies.append(Topology.build(plan.nodes, plan.ranks_per_node,
                                                          backend="gloo"))
                workers = host_workers or plan.host_workers
                self.host_path = HostPath(self.topologies[-1], workers, self.worker,
                                          self.stats, self.device)
        # the controller's agreement travels on a group of its own, on the host
        self.control = new_group(list(range(dist.get_world_size())), backend="gloo") \
            if self.controller is not None else None
        if self.native and self.powersgd_rank is not None:  # PyTorch's powerSGD_hook
            self.powersgd_state = powersgd.PowerSGDState(
                process_group=None, matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=POWERSGD_START_ITER, min_compression_rate=2,
                use_error_feedback=True, warm_start=True, random_seed=0)
            ddp.register_comm_hook(self.powersgd_state, powersgd.powerSGD_hook)
            self._native_sent = self._powersgd_sent_bytes(self.powersgd_rank)
            ddp.register_forward_pre_hook(self._count_native_step)
        elif self.native:  # DDP's own allreduce or PyTorch's hook is this plan: no groups
            hook = BUILTIN_HOOKS[builtin]  # type: ignore[index]  # native: not None
            if hook is not default_hooks.allreduce_hook:  # fp32: DDP's own, no hook at all
                ddp.register_comm_hook(None, hook)
            self._native_sent = self._sent_bytes(hook)
            ddp.register_forward_pre_hook(self._count_native_step)
        else:
            ddp.register_comm_hook(self, Executor._hook)

    @property
    def step(self) -> int:
        """Steps run (and restored from a checkpoint) through the hook."""
        return self.states.step

    @property
    def level(self) -> int:
        """The adaptive plan's current level (0 for a static plan)."""
        return self.controller.level if self.controller is not None else 0

    @property
    def switches(self) -> list[Switch]:
        """An adaptive plan's moves so far: step, from, to, gain, reason."""
        return list(self.controller.switches) if self.controller is not None else []

    def report_step_ms(self, ms: float) -> None:
        """Tell an adaptive plan's controller how long the step just finished took.

        By default the controller times a step as the wall-clock time between two
        consecutive steps of this executor. Where that is not the step's time (a loop that
        trains several models in turn in one process, as ``bytecomp bench --train-steps``
        does, or one that pauses between steps to evaluate), call this after each
        ``optimizer.step()`` with the step's own duration; it replaces the wall-clock
        interval for that step. Static plans ignore it.

        Example::

            started = time.perf_counter()
            loss_fn(ddp(inputs), target).backward()
            optimizer.step()
            executor.report_step_ms(1000 * (time.perf_counter() - started))
        """
        self._reported_ms = float(ms)

    def last_gain(self) -> float:
        """The gain of what this rank compressed in the step just finished (``sqrt(1 -
        ||C(x) - x||^2 / ||x||^2)`` per group on the compensated gradient, composed weighted
        by parameters; uncompressed and 16-bit groups count 1). Needs
        ``apply_plan(..., measure_gain=True)``; call it after each step (it takes the
        step's measurement). An adaptive plan's controller takes them itself."""
        if not self.measures_gain or self.controller is not None:
            raise BytecompError("last_gain needs a static plan applied with "
                                "measure_gain=True")
        return math.sqrt(self._local_squared_gain())

    def _use_level(self, level: int) -> None:
        self.groups = self.ladder[level]
        self.group_of = {name: g for g in self.groups for name in g.names}
        # an adaptive plan's level that PyTorch's own hook is takes a short cut (a static
        # plan is then DDP's own allreduce or that hook, without the executor: see native)
        builtin = self._builtin_exchange() if self.controller is not None else None
        self._plain = BUILTIN_HOOKS[builtin] if builtin is not None else None

    def _builtin_exchange(self) -> str | None:
        """``none`` or ``fp16`` where the current level is that (without error feedback)
        on every gradient, allreduced on the device over the whole job: what DDP's own
        allreduce or PyTorch's fp16 compress hook does; else None."""
        names = {g.compressor.name for g in self.groups}
        if len(names) != 1 or not names <= set(BUILTIN_HOOKS):
            return None
        if all(g.place == "device" and g.scheme == "allreduce" and
               not g.compressor.error_feedback for g in self.groups):
            return names.pop()
        return None

    def _powersgd_hook_rank(self) -> int | None:
        """The rank at which this static plan is what PyTorch's powerSGD_hook does: PowerSGD
        with error feedback and warm start on exactly the matrices the hook's rule
        compresses (:func:`~bytecomp.compress.lowrank.powersgd_compresses`), fp32 on the
        others, all allreduced on the device over the whole job; else None."""
        if self.controller is not None:
            return None
        ranks = set()
        for group in self.groups:
            compressor = group.compressor
            if group.place != "device" or group.scheme != "allreduce":
                return None
            if compressor.name == "powersgd" and compressor.error_feedback and \
                    compressor.values.get("warm_start"):
                ranks.add(compressor.values["rank"])
            elif compressor.name != "none" or compressor.error_feedback:
                return None
        if len(ranks) != 1:
            return None
        rank = ranks.pop()
        for group in self.groups:
            compressed = group.compressor.name == "powersgd"
            if any(powersgd_compresses(tuple(self.params[name].shape), rank) != compressed
                   for name in group.names):
                return None
        return rank

    def _powersgd_sent_bytes(self, rank: int) -> int:
        """Bytes a compressed step of PyTorch's powerSGD_hook sends: both factors of every
        matrix it compresses, the other gradients whole."""
        sent = 0
        for param in self.params.values():
            shape = tuple(param.shape)
            if powersgd_compresses(shape, rank):
                rows, cols = shape[0], param.numel() // shape[0]
                sent += (rows + cols) * min(rank, rows, cols) * param.element_size()
            else:
                sent += param.numel() * param.element_size()
        return sent

    def _sent_bytes(self, hook) -> int:
        """Bytes a step sends through one of :data:`BUILTIN_HOOKS` (fp16: half)."""
        return self._fp32_bytes // (1 if hook is default_hooks.allreduce_hook else 2)

    def _count_native_step(self, *_) -> None:
        if torch.is_grad_enabled():
            self.stats.add(steps=1, fp32_bytes=self._fp32_bytes, sent_bytes=self._native_sent)

    # -- the hook ---------------------------------------------------------------------------------
    @staticmethod
    def _hook(self: Executor, bucket):  # no annotations: DDP rejects postponed ones
        started = time.perf_counter()
        step = self._current
        if self.controller is not None and not step.started:  # the first bucket of a step
            step.started = True
            self._boundary()
        if self._plain is not None:
            return self._plain_exchange(bucket, started)
        members = [(self.group_of[self.name_of[id(p)]], self.name_of[id(p)], grad)
                   for p, grad in zip(bucket.parameters(), bucket.gradients())]
        if self.pending:
            self._fold_pending(bucket.parameters(), bucket.gradients())
        touched = list(dict.fromkeys(group.index for group, _, _ in members))
        waiting = WaitingBucket(self._new_future(), bucket.buffer(), len(touched))
        with step.lock:
            for index in touched:
                step.waiting.setdefault(index, []).append(waiting)
        complete = []
        for group, name, grad in members:
            arrived = step.arrived.setdefault(group.index, {})
            arrived[name] = grad
            if len(arrived) == len(group.names):
                complete.append(group)
        for group in complete:
            step.launched.add(group.index)
            views = [step.arrived[group.index][n] for n in group.names]
            self._launch(group, views, partial(step.group_done, group.index))
        if bucket.is_last():
            self._end_step(step)
        self.stats.add(hook_s=time.perf_counter() - started)
        return waiting.future

    def _plain_exchange(self, bucket, started: float) -> torch.futures.Future:
        """A level that PyTorch's own hook is (an adaptive plan's level 0, fp32 or fp16):
        the bucket as that hook exchanges it, without the groups' bookkeeping, after
        folding in what a compressed level left."""
        if self.pending:
            self._fold_pending(bucket.parameters(), bucket.gradients())
        # None: the default group, as PyTorch's own examples register these hooks
        future = self._plain(None, bucket)  # type: ignore[arg-type, misc]
        if bucket.is_last():
            self._current = Step()
            self.states.step += 1
            self.stats.add(steps=1, fp32_bytes=self._fp32_bytes,
                           sent_bytes=self._sent_bytes(self._plain))
        self.stats.add(hook_s=time.perf_counter() - started)
        return future

    def _fold_pending(self, params, gradients) -> None:
        """Add to each gradient the residual a level left for it (after a move)."""
        for p, grad in zip(params, gradients):
            carried = self.pending.pop(self.name_of[id(p)], None)
            if carried is not None:
                grad.add_(carried.to(grad.device, grad.dtype).view_as(grad))

    def _new_future(self) -> torch.futures.Future:
        if self.device.type == "cuda":
            return torch.futures.Future(devices=[self.device])
        return torch.futures.Future()

    def _end_step(self, step: Step) -> None:
        missing = [g for g in self.groups if g.index not in step.launched]
        self._current = Step()
        self.states.step += 1
        self.stats.add(steps=1, fp32_bytes=self._fp32_bytes)
        if missing:
            raise BytecompError(f"bytecomp: no gradient arrived this step for "
                                f"{missing[0].names[0]!r} (unused parameters need "
                                f"find_unused_parameters=True in DDP)")

    # -- adaptive plans -----------------------------------------------------------------------
    def _boundary(self) -> None:
        """Between two steps: note this rank's measurement of the step just done; every
        ``agree_every`` steps share the measurements noted (an allreduce issued now and
        completed by the next boundary), and let the controller observe, in order, the
        agreed measurements of the batch before and choose this step's level.

        Waiting for the agreement here would hold every rank's backward pass until the
        slowest rank got there; a step of delay costs nothing, and every rank still
        decides alike. A measurement taken at another level than the current one (a
        step before a move) is not observed."""
        assert self.controller is not None and self.control is not None
        now = time.perf_counter()
        elapsed_ms = 1000 * (now - self._last_boundary) if self._last_boundary else 0.0
        if self._reported_ms is not None:
            elapsed_ms, self._reported_ms = self._reported_ms, None
        self._last_boundary = now
        if self.states.step == 0:
            return  # nothing compressed yet
        due = self._due()
        self._batch.append((self.controller.level, self._local_squared_gain(), elapsed_ms))
        if self.states.step % self.plan_agree_every == 0:
            self._inflight = self._share(async_op=True)
        for level, gain, time_ms in due:
            if level != self.controller.level:
                continue
            before = self.controller.level
            after = self.controller.observe(self.states.step, gain, time_ms)
            if after != before:
                self._switch(before, after)

    @property
    def plan_agree_every(self) -> int:
        assert self.plan.adaptive is not None
        return self.plan.adaptive.agree_every

    def _share(self, async_op: bool) -> tuple:
        """Allreduce the batch's measurements (squared gain, ms, measured) over the ranks:
        (levels, early, measurements, work); the batch starts again."""
        levels = [level for level, _, _ in self._batch]
        measured = torch.tensor([[squared, ms, float(ms > 0)] for _, squared, ms in self._batch],
                                dtype=torch.float64).reshape(-1, 3)
        early, self._batch, self._early = self._early, [], []
        return levels, early, measured, dist.all_reduce(measured, group=self.control,
                                                        async_op=async_op)

    def _agreed_entries(self, levels: list[int], measured: torch.Tensor) -> list[list]:
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

    def _local_squared_gain(self) -> float:
        """This rank's last step: the groups' squared gains weighted by their parameters
        (a group that measured nothing, uncompressed or 16-bit, counts 1)."""
        total = sum(group.numel for group in self.groups) or 1
        shares, taken = [], []
        for group in self.groups:
            measured = self.states.take_gain(group.key)
            shares.append(group.numel / total)
            taken.append(measured)
        values = iter(_read_together([t for measured in taken if measured is not None
                                      for t in measured]))
        squared = 0.0
        for share, measured in zip(shares, taken):
            norm, error = (next(values), next(values)) if measured is not None else (0.0, 0.0)
            squared += share if norm <= 0 else share * max(0.0, 1.0 - error / norm)
        return squared

    def _switch(self, source: int, target: int) -> None:
        """Leave level ``source`` for ``target``: its residuals wait for the next gradients."""
        assert self.device_path is not None  # an adaptive plan is never native
        for group in self.ladder[source]:
            state = self.states.by_group.get(group.key)
            residual = take_residuals(state, group.scheme, group.numel,
                                      self.device_path.topology) if state else None
            if residual is None:
                continue
            offset = 0
            for name, shape in zip(group.names, group.shapes):
                size = math.prod(shape)
                piece = residual[offset:offset + size].reshape(shape)
                self.pending[name] = piece + self.pending[name] if name in self.pending else piece
                offset += size
        self._use_level(target)
        self.stats.add(switches=1)
        assert self.controller is not None
        move = self.controller.switches[-1]
        log.info("bytecomp: step %d: level %d -> %d (gain %.3f: %s)", move.step, move.source,
                 move.target, move.gain, move.reason)

    def _launch(self, group: GroupSpec, views: list[torch.Tensor], done) -> None:
        """Run ``group``'s exchange; ``done(error=None)`` when its result is written back."""
        if self.closed:
            raise BytecompError("this executor is closed: apply the plan again to train on")
        state = self.states.of(group.key, group.shapes)
        path = self.host_path if group.place == "host" else self.device_path
        assert path is not None  # a host path exists whenever a group is on the host
        path.launch(group, views, state, done)

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every rank's residuals and compressor state per group, the step and the plan's
        digest. Collective: call it on every rank (residuals differ between ranks, so
        each rank's are gathered; rank 0 can then save the whole job's state alone)."""
        if self.powersgd_state is not None:  # travels with the groups' (none here)
            self.states.by_group[POWERSGD_KEY] = _powersgd_state_of(self.powersgd_state)
            try:
                saved = self.states.state_dict()
            finally:
                self.states.by_group.pop(POWERSGD_KEY)
        else:
            saved = self.states.state_dict()
        if self.controller is not None:
            self._collect()  # agreed on, and kept for the next step
            if self._batch:  # agreed now, observed when the batch would have been
                levels, early, measured, _ = self._share(async_op=False)
                self._early = early + self._agreed_entries(levels, measured)
            saved["controller"] = {**self.controller.state_dict(),
                                   "pending": self.controller_pending, "early": self._early}
        return saved

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (from a run with the same plan); each rank takes its own."""
        self.states.load_state_dict(state)
        hook_state = self.states.by_group.pop(POWERSGD_KEY, None)
        if (hook_state is None) != (self.powersgd_state is None):
            how = "as PyTorch's powerSGD_hook" if hook_state is not None else \
                "through bytecomp's executor"
            raise BytecompError(f"this executor state was saved running the plan {how}; "
                                f"apply the plan the same way (apply_plan's native=) to load it")
        if self.powersgd_state is not None and hook_state is not None:
            _restore_powersgd_state(self.powersgd_state, hook_state)
        if self.controller is not None:
            if not isinstance(state.get("controller"), dict):
                raise BytecompError("this executor state has no controller (saved with a "
                                    "static plan?)")
            self.controller.load_state_dict(state["controller"])
            pending = state["controller"].get("pending")
            if pending is not None and len(pending) == 3 and not isinstance(pending[0], list):
                pending = [pending]  # saved before agree_every: one measurement
            self.controller_pending = _entries_of(pending, "pending")
            self._early = _entries_of(state["controller"].get("early"), "early")
            self._batch, self._inflight = [], None
            self._use_level(self.controller.level)

    def close(self) -> None:
        """Stop the background threads and destroy the executor's process groups, on
        every rank after the last step (an idle gloo group still polls its sockets).

        It waits until the groups are freed: a gloo group's threads stop only once
        nothing holds it, and freeing it where a completion callback let go of it last
        (on one of its own threads) aborts the process, as does a callback still
        releasing what it was given when the interpreter exits ("terminate called
        without an active exception"). See comm/topology.py's free_retired_groups."""
        if self._inflight is not None:
            self._inflight[3].wait()
            self._inflight = None
        self.worker.close()
        if self.host_path is not None:
            self.host_path.close()
        if self.device_path is not None:
            self.device_path.close()
        while self.topologies:  # no loop variable left holding the last one's groups
            self.topologies.pop().release()
        release_groups(self.control)
        self.control = None
        self.device_path = self.host_path = None
        self.closed = True
        free_retired_groups(wait_s=CLOSE_WAIT_S)


def _entries_of(saved, what: str) -> list[list]:
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


def _powersgd_state_of(state: powersgd.PowerSGDState) -> dict:
    """What PyTorch's powerSGD_hook keeps between steps (its residuals and factors by
    bucket, its step, its random generator), as tensors, numbers and dicts."""
    _, keys, position, has_gauss, gauss = state.rng.get_state(legacy=True)
    return {"iter": state.iter, "error": dict(state.error_dict), "p": dict(state.p_memory_dict),
            "q": dict(state.q_memory_dict),
            "rng_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "rng_position": int(position), "rng_has_gauss": int(has_gauss),
            "rng_gauss": float(gauss),
            "numel_before": state.total_numel_before_compression,
            "numel_after": state.total_numel_after_compression,
            "next_stats_report": state.next_stats_report}


def _restore_powersgd_state(state: powersgd.PowerSGDState, saved: dict) -> None:
    try:
        state.iter = int(saved["iter"])
        state.error_dict = dict(saved["error"])
        state.p_memory_dict = dict(saved["p"])
        state.q_memory_dict = dict(saved["q"])
        state.rng.set_state(("MT19937", saved["rng_keys"].numpy().astype(np.uint32),
                             int(saved["rng_position"]), int(saved["rng_has_gauss"]),
                             float(saved["rng_gauss"])))
        state.total_numel_before_compression = saved["numel_before"]
        state.total_numel_after_compression = saved["numel_after"]
        state.next_stats_report = saved["next_stats_report"]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BytecompError(f"this executor state is corrupted: PyTorch's powerSGD_hook "
                            f"state is malformed ({error})") from None


def apply_plan(ddp_model, plan: Plan | str | Path, fallback: str | None = None,
               host_workers: int | None = None, native: bool = True,
               measure_gain: bool = False) -> Executor:
    """Register a communication hook on ``ddp_model`` that executes ``plan``.

    Every rank must call it with the same plan, before the first backward pass.
    It checks, on every rank, that the plan matches the model (fingerprint) and
    the job (world size) and that all ranks hold the same plan (their digests
    agree); any mismatch raises the same :class:`~bytecomp.errors.BytecompError`
    on every rank. A parameter the plan does not name is an error unless
    ``fallback="fp32"``. Host-placed groups run on ``host_workers`` threads per rank
    (default: the plan's ``host_workers``, a node's cores shared by its ranks where the
    cluster config gave them, else 2). A plan that allreduces every gradient in fp32 is what
    DDP does by itself, one that allreduces every gradient in fp16 is PyTorch's
    ``fp16_compress_hook``, and, where DDP keeps every gradient in one bucket
    (:func:`one_bucket`), a static plan of PowerSGD rank r (error feedback and warm
    start on) on the matrices PyTorch's ``powerSGD_hook`` compresses at rank r and fp32
    on the rest is that hook: with ``native=True`` no hook, or PyTorch's, is registered
    for it (the executor only counts steps and bytes, and keeps the PowerSGD hook's
    state in :meth:`Executor.state_dict`); ``native=False`` runs it through the
    executor's hook like any other plan.
    An adaptive plan keeps the executor's hook, which hands the buckets of such a level
    to PyTorch's hook. With ``measure_gain=True`` the compressors with error
    feedback measure what they keep of each step's gradient (two norms per group), for
    :meth:`Executor.last_gain` (the convergence probe records it).

    >>> ddp = DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb)
    >>> executor = bytecomp.apply_plan(ddp, "plan.yaml")
    >>> ...train...
    >>> torch.save({"model": ddp.state_dict(), "bytecomp": executor.state_dict()}, path)
    """
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    return Executor(ddp_model, plan, fallback, host_workers, native, measure_gain)
