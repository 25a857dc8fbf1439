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

An adaptive plan's levels each have their groups (and states, keyed by level);
:mod:`bytecomp.runtime.adaptive` agrees on the measurements and moves between
them. A level of fp32 or fp16 allreduce everywhere hands its buckets to PyTorch's
own hook. A static plan that is one of PyTorch's hooks does not come here at all
(:mod:`bytecomp.runtime.native`); :func:`bytecomp.runtime.apply.apply_plan` decides.
"""

from __future__ import annotations

import math
import threading
import time
from functools import partial

import torch
import torch.distributed as dist

from bytecomp.comm.topology import Topology, free_retired_groups
from bytecomp.comm.worker import CommWorker
from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan
from bytecomp.runtime.adaptive import Adaptation, squared_gain
from bytecomp.runtime.controller import Controller, Switch
from bytecomp.runtime.groups import GroupSpec
from bytecomp.runtime.native import BUCKET_HOOKS, POWERSGD_KEY, bucket_hook, sent_bytes
from bytecomp.runtime.paths import DevicePath, HostPath
from bytecomp.runtime.peers import Heartbeats, ReportsPeerFailures, job_store
from bytecomp.runtime.state import GroupLayout, GroupStates, GroupTimes, Stats
from bytecomp.runtime.steps import Step, WaitingBucket

# close() waits this long at most for gloo's threads to let go of the groups: they do
# within microseconds of the last callback returning, unless descheduled
CLOSE_WAIT_S = 2.0


class Executor(ReportsPeerFailures):
    """Runs a plan as a DDP communication hook. Create it with :func:`apply_plan`; use it
    as a context manager to close it after training and to get a peer's failure as one
    :class:`~bytecomp.runtime.peers.PeerFailure` (see :class:`ReportsPeerFailures`)."""

    native = False  # bytecomp's own hook (see NativeRun for PyTorch's)

    def __init__(self, plan: Plan, params: dict[str, torch.nn.Parameter],
                 ladder: list[list[GroupSpec]], host_workers: int | None = None,
                 measure_gain: bool = False):
        self.plan = plan
        self.params = params
        self.name_of = {id(p): n for n, p in params.items()}
        self.device = device_of(params)
        self.ladder = ladder
        self.stats = Stats()
        self.closed = False
        self.measures_gain = measure_gain or plan.adaptive is not None
        self.states = GroupStates(plan, self.device, meter=self.measures_gain, layouts={
            g.key: GroupLayout(tuple(g.shapes), g.numel, params[g.names[0]].dtype)
            for groups in ladder for g in groups})
        self.adaptation = Adaptation(plan, ladder, self.states, self.stats, self._use_level) \
            if plan.levels else None
        self._use_level(self.level)
        self.worker = CommWorker()
        self._fp32_bytes = sum(p.numel() * p.element_size() for p in params.values())
        self._current = Step()
        self.group_times: GroupTimes | None = None  # record_group_times' recorder
        # groups of its own, so its traffic never interleaves with DDP's
        self.topologies = [Topology.build(plan.nodes, plan.ranks_per_node)]
        self.device_path: DevicePath | None = DevicePath(self.topologies[0], self.worker,
                                                         self.stats, self.device)
        self.host_path: HostPath | None = None
        if any(g.place == "host" for groups in ladder for g in groups):
            if dist.get_backend() != "gloo":  # host payloads travel on gloo groups
                self.topologies.append(Topology.build(plan.nodes, plan.ranks_per_node,
                                                      backend="gloo"))
            self.host_path = HostPath(self.topologies[-1], host_workers or plan.host_workers,
                                      self.worker, self.stats, self.device)
        if self.adaptation is not None:
            self.adaptation.topology = self.topologies[0]
        self.heartbeats = Heartbeats(job_store(), dist.get_rank(), dist.get_world_size())
        self.failure: BytecompError | None = None  # the first failed exchange, explained
        self._failure_lock = threading.Lock()

    def register(self, ddp) -> None:
        """Register the hook on ``ddp`` (what :func:`apply_plan` does)."""
        # no reference to ddp: DDP's C++ reducer holds this executor (the hook's state), and
        # a cycle through C++ is never collected (the model, its groups and threads with it)
        ddp.register_comm_hook(self, Executor.hook)

    @property
    def step(self) -> int:
        """Steps run (and restored from a checkpoint) through the hook."""
        return self.states.step

    @property
    def controller(self) -> Controller | None:
        """An adaptive plan's controller (None for a static plan)."""
        return self.adaptation.controller if self.adaptation is not None else None

    @property
    def level(self) -> int:
        """The adaptive plan's current level (0 for a static plan)."""
        return self.adaptation.level if self.adaptation is not None else 0

    @property
    def switches(self) -> list[Switch]:
        """An adaptive plan's moves so far: step, from, to, gain, reason."""
        return self.adaptation.switches if self.adaptation is not None else []

    @property
    def pending(self) -> dict[str, torch.Tensor]:
        """Residuals a move left, to fold into the next gradients (by tensor name)."""
        return self.adaptation.pending if self.adaptation is not None else {}

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
        if self.adaptation is not None:
            self.adaptation.report_step_ms(ms)

    def last_gain(self) -> float:
        """The gain of what this rank compressed in the step just finished (``sqrt(1 -
        ||C(x) - x||^2 / ||x||^2)`` per group on the compensated gradient, composed weighted
        by parameters; uncompressed and 16-bit groups count 1). Needs
        ``apply_plan(..., measure_gain=True)``; call it after each step (it takes the
        step's measurement). An adaptive plan's controller takes them itself."""
        if not self.measures_gain or self.adaptation is not None:
            raise BytecompError("last_gain needs a static plan applied with "
                                "measure_gain=True")
        return math.sqrt(squared_gain(self.groups, self.states))

    def _use_level(self, level: int) -> None:
        self.groups = self.ladder[level]
        self.group_of = {name: g for g in self.groups for name in g.names}
        # an adaptive plan's level that PyTorch's own hook is takes a short cut (a static
        # plan is then DDP's own allreduce or that hook, without the executor: see native)
        hook = bucket_hook(self.groups) if self.adaptation is not None else None
        self._plain = hook

    # -- the hook ---------------------------------------------------------------------------------
    @staticmethod
    def hook(self: Executor, bucket):  # no annotations: DDP rejects postponed ones
        """The communication hook (``self`` is DDP's hook state): one bucket's exchange."""
        if self.closed:
            raise BytecompError("this executor is closed: apply the plan again to train on")
        started = time.perf_counter()
        step = self._current
        if step.origin is None and self.group_times is not None and \
                self.group_times.steps_left > 0:
            step.origin = started
        if self.adaptation is not None and not step.started:  # the first bucket of a step
            step.started = True
            self.adaptation.boundary()
        if self._plain is not None:
            return self._plain_exchange(bucket, started)
        members = [(self.group_of[self.name_of[id(p)]], self.name_of[id(p)], grad)
                   for p, grad in zip(bucket.parameters(), bucket.gradients())]
        self._fold_pending(bucket)
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
            self._launch(group, views, partial(self._group_done, step, group.index))
        if bucket.is_last():
            self._end_step(step)
        self.stats.add(hook_s=time.perf_counter() - started)
        return waiting.future

    def _plain_exchange(self, bucket, started: float) -> torch.futures.Future:
        """A level that PyTorch's own hook is (an adaptive plan's level 0, fp32 or fp16):
        the bucket as that hook exchanges it, without the groups' bookkeeping, after
        folding in what a compressed level left."""
        self._fold_pending(bucket)
        # None: the default group, as PyTorch's own examples register these hooks
        assert self._plain is not None
        future = BUCKET_HOOKS[self._plain](None, bucket)  # type: ignore[arg-type]
        if bucket.is_last():
            self._current = Step()
            self.states.step += 1
            self.stats.add(steps=1, fp32_bytes=self._fp32_bytes,
                           sent_bytes=sent_bytes(self._plain, self._fp32_bytes))
        self.stats.add(hook_s=time.perf_counter() - started)
        return future

    def _fold_pending(self, bucket) -> None:
        """Add to the bucket's gradients what a move between levels left for them."""
        if self.adaptation is not None and self.adaptation.pending:
            self.adaptation.fold((self.name_of[id(p)], grad) for p, grad in
                                 zip(bucket.parameters(), bucket.gradients()))

    def _new_future(self) -> torch.futures.Future:
        if self.device.type == "cuda":
            return torch.futures.Future(devices=[self.device])
        return torch.futures.Future()

    def _end_step(self, step: Step) -> None:
        if step.origin is not None and self.group_times is not None:
            self.group_times.steps_left -= 1
        missing = [g for g in self.groups if g.index not in step.launched]
        self._current = Step()
        self.states.step += 1
        self.stats.add(steps=1, fp32_bytes=self._fp32_bytes)
        if missing:
            raise BytecompError(f"bytecomp: no gradient arrived this step for "
                                f"{missing[0].names[0]!r} (unused parameters need "
                                f"find_unused_parameters=True in DDP)")

    def _group_done(self, step: Step, index: int, error: BaseException | None = None) -> None:
        """A group's exchange ended; a failure becomes one error naming the rank that
        failed or stopped responding (found once per executor: peers.Heartbeats)."""
        if error is not None:
            with self._failure_lock:
                if self.failure is None:
                    self.failure = self.heartbeats.explain(error)
                error = self.failure
        step.group_done(index, error)

    def _launch(self, group: GroupSpec, views: list[torch.Tensor], done) -> None:
        """Run ``group``'s exchange; ``done(error=None)`` when its result is written back."""
        state = self.states.of(group.key, group.shapes)
        path = self.host_path if group.place == "host" else self.device_path
        assert path is not None  # a host path exists whenever a group is on the host
        step, times = self._current, None
        if step.origin is not None and self.group_times is not None:
            times, recorder, origin = {"launched": time.perf_counter()}, self.group_times, \
                step.origin
            step_number, finished = self.states.step, done

            def done(error: BaseException | None = None) -> None:
                times["done"] = time.perf_counter()
                if error is None:
                    recorder.add(step_number, group.index, origin, times)
                finished(error)
        path.launch(group, views, state, done, times)

    def record_group_times(self, steps: int) -> GroupTimes:
        """Record, for the next ``steps`` steps, when each group was launched, encoded, on
        the wire, off it and written back (:class:`~bytecomp.runtime.state.GroupTimes`:
        ``rows``, ms after each step's first bucket), to compare with the simulated
        iteration group by group (``benchmarks/group_times.py``). It costs a few clock
        reads per group; the last recorder's rows stay in :attr:`group_times`."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise BytecompError(f"record_group_times takes a whole number of steps >= 1, got "
                                f"{steps!r}")
        self.group_times = GroupTimes(steps)
        return self.group_times

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every rank's residuals and compressor state per group, the step and the plan's
        digest. Collective: call it on every rank (residuals differ between ranks, so
        each rank's are gathered; rank 0 can then save the whole job's state alone)."""
        saved = self.states.state_dict()
        if self.adaptation is not None:
            saved["controller"] = self.adaptation.state_dict()
        return saved

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (from a run with the same plan); each rank takes its own."""
        self.states.load_state_dict(state)
        if POWERSGD_KEY in self.states.by_group:
            raise BytecompError("this executor state was saved running the plan as PyTorch's "
                                "powerSGD_hook; apply the plan the same way (apply_plan's "
                                "native=) to load it")
        if self.adaptation is not None:
            self.adaptation.load_state_dict(state.get("controller"))

    def close(self) -> None:
        """Stop the background threads and destroy the executor's process groups, on
        every rank after the last step (an idle gloo group still polls its sockets).

        It waits until the groups are freed: a gloo group's threads stop only once
        nothing holds it, and freeing it where a completion callback let go of it last
        (on one of its own threads) aborts the process, as does a callback still
        releasing what it was given when the interpreter exits ("terminate called
        without an active exception"). See comm/topology.py's free_retired_groups."""
        if self.adaptation is not None:
            self.adaptation.close()
        self.heartbeats.close()
        self.worker.close()
        if self.host_path is not None:
            self.host_path.close()
        if self.device_path is not None:
            self.device_path.close()
        while self.topologies:  # no loop variable left holding the last one's groups
            self.topologies.pop().release()
        self.device_path = self.host_path = None
        self.closed = True
        free_retired_groups(wait_s=CLOSE_WAIT_S)


def device_of(params: dict[str, torch.nn.Parameter]) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")
