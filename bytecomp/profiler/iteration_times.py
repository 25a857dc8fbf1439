"""Measure training iterations of a workload under real DDP.

Three phases on the same model and batch:

1. compute only (``ddp.no_sync()``): forward, backward and optimizer times and
   every parameter's gradient-ready time relative to the start of the backward
   pass (post-accumulate-grad hooks). This is the backward stream the timeline
   simulator overlaps communication with.
2. DDP with its default allreduce: forward, backward (which now waits for the
   last bucket), optimizer and whole-iteration times. Iterations of 1 and 2
   alternate, so that a burst of noise on a shared machine hits both alike.
3. DDP's bucket membership after its rebuild, recorded from inside a comm hook
   that performs the default allreduce.

Each iteration starts after a barrier; its times are the maximum over ranks
(the slowest rank sets the pace), and statistics are over iterations.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import threading
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bytecomp.comm.topology import new_group
from bytecomp.errors import BytecompError
from bytecomp.profiler.timing import Clock, summarize
from bytecomp.training.workloads import Workload, to_device


@dataclass
class TrainingSettings:
    batch_size: int
    bucket_cap_mb: float
    warmup: int = 3
    iterations: int = 20


def wrap(model, device, bucket_cap_mb: float) -> DistributedDataParallel:
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)


def shape_text(shape) -> str:
    return "x".join(str(s) for s in shape)


def _reduce_max(rows: list[list[float]], device) -> torch.Tensor:
    table = torch.tensor(rows, dtype=torch.float64, device=device)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return table.cpu()


class _ReadyRecorder:
    """Post-accumulate-grad hooks that mark when each parameter's gradient is ready."""

    def __init__(self, model, clock: Clock) -> None:
        self.clock = clock
        self.marks: dict[str, object] = {}
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        parameters = dict(model.named_parameters())
        self.handles = [parameters[name].register_post_accumulate_grad_hook(self._hook(name))
                        for name in self.names]

    def _hook(self, name):
        def hook(_param):
            self.marks[name] = self.clock.mark()
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _one_iteration(ddp, workload, batch, optimizer, clock, compute_only):
    """One training iteration after a barrier: [forward, backward, optimizer, iteration] ms,
    and the backward's start mark."""
    inputs, target = batch
    dist.barrier()
    clock.sync()
    start = clock.mark()
    with ddp.no_sync() if compute_only else contextlib.nullcontext():
        loss = workload.loss(ddp(*inputs), target)
        forward_end = clock.mark()
        loss.backward()
    backward_end = clock.mark()
    optimizer.step()
    optimizer.zero_grad()
    end = clock.mark()
    clock.sync()
    times = [clock.elapsed_ms(start, forward_end), clock.elapsed_ms(forward_end, backward_end),
             clock.elapsed_ms(backward_end, end), clock.elapsed_ms(start, end)]
    return times, forward_end


def _iterate(ddp, workload, batch, optimizer, clock, settings, recorder, progress):
    """Alternate compute-only and DDP iterations (so that noise hits both alike).

    Returns the per-iteration times of each kind and, for compute-only ones,
    the ready offset of every parameter."""
    compute, with_ddp, ready = [], [], []
    names = list(recorder.names)
    for iteration in range(settings.warmup + settings.iterations):
        times, backward_start = _one_iteration(ddp, workload, batch, optimizer, clock, True)
        marks = dict(recorder.marks)
        unused = [name for name in names if name not in marks]
        if unused:  # before DDP's own iteration, which would wait for it forever or fail
            raise BytecompError(
                f"parameter {unused[0]!r} gets no gradient (the forward pass does not use it"
                f"{f'; {len(unused) - 1} more' if len(unused) > 1 else ''}): exclude it from "
                f"the model or freeze it (requires_grad=False); bytecomp profile runs DDP "
                f"without find_unused_parameters")
        ddp_times, _ = _one_iteration(ddp, workload, batch, optimizer, clock, False)
        if iteration >= settings.warmup:
            compute.append(times)
            with_ddp.append(ddp_times)
            ready.append([clock.elapsed_ms(backward_start, marks[n]) for n in names])
        if progress:
            progress(2)
    return compute, with_ddp, ready, names


def _record_buckets(model, device, workload, batch, optimizer, settings) -> dict[str, int]:
    """Bucket index of every parameter after DDP's rebuild, seen from a comm hook."""
    ddp = wrap(model, device, settings.bucket_cap_mb)
    names = {id(p): n for n, p in model.named_parameters()}
    seen: dict[str, int] = {}
    world = dist.get_world_size()

    def recording_allreduce(state, bucket):
        if state["record"]:
            for param in bucket.parameters():
                seen[names[id(param)]] = bucket.index()
        future = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
        return future.then(lambda fut: fut.value()[0])

    state = {"record": False}
    ddp.register_comm_hook(state, recording_allreduce)
    inputs, target = batch
    for iteration in range(3):  # buckets are rebuilt after the first iteration
        state["record"] = iteration == 2
        workload.loss(ddp(*inputs), target).backward()
        optimizer.step()
        optimizer.zero_grad()
    del ddp
    gc.collect()
    return seen


class _BackgroundTraffic:
    """Allreduces back to back (or ``pause_s`` apart), on a group of their own, until any
    rank asks to stop (the request travels in the allreduce itself, so every rank stops
    after the same one)."""

    def __init__(self, group, device: torch.device, nbytes: int = 4 << 20,
                 pause_s: float = 0.0) -> None:
        self.group = group
        self.pause_s = pause_s
        self.buffer = torch.zeros(nbytes // 4, device=device)
        self.stop_requested = False
        self.error: Exception | None = None
        self.times_s: list[float] = []  # each allreduce's, issue to completion
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                self.buffer[0] = 1.0 if self.stop_requested else 0.0
                started = time.perf_counter()
                dist.all_reduce(self.buffer, group=self.group)
                self.times_s.append(time.perf_counter() - started)
                if self.buffer[0].item() > 0:
                    return
                if self.pause_s:
                    time.sleep(self.pause_s)
        except RuntimeError as error:  # a peer died: the rank's main thread reports it
            self.error = error

    def stop(self) -> None:
        self.stop_requested = True
        self.thread.join()
        if self.error is not None:
            raise self.error


def measure_interference(ddp, workload, batch, optimizer, clock, group, rounds: int = 2,
                         per_round: int = 4) -> dict:
    """How much of the compute stream communication on ``group`` takes: backward passes
    alone and while allreduces run back to back on ``group`` beside them (gloo reduces
    and moves bytes with the CPU; on GPUs NCCL takes some SMs).
    ``fraction`` = 1 - alone / with traffic."""
    alone, busy = [], []
    for _ in range(rounds):
        alone += [_one_iteration(ddp, workload, batch, optimizer, clock, True)[0][1]
                  for _ in range(per_round)]
        traffic = _BackgroundTraffic(group, clock.device)
        busy += [_one_iteration(ddp, workload, batch, optimizer, clock, True)[0][1]
                 for _ in range(per_round)]
        traffic.stop()
    table = _reduce_max([alone, busy], clock.device)
    alone_ms, busy_ms = table[0].median().item(), table[1].median().item()
    fraction = min(0.9, max(0.0, 1.0 - alone_ms / busy_ms)) if busy_ms > 0 else 0.0
    return {"fraction": round(fraction, 4), "backward_alone_ms": round(alone_ms, 4),
            "backward_with_traffic_ms": round(busy_ms, 4)}


SMALL_COLLECTIVE_BYTES = 4096  # latency-bound at every link speed worth profiling
IDLE_S = 0.25  # how long the small collectives run beside an idle main thread, per round
# The executor issues a group's collectives one at a time, with hooks, encodes and
# decodes between them, so gloo's threads sleep between its collectives and must wake
# on cores the backward pass keeps busy; the collective sweeps time them back to back
# (benchmarks/busy_collectives.py, a 4 KB allreduce on loopback: mean 1.5-1.8 ms back
# to back beside an idle rank, 2.6-3.0 ms 2 ms apart beside matrix products).
BUSY_PAUSE_S = 0.002


def measure_busy_collectives(ddp, workload, batch, optimizer, clock, group, rounds: int = 2,
                             per_round: int = 4) -> dict:
    """How much longer a small collective takes in the executor's conditions than in the
    sweep's (CPU jobs: gloo's threads and the executor's share the cores with the
    backward pass): small allreduces on a thread, back to back while the main thread
    sleeps (as the sweep times them), then ``BUSY_PAUSE_S`` apart while it runs
    compute-only iterations. ``busy_collective_ms`` = the difference of the means
    (slowest rank), never negative. Means, not medians: beside compute most collectives
    finish as fast as alone and some wait milliseconds for a core (the same benchmark:
    medians 0.6-0.8 ms in both, 90th percentiles 4.0-4.2 and 7.7-9.3 ms), and a group pays the
    mean."""
    alone: list[float] = []
    busy: list[float] = []
    for _ in range(rounds):
        traffic = _BackgroundTraffic(group, clock.device, SMALL_COLLECTIVE_BYTES)
        time.sleep(IDLE_S)
        traffic.stop()
        alone += traffic.times_s[1:]  # the first may have waited for the other rank
        traffic = _BackgroundTraffic(group, clock.device, SMALL_COLLECTIVE_BYTES, BUSY_PAUSE_S)
        for _ in range(per_round):
            _one_iteration(ddp, workload, batch, optimizer, clock, True)
        traffic.stop()
        busy += traffic.times_s[1:-1]  # the last one ran after the iterations
    means = torch.tensor([statistics.fmean(alone or [0.0]), statistics.fmean(busy or [0.0])],
                         dtype=torch.float64)
    dist.all_reduce(means, op=dist.ReduceOp.MAX)
    alone_ms, busy_ms = (1000.0 * float(value) for value in means)
    return {"collective_alone_ms": round(alone_ms, 4), "collective_busy_ms": round(busy_ms, 4),
            "busy_collective_ms": round(max(0.0, busy_ms - alone_ms), 4)}


def measure_training(workload: Workload, device: torch.device, settings: TrainingSettings,
                     progress=None, intra_group=None) -> tuple[dict, pd.DataFrame, dict]:
    """Return ``(times, tensors, interference)``: statistics of each phase, one row per
    parameter in gradient-ready order (name, shape, numel, dtype, bytes, ready_ms,
    bucket), and :func:`measure_interference`'s result for traffic over the whole
    world; with ``intra_group`` (several nodes of several ranks) also its
    ``intra_fraction``, for traffic inside a node only (loopback or NVLink, which
    can take far more of the compute than a slow link between nodes); on the CPU
    also :func:`measure_busy_collectives`'s figures."""
    model = workload.model.to(device)
    clock = Clock(device)
    batch = to_device(workload.make_batch(settings.batch_size), device)
    optimizer = workload.make_optimizer(model.parameters())  # the recipe's: its step is timed

    ddp = wrap(model, device, settings.bucket_cap_mb)
    recorder = _ReadyRecorder(model, clock)
    compute, with_ddp, ready, names = _iterate(ddp, workload, batch, optimizer, clock, settings,
                                               recorder, progress)
    recorder.remove()
    world = new_group(list(range(dist.get_world_size())))
    interference = measure_interference(ddp, workload, batch, optimizer, clock, world)
    if device.type == "cpu":  # on a GPU the backward's compute is the device's
        interference.update(measure_busy_collectives(ddp, workload, batch, optimizer, clock,
                                                     world))
    if intra_group is not None:
        inside = measure_interference(ddp, workload, batch, optimizer, clock, intra_group)
        interference["intra_fraction"] = inside["fraction"]
    del ddp
    gc.collect()
    buckets = _record_buckets(model, device, workload, batch, optimizer, settings)

    compute_t = _reduce_max(compute, device)
    ddp_t = _reduce_max(with_ddp, device)
    ready_t = _reduce_max(ready, device)
    times = {
        "forward": summarize(ddp_t[:, 0].tolist()),
        "backward": summarize(ddp_t[:, 1].tolist()),
        "optimizer": summarize(ddp_t[:, 2].tolist()),
        "iteration": summarize(ddp_t[:, 3].tolist()),
        "forward_compute": summarize(compute_t[:, 0].tolist()),
        "backward_compute": summarize(compute_t[:, 1].tolist()),
        "optimizer_compute": summarize(compute_t[:, 2].tolist()),
        "iteration_compute": summarize(compute_t[:, 3].tolist()),
    }
    params = dict(model.named_parameters())
    unbucketed = [name for name in names if name not in buckets]
    if unbucketed:  # DDP buckets every parameter that gets a gradient
        raise BytecompError(f"parameter {unbucketed[0]} was in none of DDP's buckets")
    ready_ms = ready_t.median(dim=0).values.tolist()
    order = {name: index for index, name in enumerate(params)}
    rows = []
    for name, offset in zip(names, ready_ms):
        param = params[name]
        rows.append({
            "name": name, "shape": shape_text(param.shape), "numel": param.numel(),
            "dtype": str(param.dtype).replace("torch.", ""),
            "bytes": param.numel() * param.element_size(),
            "ready_ms": round(offset, 4), "bucket": buckets[name],
        })
    # Ready order: by median ready time; ties go to the later parameter (reverse order).
    rows.sort(key=lambda row: (row["ready_ms"], -order[row["name"]]))
    return times, pd.DataFrame(rows), interference
