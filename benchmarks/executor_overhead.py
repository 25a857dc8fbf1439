"""Overhead of the executor against hand-written DDP hooks, measured side by side.

On spawned gloo ranks, one process group, one model per configuration (same
initial weights), iterations interleaved round-robin so that noise hits every
configuration alike (every other round in reverse order); per configuration
the median iteration time (forward,
backward with communication, optimizer; after a barrier; slowest rank):

* DDP's built-in allreduce vs an all-fp32 bytecomp plan (which
  ``apply_plan`` leaves to DDP's own allreduce, registering no hook), and
  PyTorch's own Python ``allreduce_hook`` vs the same plan forced through
  bytecomp's hook (``native=False``): a hook must average the bucket in an
  extra pass, which DDP's built-in path fuses into its gradient copy, so the
  second pair isolates the hook's own overhead;
* PyTorch's ``fp16_compress_hook`` vs a bytecomp plan with fp16 on every tensor
  (which ``apply_plan`` hands to that very hook), and vs the same plan forced
  through bytecomp's hook;
* a minimal hand-written top-k hook (bytecomp's top-k compressor with error
  feedback, values and indices allgathered asynchronously) vs a bytecomp plan
  with the same top-k on every tensor;
* what an adaptive plan's controller costs per step: a PowerSGD plan (rank 4,
  every tensor) vs the same with its gain metered (``measure_gain``: two
  squared norms per group), and vs the same as the top level of an adaptive
  plan pinned there (metering, and each step the controller's allreduce of
  three numbers on its own gloo group and its decision), and vs the same
  agreeing on ten steps' measurements in one allreduce (``agree_every: 10``);
* an adaptive plan at its fp32 level (level 0 of the same ladder, agreeing every
  ten steps) vs PyTorch's ``allreduce_hook`` (an adaptive plan keeps its hook
  at every level, so a hook is its reference, not DDP's built-in allreduce).
* what a verified plan's runtime trial costs per step: the PowerSGD plan vs a finalists
  plan trialling two copies of it through every measured step (it switches level every
  step, handing the residuals over, and agrees every step's time);
* PyTorch's ``powerSGD_hook`` (rank 4, one bucket: a plan that is that hook, which
  ``apply_plan`` hands to it) vs the same plan forced through bytecomp's hook, where
  the rounds run on the FIFO thread and the products are bytecomp's own;
* what a group costs: an EF-signSGD plan (allgather, every tensor, one group
  per bucket) vs the same compressor with one group per tensor (the same
  bytes and compression, more exchanges: the executor's cost of each group).

Plans group tensors by DDP's buckets in the gradient-ready order recorded from
one backward pass, as plans made from a profile do. Target: each bytecomp
configuration within 2% of its reference (median over trials of the per-trial
difference). The first pair measures the same code twice (a plan of fp32
allreduce everywhere is DDP's own allreduce): its spread is the noise floor.

On a GPU (``--device cuda``) each rank takes a GPU of its own, on NCCL (with gloo
for the host-side exchanges, as bytecomp's own CUDA jobs run), and an iteration ends
when the GPU has finished it (a synchronize before the clock stops).

    python benchmarks/executor_overhead.py [--model cnn] [--nproc 2] [--rounds 40]
        [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.comm.compat import all_gather_flat
from bytecomp.compress import from_spec
from bytecomp.compress.lowrank import powersgd_compresses
from bytecomp.launch import backend_for, free_port
from bytecomp.plan_file import FINALISTS, ladder_for_model, plan_for_model, plan_from_dict
from bytecomp.plan_types import Adaptive, Option
from bytecomp.training.workloads import load_workload

TOPK = "topk:ratio=0.01"
POWERSGD = "powersgd:rank=4"
EFSIGN = "efsignsgd"
ONE_BUCKET_MB = 1024.0  # PyTorch's powerSGD_hook is a plan only where DDP makes one bucket


def topk_hook(state, bucket):
    """A minimal top-k hook: compress the bucket, allgather values and indices, average."""
    buffer = bucket.buffer()
    compressor = state["compressor"]
    memory = state["memory"].setdefault(bucket.index(), {})
    (values, indices), ctx = compressor.compress(buffer, memory)
    world = dist.get_world_size()
    all_values = values.new_empty(world * values.numel())
    all_indices = indices.new_empty(world * indices.numel())
    futures = [all_gather_flat(all_values, values, async_op=True).get_future(),
               all_gather_flat(all_indices, indices, async_op=True).get_future()]

    def decode(_):
        out = torch.zeros_like(buffer)
        out.index_add_(0, all_indices.long(), all_values)
        return out.div_(world)

    return torch.futures.collect_all(futures).then(decode)


def ready_order(model) -> list[str]:
    """The order gradients become ready, recorded from one backward pass."""
    order = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, n=n: order.append(n))
               for n, p in model.named_parameters()]
    return order, handles


def configurations(model, world: int, cap_mb: float, order: list[str], trial_steps: int):
    def plan(spec, scheme):
        option = Option(spec, "device", scheme)
        return plan_for_model(model, lambda n, p: option, world, bucket_cap_mb=cap_mb,
                              ready_order=order)

    powersgd = Option(POWERSGD, "device", "allreduce")
    # level 1 predicted far faster (timing: predicted) and no threshold: it never leaves
    def pinned(agree_every: int, level: int = 1):
        # the level pinned is predicted far faster (timing: predicted; no threshold)
        return ladder_for_model(model, [lambda n, p: Option(), lambda n, p: powersgd], world,
                                Adaptive("powersgd", threshold=0.0, timing="predicted",
                                         start=level, agree_every=agree_every),
                                bucket_cap_mb=cap_mb,
                                predicted_ms=[1000.0, 1.0] if level else [1.0, 1000.0],
                                ready_order=order)
    def in_trial():
        # a verified plan's runtime trial (bytecomp.runtime.trial) between two copies of the
        # PowerSGD plan, every measured step inside it: what the trial itself costs (the
        # level switch each step, its residuals handed over, the agreed step times)
        return ladder_for_model(model, [lambda n, p: Option(), lambda n, p: powersgd,
                                        lambda n, p: powersgd], world,
                                Adaptive(FINALISTS, threshold=0.0, start=1, agree_every=10,
                                         trial=(1, 2), trial_steps=trial_steps,
                                         trial_warmup=0),
                                bucket_cap_mb=cap_mb, ready_order=order)

    def as_powersgd_hook():
        rank = from_spec(POWERSGD).values["rank"]
        return plan_for_model(
            model, lambda n, p: powersgd if powersgd_compresses(tuple(p.shape), rank)
            else Option(), world, bucket_cap_mb=ONE_BUCKET_MB, ready_order=order)

    # (name, hook, plan, native, measure_gain): each odd row is compared with the row above
    return [
        ("DDP built-in allreduce", None, None, True, False),
        ("bytecomp all-fp32 plan", None, plan("none", "allreduce"), True, False),
        ("PyTorch allreduce_hook", default_hooks.allreduce_hook, None, True, False),
        ("bytecomp all-fp32 plan, through the hook", None, plan("none", "allreduce"), False,
         False),
        ("PyTorch fp16_compress_hook", default_hooks.fp16_compress_hook, None, True, False),
        ("bytecomp fp16 plan", None, plan("fp16", "allreduce"), True, False),
        ("PyTorch fp16_compress_hook (again)", default_hooks.fp16_compress_hook, None, True,
         False),
        ("bytecomp fp16 plan, through the hook", None, plan("fp16", "allreduce"), False, False),
        ("hand-written top-k hook", topk_hook, None, True, False),
        ("bytecomp top-k plan", None, plan(TOPK, "allgather"), True, False),
        ("bytecomp PowerSGD plan", None, plan(POWERSGD, "allreduce"), True, False),
        ("the same, gain metered", None, plan(POWERSGD, "allreduce"), True, True),
        ("bytecomp PowerSGD plan (again)", None, plan(POWERSGD, "allreduce"), True, False),
        ("the same, an adaptive plan's level", None, pinned(1), True, False),
        ("bytecomp PowerSGD plan (third)", None, plan(POWERSGD, "allreduce"), True, False),
        ("the same, agreeing every 10 steps", None, pinned(10), True, False),
        ("bytecomp PowerSGD plan (fourth)", None, plan(POWERSGD, "allreduce"), True, False),
        ("the same, two copies of it in a runtime trial", None, in_trial(), True, False),
        ("PyTorch allreduce_hook (again)", default_hooks.allreduce_hook, None, True, False),
        ("an adaptive plan at its fp32 level", None, pinned(10, level=0), True, False),
        ("PyTorch powerSGD_hook, one bucket", None, as_powersgd_hook(), True, False),
        ("the same plan, through bytecomp's hook", None, as_powersgd_hook(), False, False),
        ("bytecomp EF-signSGD plan", None, plan(EFSIGN, "allgather"), True, False),
        ("the same, one group per tensor", None, one_group_each(plan(EFSIGN, "allgather")),
         True, False),
    ]


def one_group_each(plan):
    """``plan`` with every tensor in a group of its own."""
    data = plan.to_dict()
    for index, entry in enumerate(data["tensors"]):
        entry["group"] = index
    return plan_from_dict(data, "<one group per tensor>")


def to_device(batch, device: torch.device):
    """A batch (a tensor or a tuple of them) on ``device``."""
    if isinstance(batch, tuple):
        return tuple(to_device(part, device) for part in batch)
    return batch.to(device)


def finish(device: torch.device) -> None:
    """Wait for the device's queued work (an iteration's time includes its GPU time)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_main(rank, world, port, model_spec, rounds, warmup, cap_mb, device_type, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device_type), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    workload = load_workload(model_spec)
    workload.model.to(device)
    inputs, target = to_device(workload.make_batch(workload.batch_size), device)
    order, handles = ready_order(workload.model)
    workload.loss(workload.model(*inputs if isinstance(inputs, tuple) else (inputs,)),
                  target).backward()
    workload.model.zero_grad(set_to_none=True)
    for handle in handles:
        handle.remove()
    runs = []
    for name, hook, plan, native, meter in configurations(workload.model, world, cap_mb,
                                                          order, warmup + rounds):
        model = copy.deepcopy(workload.model)
        ddp = DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb
                                      if plan is not None else cap_mb)
        if hook is topk_hook:
            ddp.register_comm_hook({"compressor": from_spec(TOPK), "memory": {}}, hook)
        elif hook is not None:
            ddp.register_comm_hook(None, hook)
        executor = bytecomp.apply_plan(ddp, plan, native=native, measure_gain=meter) \
            if plan is not None else None
        if name.startswith("PyTorch powerSGD_hook"):
            assert executor is not None and executor.powersgd_state is not None, \
                "the plan should have been handed to PyTorch's powerSGD_hook"
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        runs.append((name, ddp, optimizer, executor, []))
    for round_number in range(warmup + rounds):
        # every other round in reverse, so that no configuration always follows another
        order = runs if round_number % 2 == 0 else list(reversed(runs))
        for _, ddp, optimizer, _, times in order:
            finish(device)
            dist.barrier()
            start = time.perf_counter()
            workload.loss(ddp(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            finish(device)
            elapsed = time.perf_counter() - start
            if round_number >= warmup:
                times.append(elapsed)
    table = torch.tensor([times for *_, times in runs], dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.put([(name, 1000 * statistics.median(row.tolist()))
                     for (name, *_), row in zip(runs, table)])
    for *_, executor, _ in runs:
        if executor is not None:
            executor.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--nproc", type=int,
                        help="ranks (default: 2 on the CPU, every GPU on CUDA)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bucket-cap-mb", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=5,
                        help="independent runs; the table gives the median of each figure")
    parser.add_argument("--markdown", help="append the table as markdown here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("executor_overhead.py: --device cuda needs a CUDA GPU")
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    args.nproc = args.nproc or gpus or 2
    if args.device == "cuda" and args.nproc > gpus:
        raise SystemExit(f"executor_overhead.py: {args.nproc} ranks need {args.nproc} GPUs "
                         f"(NCCL puts one rank on a GPU); this machine has {gpus}")
    context = mp.get_context("spawn")
    trials = []
    for _ in range(args.trials):
        results = context.Queue()
        mp.start_processes(rank_main, args=(args.nproc, free_port(), args.model, args.rounds,
                                            args.warmup, args.bucket_cap_mb, args.device,
                                            results),
                           nprocs=args.nproc, start_method="spawn")
        trials.append(results.get())
    ranks = f"{args.nproc} gloo ranks" if args.device == "cpu" else \
        f"{args.nproc} NCCL rank(s) on {torch.cuda.get_device_name(0)}"
    lines = [f"{args.model} on {ranks}, bucket cap {args.bucket_cap_mb:g} MB; "
             f"each trial: median of {args.rounds} interleaved iterations; median of "
             f"{args.trials} trials:", "",
             "| configuration | iteration ms | vs reference | per trial |", "|---|---|---|---|"]
    print(lines[0])
    for index, name in enumerate(name for name, _ in trials[0]):
        milliseconds = statistics.median(trial[index][1] for trial in trials)
        if index % 2:
            per_trial = [100 * (trial[index][1] / trial[index - 1][1] - 1) for trial in trials]
            ratio = f"{statistics.median(per_trial):+.1f}%"
            spread = ", ".join(f"{value:+.1f}%" for value in per_trial)
        else:
            ratio, spread = "reference", ""
        print(f"  {name:30s} {milliseconds:9.2f} ms   {ratio:>10s}   {spread}")
        lines.append(f"| {name} | {milliseconds:.2f} | {ratio} | {spread} |")
    if args.markdown:
        with open(args.markdown, "a") as handle:
            handle.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
