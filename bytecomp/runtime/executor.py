"""Execute a plan inside DDP: a communication hook that runs each group's strategy.

DDP hands the hook one bucket at a time, in the same order on every rank. The
executor files each gradient under its plan group; when a group has all its
members (possibly from several buckets) it is launched:

* ``device`` placement: encode on the hook's own thread (as a device-side
  encode delays the backward pass). An exchange that is one collective (an
  allreduce of a summable payload, an allgather of a fixed-size one) is then
  issued asynchronously right there, on a process group of its own, and
  decoded when it completes; any other (several rounds, sizes to exchange,
  two-shot, hierarchical) runs on the executor's FIFO communication thread;
* ``host`` placement: copy out (pinned memory on CUDA), encode and decode on a
  pool of host worker threads, collectives on the same FIFO thread (a gloo
  group when the job runs NCCL), copy back.

The communication thread takes groups in launch order, so every rank issues
the same collectives in the same order. A bucket's future completes when every
group holding one of its gradients has written its average back into the
bucket. Compressor state and error-feedback residuals are kept per group,
keyed by the names of its tensors, and survive ``state_dict``.
"""

from __future__ import annotations

import threading
import time
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from bytecomp.comm.schemes import FlatExchange, make_exchange, one_collective
from bytecomp.comm.topology import Topology
from bytecomp.comm.worker import CommWorker
from bytecomp.compress import Compressor, Peers, from_spec
from bytecomp.errors import BytecompError
from bytecomp.plan import Plan, load_plan
from bytecomp.plan import HOST_WORKERS, fingerprint

STATE_FORMAT = 1
MIB = 1 << 20


@dataclass
class GroupSpec:
    """One plan group as the executor runs it."""

    index: int
    names: list[str]
    compressor: Compressor
    place: str
    scheme: str
    shapes: list[tuple]
    numel: int

    @property
    def key(self) -> str:
        return "|".join(self.names)


@dataclass
class Stats:
    """Totals since the last reset; ``summary()`` gives per-step figures."""

    steps: int = 0
    sent_bytes: int = 0
    fp32_bytes: int = 0
    encode_s: float = 0.0
    communicate_s: float = 0.0
    decode_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **amounts) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "sent_bytes_per_step": self.sent_bytes / steps,
            "fp32_bytes_per_step": self.fp32_bytes / steps,
            "bytes_vs_fp32": self.sent_bytes / self.fp32_bytes if self.fp32_bytes else 0.0,
            "encode_ms_per_step": 1000 * self.encode_s / steps,
            "communicate_ms_per_step": 1000 * self.communicate_s / steps,
            "decode_ms_per_step": 1000 * self.decode_s / steps,
        }


class _Bucket:
    """A bucket's future, completed when the last group holding one of its gradients
    has written its result back."""

    def __init__(self, future: torch.futures.Future, buffer: torch.Tensor, groups: int) -> None:
        self.future = future
        self.buffer = buffer
        self.remaining = groups


class _Step:
    """Arrivals and waiting buckets of the step in progress."""

    def __init__(self) -> None:
        self.arrived: dict[int, dict[str, torch.Tensor]] = {}
        self.waiting: dict[int, list[_Bucket]] = {}
        self.launched: set[int] = set()
        self.lock = threading.Lock()

    def group_done(self, group: int, error: BaseException | None = None) -> None:
        with self.lock:
            buckets = self.waiting.pop(group, [])
            ready = []
            for bucket in buckets:
                bucket.remaining -= 1
                if error is not None or bucket.remaining == 0:
                    ready.append(bucket)
        for bucket in ready:
            if bucket.future.done():
                continue
            if error is not None:
                bucket.future.set_exception(error)
            else:
                bucket.future.set_result(bucket.buffer)


class Executor:
    """Runs a plan as a DDP communication hook. Create it with :func:`apply_plan`."""

    def __init__(self, ddp, plan: Plan, fallback: str | None = None,
                 host_workers: int = HOST_WORKERS,
                 native: bool = True):
        if fallback not in (None, "fp32"):
            raise BytecompError(f"fallback must be None or 'fp32', got {fallback!r}")
        if not dist.is_initialized():
            raise BytecompError("apply_plan needs torch.distributed initialized "
                                "(dist.init_process_group)")
        self.ddp = ddp
        self.plan = plan
        model = ddp.module
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.name_of = {id(p): n for n, p in self.params.items()}
        self.device = next(iter(self.params.values())).device if self.params else \
            torch.device("cpu")
        problem = self._local_problem(model, fallback)
        self._agree(problem)
        self.groups = self._build_groups(fallback)
        self.group_of = {name: g for g in self.groups for name in g.names}
        self.topology = Topology.build(plan.nodes, plan.ranks_per_node)
        # Single-collective exchanges are issued asynchronously from the hook's thread, in
        # hook order, on a group of their own (the FIFO thread's collectives use another).
        self.direct = dist.new_group(list(range(dist.get_world_size())))
        self.direct_peers = Peers(dist.get_rank(self.direct), dist.get_world_size(self.direct))
        hosted = any(g.place == "host" for g in self.groups)
        self.host_topology = self.topology
        if hosted and dist.get_backend() != "gloo":
            self.host_topology = Topology.build(plan.nodes, plan.ranks_per_node, backend="gloo")
        self.host_pool = ThreadPoolExecutor(host_workers, "bytecomp-host") if hosted else None
        self.worker = CommWorker()
        self.state: dict[str, dict] = {}
        self.step = 0
        self.stats = Stats()
        self._fp32_bytes = sum(p.numel() * p.element_size() for p in self.params.values())
        self._current = _Step()
        self._check_bucket_cap()
        self.native = native and self._plain_allreduce()
        if self.native:  # DDP's own allreduce is this plan: no hook, no Python per bucket
            ddp.register_forward_pre_hook(self._count_native_step)
        else:
            ddp.register_comm_hook(self, Executor._hook)

    def _plain_allreduce(self) -> bool:
        """Whether the plan is fp32 allreduce of every gradient over the whole job."""
        return all(g.compressor.name == "none" and g.place == "device" and
                   g.scheme == "allreduce" for g in self.groups)

    def _count_native_step(self, *_) -> None:
        if torch.is_grad_enabled():
            self.stats.add(steps=1, fp32_bytes=self._fp32_bytes, sent_bytes=self._fp32_bytes)

    # -- checks before the first step ---------------------------------------------------------
    def _local_problem(self, model, fallback) -> str | None:
        plan = self.plan
        world = dist.get_world_size()
        if plan.world_size != world:
            return f"the plan is for {plan.world_size} ranks but this job has {world}"
        names = plan.by_name()
        for name in names:
            if name not in self.params:
                return f"the plan names tensor {name!r}, which the model does not have " \
                       f"(a plan for another model?)"
        unknown = [n for n in self.params if n not in names]
        if fallback is None:
            if unknown:
                return f"tensor {unknown[0]!r} is not in the plan (pass fallback='fp32' " \
                       f"to allreduce unplanned tensors in fp32)"
            if fingerprint(model) != plan.model_fingerprint:
                return "the plan was made for another model (its fingerprint differs: " \
                       "parameter names, shapes or dtypes changed)"
        return None

    def _agree(self, problem: str | None) -> None:
        """Every rank learns every rank's problem and plan digest; all fail alike."""
        reports: list = [None] * dist.get_world_size()
        dist.all_gather_object(reports, (problem, self.plan.digest()))
        for rank, (their_problem, _) in enumerate(reports):
            if their_problem:
                raise BytecompError(f"bytecomp.apply_plan: rank {rank}: {their_problem}")
        digests = [digest for _, digest in reports]
        if len(set(digests)) > 1:
            differing = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
            raise BytecompError(f"bytecomp.apply_plan: the plan differs between ranks "
                                f"({differing}); every rank must load the same plan")

    def _check_bucket_cap(self) -> None:
        cap = getattr(self.ddp, "bucket_bytes_cap", None)
        if cap is not None and abs(cap - self.plan.bucket_cap_mb * MIB) > 1:
            warnings.warn(f"DDP's bucket cap is {cap / MIB:g} MiB but the plan was made for "
                          f"{self.plan.bucket_cap_mb:g}; pass bucket_cap_mb="
                          f"{self.plan.bucket_cap_mb:g} to DistributedDataParallel", stacklevel=3)

    def _build_groups(self, fallback) -> list[GroupSpec]:
        groups = []
        compressors: dict[str, Compressor] = {}
        for _, entries in sorted(self.plan.groups().items()):
            spec = entries[0].compressor if entries[0].action == "compress" else "none"
            compressor = compressors.setdefault(spec, from_spec(spec))
            names = [e.name for e in entries]
            groups.append(GroupSpec(len(groups), names, compressor, entries[0].place,
                                    entries[0].collective,
                                    [tuple(self.params[n].shape) for n in names],
                                    sum(self.params[n].numel() for n in names)))
        if fallback == "fp32":
            planned = self.plan.by_name()
            for name, param in self.params.items():
                if name not in planned:
                    groups.append(GroupSpec(len(groups), [name], from_spec("none"), "device",
                                            "allreduce", [tuple(param.shape)], param.numel()))
        return groups

    # -- the hook ---------------------------------------------------------------------------------
    @staticmethod
    def _hook(self: Executor, bucket):  # no annotations: DDP rejects postponed ones
        step = self._current
        members = [(self.group_of[self.name_of[id(p)]], self.name_of[id(p)], grad)
                   for p, grad in zip(bucket.parameters(), bucket.gradients())]
        touched = list(dict.fromkeys(group.index for group, _, _ in members))
        waiting = _Bucket(self._new_future(), bucket.buffer(), len(touched))
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
        return waiting.future

    def _new_future(self) -> torch.futures.Future:
        if self.device.type == "cuda":
            return torch.futures.Future(devices=[self.device])
        return torch.futures.Future()

    def _end_step(self, step: _Step) -> None:
        missing = [g for g in self.groups if g.index not in step.launched]
        self._current = _Step()
        self.step += 1
        self.stats.add(steps=1, fp32_bytes=self._fp32_bytes)
        if missing:
            raise BytecompError(f"bytecomp: no gradient arrived this step for "
                                f"{missing[0].names[0]!r} (unused parameters need "
                                f"find_unused_parameters=True in DDP)")

    def _state_of(self, group: GroupSpec) -> dict:
        state = self.state.get(group.key)
        if state is None:
            state = self.state[group.key] = {"salt": zlib.crc32(group.key.encode()),
                                             "shapes": group.shapes}
        return state

    # -- running a group -------------------------------------------------------------------------
    @staticmethod
    def _flat_input(views: list[torch.Tensor]) -> tuple[torch.Tensor, bool]:
        """The members as one flat tensor, and whether it is the bucket's own memory
        (when they lie side by side in it: no copy in, the result decoded in place)."""
        adjacent = all(v.is_contiguous() for v in views) and all(
            b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
            for a, b in zip(views, views[1:]))
        if adjacent:
            total = sum(v.numel() for v in views)
            return views[0].reshape(-1).as_strided((total,), (1,)), True
        return torch.cat([v.reshape(-1) for v in views]), False

    @staticmethod
    def _deliver(staged, views: list[torch.Tensor], x: torch.Tensor, in_bucket: bool) -> None:
        """Decode the group's average into the bucket: in place, or piece by piece."""
        if in_bucket:
            staged.decode(out=x)
            return
        flat = staged.decode().reshape(-1)
        offset = 0
        for view in views:
            view.copy_(flat[offset: offset + view.numel()].view_as(view), non_blocking=True)
            offset += view.numel()

    def _launch(self, group: GroupSpec, views, done) -> None:
        """Run ``group``'s exchange; ``done(error=None)`` when its result is written back."""
        state = self._state_of(group)
        if group.place == "host":
            self._launch_on_host(group, views, done, state)
            return
        try:
            started = time.perf_counter()
            x, in_bucket = self._flat_input(views)
            direct = x.numel() and one_collective(group.compressor, group.scheme)
            staged = FlatExchange(x, group.compressor, state, self.direct, group.scheme,
                                  self.direct_peers) if direct else make_exchange(x, group.compressor, state, self.topology,
                                             group.scheme)
            staged.encode()
            issued = time.perf_counter()
            self.stats.add(encode_s=issued - started)
            if direct:
                staged.communicate_async().then(
                    lambda future: self._finish(future, staged, views, x, in_bucket, done,
                                                issued))
                return
        except BaseException as error:
            done(error)
            return

        def communicate_and_decode():
            try:
                started = time.perf_counter()
                staged.communicate()
                middle = time.perf_counter()
                self._deliver(staged, views, x, in_bucket)
                self.stats.add(communicate_s=middle - started,
                               decode_s=time.perf_counter() - middle,
                               sent_bytes=staged.sent_bytes)
                done()
            except BaseException as error:
                done(error)

        self.worker.submit(communicate_and_decode, device=self.device)

    def _finish(self, future, staged, views, x, in_bucket, done, issued: float) -> None:
        """Completion of an asynchronous collective: decode, write back, release."""
        try:
            for inner in future.value():  # raises if the collective failed
                if isinstance(inner, torch.futures.Future):
                    inner.value()
            middle = time.perf_counter()
            self._deliver(staged, views, x, in_bucket)
            self.stats.add(communicate_s=middle - issued, decode_s=time.perf_counter() - middle,
                           sent_bytes=staged.sent_bytes)
            done()
        except BaseException as error:
            done(error)

    def _launch_on_host(self, group: GroupSpec, views, done, state) -> None:
        cuda = self.device.type == "cuda"

        def encode():
            started = time.perf_counter()
            x, _ = self._flat_input(views)
            if cuda:
                host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
                host.copy_(x)
                x = host
            staged = make_exchange(x, group.compressor, state, self.host_topology, group.scheme)
            staged.encode()
            self.stats.add(encode_s=time.perf_counter() - started)
            return staged

        encoded = self.host_pool.submit(encode)

        def decode(staged):
            try:
                started = time.perf_counter()
                result = staged.decode().reshape(-1).to(self.device)
                offset = 0
                for view in views:
                    view.copy_(result[offset: offset + view.numel()].view_as(view))
                    offset += view.numel()
                if cuda:
                    torch.cuda.current_stream(self.device).synchronize()
                self.stats.add(decode_s=time.perf_counter() - started)
                done()
            except BaseException as error:
                done(error)

        def communicate():  # on the FIFO thread, in launch order
            try:
                staged = encoded.result()
                started = time.perf_counter()
                staged.communicate()
                self.stats.add(communicate_s=time.perf_counter() - started,
                               sent_bytes=staged.sent_bytes)
                self.host_pool.submit(decode, staged)
            except BaseException as error:
                done(error)

        self.worker.submit(communicate)

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every rank's residuals and compressor state per group, the step and the plan's
        digest. Collective: call it on every rank (residuals differ between ranks, so
        each rank's are gathered; rank 0 can then save the whole job's state alone)."""
        ranks: list = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, _to_device(self.state, torch.device("cpu")))
        return {"format": STATE_FORMAT, "plan_digest": self.plan.digest(), "step": self.step,
                "world_size": dist.get_world_size(), "ranks": ranks}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (from a run with the same plan); each rank takes its own."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise BytecompError("not a bytecomp executor state (expected executor.state_dict())")
        if state.get("plan_digest") != self.plan.digest():
            raise BytecompError("this executor state was saved with another plan")
        if state.get("world_size") != dist.get_world_size():
            raise BytecompError(f"this executor state was saved by {state.get('world_size')} "
                                f"ranks, not {dist.get_world_size()}")
        self.state = _to_device(state["ranks"][dist.get_rank()], self.device)
        self.step = int(state["step"])

    def close(self) -> None:
        """Stop the background threads (after the last step)."""
        self.worker.close()
        if self.host_pool is not None:
            self.host_pool.shutdown(wait=True)


def _to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    return value


def apply_plan(ddp_model, plan: Plan | str | Path, fallback: str | None = None,
               host_workers: int = HOST_WORKERS, native: bool = True) -> Executor:
    """Register a communication hook on ``ddp_model`` that executes ``plan``.

    Every rank must call it with the same plan, before the first backward pass.
    It checks, on every rank, that the plan matches the model (fingerprint) and
    the job (world size) and that all ranks hold the same plan (their digests
    agree); any mismatch raises the same :class:`~bytecomp.errors.BytecompError`
    on every rank. A parameter the plan does not name is an error unless
    ``fallback="fp32"``. A plan that allreduces every gradient in fp32 is what
    DDP does by itself: with ``native=True`` no hook is registered for it (the
    executor only counts steps and bytes); ``native=False`` runs it through the
    hook like any other plan.

    >>> ddp = DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb)
    >>> executor = bytecomp.apply_plan(ddp, "plan.yaml")
    >>> ...train...
    >>> torch.save({"model": ddp.state_dict(), "bytecomp": executor.state_dict()}, path)
    """
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
    return Executor(ddp_model, plan, fallback, host_workers, native)
