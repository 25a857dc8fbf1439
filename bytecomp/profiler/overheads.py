"""Measure the executor's fixed costs (:mod:`bytecomp.costs.executor_costs`) on the job's
ranks, with the real executor on the real process groups.

A synthetic model of ``GROUPS`` tiny parameters (``NUMEL`` elements each, next to no
compute) is trained through DDP with a plan that gives each parameter a group of
its own on one path (``direct``: fp16 allreduce; ``fifo``: DGC, whose payloads vary
in size, so that sizes and payloads are allgathered on the FIFO thread; ``host``:
fp16 on the host workers). Per
path, the backward pass (hook, exchanges and DDP's wait included) is timed with
``FEW`` and with ``GROUPS`` groups in one bucket: the difference per added group,
less what the model already charges for such a group (its encode, collectives and
decode from this profile's collective sweeps and a compressor sweep of the same
sizes), is the group's fixed cost (none where the model charges more). The
part of it spent inside the hook (the executor times its hook; device encodes
excluded) is charged on the hook's thread, the rest on the channel. The cost of
a bucket is the difference per added bucket between ``GROUPS`` groups in one
bucket and in one bucket each (direct path), charged on the hook's thread.

On the CPU the executor's threads share the cores with the backward pass, so
what the model hides on the channel may not hide at all. There the same
``GROUPS`` parameters are also trained with a backward pass that computes
(``BUSY_DIM`` matrix products between parameters, one bucket each) in ``FEW``
groups and in ``GROUPS`` groups, so that groups are exchanged while the
backward computes: the difference per added group, less the compute the model
already charges for it (encode, decode, the channel's compute) and the longer
waits of its collectives while the backward computes (the profile's
``busy_collective_ms`` per collective), is what a group costs the backward pass
even with compute to hide behind. Where it exceeds the hook's
figure it becomes the hook's figure (the channel keeps the rest of the fixed
cost, if any). On a GPU, where the backward is the device's, this is not
measured. Every figure is the median over iterations of the slowest rank.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bytecomp.costs.executor_costs import PATHS, ExecutorCosts
from bytecomp.plan_file import plan_from_dict
from bytecomp.plan_types import Option, Plan, PlanEntry, fingerprint
from bytecomp.profile_meta import ProfileMeta
from bytecomp.runtime import apply_plan

NUMEL = 1024
FEW, GROUPS = 2, 24
BUSY_DIM = 384  # the busy backward's matrices: about a millisecond a layer on a CPU core
QUICK_BUSY_DIM = 192  # a --quick profile's: a quarter of the compute
OPTIONS = {"direct": Option("fp16", "device", "allreduce"),
           "fifo": Option("dgc:ratio=0.01", "device", "allgather"),
           "host": Option("fp16", "host", "allreduce")}
ONE_BUCKET_MB, BUCKET_PER_TENSOR_MB = 25.0, NUMEL * 4 / 2**20 / 2


class TinyModel(torch.nn.Module):
    """``count`` parameters of ``NUMEL`` elements; the loss touches each once. With
    ``busy``, a chain of matrix products runs through them, so the backward pass
    computes between one parameter's gradient and the next."""

    def __init__(self, count: int, busy: bool = False, dim: int = BUSY_DIM,
                 device=None) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(NUMEL))
                                              for _ in range(count))
        self.busy = busy
        generator = torch.Generator().manual_seed(0)
        size = dim if busy else 1
        # plain tensors, not buffers: the same on every rank, so DDP has nothing to sync
        self.mixing = (torch.randn(size, size, generator=generator) / size**0.5).to(device)
        self.start = torch.ones(64, size, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = sum((w * x).sum() for w in self.weights)
        if self.busy:  # each layer's gradient waits for the products of the layers after it
            hidden = self.start
            for w in self.weights:
                hidden = torch.tanh((hidden @ self.mixing) * w[0])
            total = total + hidden.mean()
        return total


def _plan(model: TinyModel, option: Option, nodes: int, cap_mb: float,
          groups: int | None = None) -> Plan:
    """Every parameter on ``option``: one group each, or ``groups`` groups of
    consecutive parameters in gradient order."""
    world = dist.get_world_size()
    names = list(reversed([name for name, _ in model.named_parameters()]))
    count = groups or len(names)
    entries = [PlanEntry.of(name, option, index * count // len(names))
               for index, name in enumerate(names)]
    plan = Plan(fingerprint(model), world, nodes, world // nodes, cap_mb, entries, {},
                {"algorithm": "executor overhead measurement"})
    return plan_from_dict(plan.to_dict(), "<executor overhead measurement>")


def _slowest_median(samples: list[float]) -> float:
    """The median of this rank's samples (s), the largest over the ranks (ms)."""
    value = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return 1000.0 * float(value)


class _ThroughExecutor:
    """One configuration: ``groups`` groups on ``option`` with buckets of ``cap_mb``
    (``busy``: ``GROUPS`` parameters of the busy model in ``groups`` groups)."""

    def __init__(self, option: Option, groups: int, cap_mb: float, nodes: int, device,
                 busy: bool = False, busy_dim: int = BUSY_DIM) -> None:
        self.option, self.device = option, device
        self.model = TinyModel(GROUPS if busy else groups, busy, busy_dim, device).to(device)
        self.ddp = DistributedDataParallel(self.model, bucket_cap_mb=cap_mb)
        # native=False: an fp16 plan would otherwise be PyTorch's own hook, not the path
        self.executor = apply_plan(self.ddp, _plan(self.model, option, nodes, cap_mb, groups),
                                   native=False)
        self.x = torch.ones(NUMEL, device=device)
        self.backward: list[float] = []
        self.hook: list[float] = []

    def step(self, keep: bool) -> None:
        """One timed backward pass; the hook's time without the device encodes in it."""
        stats = self.executor.stats
        loss = self.ddp(self.x)
        dist.barrier()
        hook_s, encode_s = stats.hook_s, stats.encode_s
        started = time.perf_counter()
        loss.backward()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - started
        hook_s = stats.hook_s - hook_s
        if self.option.place == "device":  # encodes run inside the hook: not a fixed cost
            hook_s -= stats.encode_s - encode_s
        if keep:
            self.backward.append(elapsed)
            self.hook.append(max(0.0, hook_s))

    def medians(self) -> tuple[float, float]:
        """Median backward ms and hook ms per step (slowest rank)."""
        return _slowest_median(self.backward), _slowest_median(self.hook)


def model_charges(collectives: list[dict], device, nodes: int, ranks_per_node: int
                  ) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """What the model charges per path for one group of ``NUMEL`` elements (encode,
    channel, decode, copies), the part of it that computes on the rank (a device
    path's encode and decode, and the channel's compute), and how many collectives
    the group issues, from ``collectives`` (this profile's sweep rows) and a
    compressor sweep of the measurement's options."""
    import pandas as pd

    from bytecomp.costs.fitted import CommModel, ComputeModel, profiled_cluster
    from bytecomp.costs.strategy import StrategyCosts
    from bytecomp.profile_store import Profile
    from bytecomp.profiler.sweeps import SweepSettings, sweep_compressors

    specs = sorted({option.spec for option in OPTIONS.values()})
    devices = [device] + ([torch.device("cpu")] if device.type == "cuda" else [])
    rows = sweep_compressors(specs, devices, SweepSettings(numels=(NUMEL, 4 * NUMEL)))
    meta: ProfileMeta = {"model": {"name": "executor overhead measurement"}, "nodes": nodes,
                         "ranks_per_node": ranks_per_node, "world_size": nodes * ranks_per_node}
    profile = Profile(meta, pd.DataFrame(), pd.DataFrame(collectives), pd.DataFrame(rows))
    costs = StrategyCosts(CommModel(profile, profiled_cluster(profile)), ComputeModel(profile),
                          device.type)
    charges, compute, counts = {}, {}, {}
    for path, option in OPTIONS.items():
        cost = costs.cost(option, NUMEL)
        charges[path] = (cost.encode_ms + cost.channel_ms + cost.decode_ms + cost.copy_in_ms
                         + cost.copy_out_ms)
        compute[path] = 0.0 if cost.host else cost.encode_ms + cost.decode_ms + cost.compute_ms
        counts[path] = cost.collectives
    return charges, compute, counts


@dataclass(frozen=True)
class ExecutorMeasurement:
    """What :func:`measure_executor` timed, per added group (ms), before what the model
    charges is taken off: ``added_ms`` (the idle backward), ``hook_added_ms`` (its
    part inside the hook), ``busy_added_ms`` (the computing backward; CPU jobs only,
    else empty) per path, and ``bucket_ms`` per added bucket. None of it depends on the
    profiled model, so a calibration keeps it (profile.yaml's ``executor.measured``) and
    :meth:`costs` turns it into fixed costs with a profile's own charges and
    ``busy_collective_ms``."""

    added_ms: dict[str, float]
    hook_added_ms: dict[str, float]
    busy_added_ms: dict[str, float]
    bucket_ms: float

    def costs(self, charges: dict[str, float], compute_charges: dict[str, float],
              collectives: dict[str, int] | None = None,
              busy_collective_ms: float = 0.0) -> ExecutorCosts:
        """The fixed costs, given what the model charges per group on each path, the
        part of it that computes on the rank and its collectives (:func:`model_charges`),
        each of which waits ``busy_collective_ms`` longer while the rank computes (the
        profile's measurement), not counted again as a fixed cost."""
        hook_ms, tail_ms = {}, {}
        for path in PATHS:
            fixed = max(0.0, self.added_ms[path] - charges[path])
            hook_ms[path] = min(fixed, max(0.0, self.hook_added_ms[path]))
            if path in self.busy_added_ms:  # what a group still costs the busy backward
                waits = (collectives or {}).get(path, 0) * busy_collective_ms
                exposed = self.busy_added_ms[path] - compute_charges[path] - waits
                hook_ms[path] = max(hook_ms[path], exposed)
            tail_ms[path] = max(0.0, fixed - hook_ms[path])
        return ExecutorCosts(max(0.0, self.bucket_ms), hook_ms, tail_ms)

    def to_meta(self) -> dict:
        meta: dict = {"added_ms": dict(self.added_ms), "hook_added_ms": dict(self.hook_added_ms),
                      "bucket_ms": self.bucket_ms}
        if self.busy_added_ms:
            meta["busy_added_ms"] = dict(self.busy_added_ms)
        return meta

    @classmethod
    def from_meta(cls, meta: dict) -> ExecutorMeasurement:
        """From profile.yaml's ``executor.measured`` (validated by the profile store)."""
        return cls({p: float(meta["added_ms"][p]) for p in PATHS},
                   {p: float(meta["hook_added_ms"][p]) for p in PATHS},
                   {p: float(v) for p, v in (meta.get("busy_added_ms") or {}).items()},
                   float(meta["bucket_ms"]))


def measure_executor_costs(device, nodes: int, charges: dict[str, float],
                           compute_charges: dict[str, float], warmup: int, iterations: int,
                           progress=None, busy_dim: int = BUSY_DIM,
                           collectives: dict[str, int] | None = None,
                           busy_collective_ms: float = 0.0) -> ExecutorCosts:
    """The executor's fixed costs on this job (collective: call on every rank):
    :func:`measure_executor`, then :meth:`ExecutorMeasurement.costs`."""
    measured = measure_executor(device, nodes, warmup, iterations, progress, busy_dim)
    return measured.costs(charges, compute_charges, collectives, busy_collective_ms)


MIN_KEPT_ROUNDS = 3  # a median of fewer says little


def measure_executor(device, nodes: int, warmup: int, iterations: int, progress=None,
                     busy_dim: int = BUSY_DIM, allowance=None) -> ExecutorMeasurement:
    """Time the executor on this job (collective: call on every rank); on the CPU the
    busy backward multiplies ``busy_dim`` x ``busy_dim`` matrices. The configurations
    run interleaved, round after round, so that drift hits all alike. With
    ``allowance`` (a :class:`bytecomp.profiler.budget.Allowance`), the rounds stop
    where another would end past it, after at least :data:`MIN_KEPT_ROUNDS` kept ones
    (every rank alike)."""
    from bytecomp.profiler.budget import agreed

    runs: dict[tuple, _ThroughExecutor] = {}
    for path in PATHS:
        runs[(path, FEW)] = _ThroughExecutor(OPTIONS[path], FEW, ONE_BUCKET_MB, nodes, device)
        runs[(path, GROUPS)] = _ThroughExecutor(OPTIONS[path], GROUPS, ONE_BUCKET_MB, nodes,
                                                device)
    runs[("buckets", GROUPS)] = _ThroughExecutor(OPTIONS["direct"], GROUPS,
                                                 BUCKET_PER_TENSOR_MB, nodes, device)
    busy = device.type == "cpu"  # on a GPU the backward's compute is the device's
    if busy:
        for path in PATHS:
            for groups in (FEW, GROUPS):
                runs[("busy", path, groups)] = _ThroughExecutor(
                    OPTIONS[path], groups, BUCKET_PER_TENSOR_MB, nodes, device, busy=True,
                    busy_dim=busy_dim)
    try:
        for round_number in range(warmup + iterations):
            began = time.time()
            for run in runs.values():
                run.step(keep=round_number >= warmup)
            if progress is not None:
                progress()
            kept = round_number + 1 - warmup
            if allowance is not None and kept >= MIN_KEPT_ROUNDS and \
                    agreed(time.time() + (time.time() - began) > allowance.deadline):
                break
    finally:
        for run in runs.values():
            run.executor.close()
    added = GROUPS - FEW
    added_ms, hook_added_ms, busy_added_ms = {}, {}, {}
    for path in PATHS:
        few, few_hook = runs[(path, FEW)].medians()
        many, many_hook = runs[(path, GROUPS)].medians()
        added_ms[path] = (many - few) / added
        hook_added_ms[path] = (many_hook - few_hook) / added
        if busy:
            few, _ = runs[("busy", path, FEW)].medians()
            many, _ = runs[("busy", path, GROUPS)].medians()
            busy_added_ms[path] = (many - few) / added
    one_bucket, _ = runs[("direct", GROUPS)].medians()
    many_buckets, _ = runs[("buckets", GROUPS)].medians()
    return ExecutorMeasurement(added_ms, hook_added_ms, busy_added_ms,
                               (many_buckets - one_bucket) / (GROUPS - 1))
