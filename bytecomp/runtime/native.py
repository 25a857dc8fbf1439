"""Plans that are one of PyTorch's own DDP communication hooks, and running them so.

A static plan whose every group is uncompensated fp32 or fp16, allreduced on the
device over the whole job, is what DDP's own allreduce or PyTorch's
``fp16_compress_hook`` does with a bucket. A static plan of PowerSGD (error
feedback and warm start on) on exactly the matrices that PyTorch's
``powerSGD_hook`` compresses at its rank, and fp32 allreduce on the rest, is what
that hook does, where DDP keeps every gradient in one bucket (:func:`one_bucket`).
Which hook a compressor is declares itself (``Compressor.pytorch_hook``); which
scheme exchanges as the hooks do too (``Scheme.native``).

:func:`bytecomp.apply_plan` registers such a hook (none at all for fp32) and returns
a :class:`NativeRun` instead of building bytecomp's executor: no groups, no
threads, the same statistics and checkpoints.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from bytecomp.comm.schemes import scheme_of
from bytecomp.compress.base import ALLREDUCE_HOOK, FP16_HOOK, POWERSGD_HOOK
from bytecomp.compress.lowrank import powersgd_compresses
from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan
from bytecomp.runtime.groups import GroupSpec
from bytecomp.runtime.peers import Heartbeats, ReportsPeerFailures, job_store
from bytecomp.runtime.state import GroupStates, Stats

# The hooks a whole level may be handed to, by the name compressors declare
# (Compressor.pytorch_hook). PyTorch's bf16_compress_hook is not one: it refuses any
# backend but NCCL and XCCL.
BUCKET_HOOKS = {ALLREDUCE_HOOK: default_hooks.allreduce_hook,
                FP16_HOOK: default_hooks.fp16_compress_hook}
# The hook allreduces its first iterations plainly; 2 is the fewest it takes with error
# feedback.
POWERSGD_START_ITER = 2
POWERSGD_KEY = "<powerSGD_hook>"  # its state among the groups' in state_dict


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


def _hook_of(group: GroupSpec) -> str | None:
    """The PyTorch hook whose exchange a device group on a native scheme runs."""
    if group.place != "device" or not scheme_of(group.scheme).native:
        return None
    return group.compressor.runs_as_pytorch_hook()


def bucket_hook(groups: list[GroupSpec]) -> str | None:
    """The name in :data:`BUCKET_HOOKS` of the hook every group is (so every bucket: DDP's
    own allreduce or the fp16 hook), else None."""
    hooks = {_hook_of(group) for group in groups}
    if len(hooks) != 1:
        return None
    hook = hooks.pop()
    return hook if hook in BUCKET_HOOKS else None


def powersgd_rank(groups: list[GroupSpec], params: dict[str, torch.nn.Parameter]) -> int | None:
    """The rank at which these groups are what PyTorch's powerSGD_hook does: PowerSGD as
    the hook runs it on exactly the matrices its rule compresses
    (:func:`~bytecomp.compress.lowrank.powersgd_compresses`), DDP's own allreduce on the
    others; else None."""
    ranks = set()
    for group in groups:
        hook = _hook_of(group)
        if hook == POWERSGD_HOOK:
            ranks.add(group.compressor.values["rank"])
        elif hook != ALLREDUCE_HOOK:
            return None
    if len(ranks) != 1:
        return None
    rank = ranks.pop()
    for group in groups:
        compressed = _hook_of(group) == POWERSGD_HOOK
        if any(powersgd_compresses(tuple(params[name].shape), rank) != compressed
               for name in group.names):
            return None
    return rank


class NativeRun(ReportsPeerFailures):
    """A static plan run by one of PyTorch's own hooks (see the module docstring): what
    :func:`bytecomp.apply_plan` returns for it. It registers the hook (none for fp32:
    DDP's own allreduce), counts steps and bytes in :attr:`stats`, and keeps the
    PowerSGD hook's state in :meth:`state_dict`. ``rank``: the PowerSGD hook's rank, or
    None for ``hook`` (a name in :data:`BUCKET_HOOKS`)."""

    native = True
    controller = None  # no adaptive plan runs natively

    def __init__(self, plan: Plan, params: dict[str, torch.nn.Parameter],
                 device: torch.device, hook: str | None = None, rank: int | None = None):
        self.plan = plan
        self.stats = Stats(timed=False)  # PyTorch's hook: bytes counted, times not measured
        self.states = GroupStates(plan, device)  # the step count, and the checkpoint format
        self.heartbeats = Heartbeats(job_store(), dist.get_rank(), dist.get_world_size())
        self.failure = None
        self.measures_gain = False
        self._fp32_bytes = sum(p.numel() * p.element_size() for p in params.values())
        self.bucket_hook = hook
        self.powersgd_state: powersgd.PowerSGDState | None = None
        if rank is not None:
            self.powersgd_state = powersgd.PowerSGDState(
                process_group=None, matrix_approximation_rank=rank,
                start_powerSGD_iter=POWERSGD_START_ITER, min_compression_rate=2,
                use_error_feedback=True, warm_start=True, random_seed=0)
            self._sent = _powersgd_sent_bytes(params, rank)
            # the hook's memory is laid out by the bucket's order of parameters, which a
            # new DDP object changes twice (its first buckets, then the rebuilt ones): kept
            # by name, so that a resumed run continues bit for bit (_align)
            self._name_of = {id(param): name for name, param in params.items()}
            self._shapes = {name: tuple(param.shape) for name, param in params.items()}
            self._layouts: dict[int, list[str]] = {}
        else:
            assert hook is not None
            self._sent = sent_bytes(hook, self._fp32_bytes)

    def register(self, ddp) -> None:
        """Register PyTorch's hook on ``ddp`` (none for fp32: DDP's own allreduce), and
        count steps at each forward pass."""
        if self.powersgd_state is not None:  # through hook(): it keeps the memory aligned
            ddp.register_comm_hook(self, NativeRun.hook)  # and counts the steps
            return
        if self.bucket_hook is not None and self.bucket_hook != ALLREDUCE_HOOK:
            ddp.register_comm_hook(None, BUCKET_HOOKS[self.bucket_hook])
        ddp.register_forward_pre_hook(self._count_step)

    @staticmethod
    def hook(self: NativeRun, bucket):  # no annotations: DDP rejects postponed ones
        """PyTorch's hook as a hook over this run (:func:`bytecomp.comm_hook`'s way): the
        bucket through it, a step counted at the last bucket."""
        if self.powersgd_state is not None:
            self._align(bucket)
            future = powersgd.powerSGD_hook(self.powersgd_state, bucket)
        else:
            future = BUCKET_HOOKS[self.bucket_hook](None, bucket)  # type: ignore[index,arg-type]
        if bucket.is_last():
            self.stats.add(steps=1, fp32_bytes=self._fp32_bytes, sent_bytes=self._sent)
        return future

    def _align(self, bucket) -> None:
        """Where this bucket's parameters come in another order than last time (a new
        DDP object's first buckets, then its rebuilt ones), move the PowerSGD hook's
        residual and factors of the bucket to the new order, tensor by tensor."""
        assert self.powersgd_state is not None
        index = bucket.index()
        layout = [self._name_of[id(param)] for param in bucket.parameters()]
        before = self._layouts.get(index)
        self._layouts[index] = layout
        if before is None or before == layout:
            return
        state = self.powersgd_state
        rank = state.matrix_approximation_rank
        for memory, kind in ((state.error_dict, "error"), (state.p_memory_dict, "p"),
                             (state.q_memory_dict, "q")):
            if index in memory:
                memory[index] = _relaid(memory[index], _spans(before, self._shapes, rank, kind),
                                        _spans(layout, self._shapes, rank, kind))

    def _count_step(self, *_) -> None:
        if torch.is_grad_enabled():
            self.stats.add(steps=1, fp32_bytes=self._fp32_bytes, sent_bytes=self._sent)

    @property
    def step(self) -> int:
        """The step restored from a checkpoint (PyTorch's hooks count their own)."""
        return self.states.step

    @property
    def level(self) -> int:
        return 0

    @property
    def switches(self) -> list:
        return []

    def report_step_ms(self, ms: float) -> None:
        """Ignored: a static plan (see :meth:`bytecomp.runtime.Executor.report_step_ms`)."""

    def last_gain(self) -> float:
        raise BytecompError("last_gain needs bytecomp's executor: apply the plan with "
                            "measure_gain=True")

    def state_dict(self) -> dict:
        """The step, the plan's digest and, for the PowerSGD hook, its state (its residuals
        and factors differ between ranks: gathered, as the executor's are). Collective:
        call it on every rank."""
        if self.powersgd_state is None:
            return self.states.state_dict()
        self.states.by_group[POWERSGD_KEY] = {**_powersgd_state_of(self.powersgd_state),
                                              "layouts": dict(self._layouts)}
        try:
            return self.states.state_dict()
        finally:
            self.states.by_group.pop(POWERSGD_KEY)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (from a run of the same plan run the same way)."""
        self.states.load_state_dict(state)
        hook_state = self.states.by_group.pop(POWERSGD_KEY, None)
        if (hook_state is None) != (self.powersgd_state is None) or self.states.by_group:
            how = "as PyTorch's powerSGD_hook" if hook_state is not None else \
                "through bytecomp's executor"
            raise BytecompError(f"this executor state was saved running the plan {how}; "
                                f"apply the plan the same way (apply_plan's native=) to load it")
        if self.powersgd_state is not None and hook_state is not None:
            _restore_powersgd_state(self.powersgd_state, hook_state)
            layouts = hook_state.get("layouts", {})
            if not isinstance(layouts, dict) or any(
                    not isinstance(names, list) or sorted(names) != sorted(self._shapes)
                    for names in layouts.values()):
                raise BytecompError("this executor state is corrupted: PyTorch's powerSGD_hook "
                                    "state's layouts are not this model's parameters")
            self._layouts = {int(index): list(names) for index, names in layouts.items()}

    def close(self) -> None:
        """Stop the heartbeats (PyTorch's hook runs on DDP's own groups)."""
        self.heartbeats.close()


def sent_bytes(hook: str, fp32_bytes: int) -> int:
    """Bytes a step sends through one of :data:`BUCKET_HOOKS` (fp16: half)."""
    return fp32_bytes // (1 if hook == ALLREDUCE_HOOK else 2)


def _powersgd_sent_bytes(params: dict[str, torch.nn.Parameter], rank: int) -> int:
    """Bytes a compressed step of PyTorch's powerSGD_hook sends: both factors of every
    matrix it compresses, the other gradients whole."""
    sent = 0
    for param in params.values():
        shape = tuple(param.shape)
        if powersgd_compresses(shape, rank):
            rows, cols = shape[0], param.numel() // shape[0]
            sent += (rows + cols) * min(rank, rows, cols) * param.element_size()
        else:
            sent += param.numel() * param.element_size()
    return sent


def _spans(layout: list[str], shapes: dict[str, tuple], rank: int,
           kind: str) -> dict[str, tuple[int, int]]:
    """Where each parameter of a bucket laid out as ``layout`` sits in the PowerSGD hook's
    memory of ``kind``: ``error`` (the bucket's flat buffer, in its order), ``p`` or ``q``
    (the factors of the matrices it compresses, grouped by shape in order of first
    appearance, then in the bucket's order): ``name -> (offset, length)``."""
    if kind == "error":
        spans, offset = {}, 0
        for name in layout:
            length = math.prod(shapes[name])
            spans[name], offset = (offset, length), offset + length
        return spans
    by_shape: dict[tuple[int, int], list[str]] = {}
    for name in layout:
        shape = shapes[name]
        if powersgd_compresses(shape, rank):
            rows = shape[0]
            by_shape.setdefault((rows, math.prod(shape) // rows), []).append(name)
    spans, offset = {}, 0
    for (rows, cols), names in by_shape.items():
        length = (rows if kind == "p" else cols) * min(rows, cols, rank)
        for name in names:
            spans[name], offset = (offset, length), offset + length
    return spans


def _relaid(memory: torch.Tensor, before: dict[str, tuple[int, int]],
            after: dict[str, tuple[int, int]]) -> torch.Tensor:
    """``memory`` laid out by ``before`` moved to the layout ``after``."""
    moved = torch.empty_like(memory)
    for name, (offset, length) in after.items():
        start = before[name][0]
        moved[offset:offset + length] = memory[start:start + length]
    return moved


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
