"""Group by group, a plan's simulated iteration against a measured one: where the
model's step time parts from the executor's.

Every rank trains the profile's model with the plan (its recipe, its batch size, the
plan's bucket cap) for ``--warmup`` steps, then records ``--steps`` steps with
``Executor.record_group_times``: when each group was launched (its last gradient
arrived), encoded, put on the wire, taken off it and written back, in ms after the
step's first bucket. Rank 0 writes the medians beside the same times of
``bytecomp.simulate`` (both clocks start at the first group's launch), and per group:
encode, wire (sent to received: a collective issued asynchronously waits there behind
the ones before it, as on the simulated channel) and decode durations, and when it was
done. The step itself is timed too, against the simulated iteration.

Run it on the ranks the plan is for, as training runs (under ``bytecomp emulate`` for
an emulated link, needs root; under torchrun on loopback)::

    sudo bytecomp emulate --nodes 2 --bandwidth 1gbit -- python benchmarks/group_times.py \\
        PROFILE PLAN [--model SPEC] [--steps 30] [--warmup 10] [--out FILE.csv]
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/group_times.py PROFILE PLAN

``--model``: the profile's ``pkg.module:factory``, where it is one (a profile file never
makes bytecomp run code; this folder is on the path, so ``bench_factories:charlstm``
works).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import pandas as pd
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.model_spec import allowed_model
from bytecomp.profiler.iteration_times import to_device
from bytecomp.training.workloads import load_workload

PHASES = ("launched", "encoded", "sent", "received", "done")


def measure(profile, plan, model: str | None, steps: int, warmup: int):
    """This rank's recorded group times (a DataFrame) and its median step ms."""
    spec = allowed_model(profile.meta["model"].get("spec"), model, str(profile.path),
                         "name it with --model")
    workload = load_workload(spec, seed=0, optimizer=profile.recipe_optimizer())
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=plan.bucket_cap_mb)
    optimizer = workload.make_optimizer(ddp.parameters())
    batch_size = int(profile.meta["batch_size"])
    step_ms = []
    with bytecomp.apply_plan(ddp, plan, native=False) as executor:
        for step in range(warmup + steps):
            if step == warmup:
                recorder = executor.record_group_times(steps)
            inputs, target = to_device(workload.make_batch(batch_size), torch.device("cpu"))
            dist.barrier()  # every rank starts the step together, as bench times it
            started = time.perf_counter()
            workload.loss(ddp(*inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step >= warmup:
                step_ms.append(1000 * (time.perf_counter() - started))
    return pd.DataFrame(recorder.rows), statistics.median(step_ms)


def relative(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The phases' times after the step's first launch (per ``by``)."""
    table = table.copy()
    first = table.groupby(by)["launched_ms"].transform("min")
    for phase in PHASES:
        table[f"{phase}_ms"] -= first
    return table


def durations(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"encode_ms": table["encoded_ms"] - table["launched_ms"],
                         "wire_ms": table["received_ms"] - table["sent_ms"],
                         "decode_ms": table["done_ms"] - table["received_ms"],
                         "done_ms": table["done_ms"]})


def compare(measured: pd.DataFrame, simulation, plan) -> pd.DataFrame:
    """Per plan group: the simulated and the measured (median over steps) durations."""
    group_of = {entry.name: entry.group for entry in plan.entries}
    simulated = simulation.groups
    simulated["plan_group"] = [group_of[names[0]] for names in simulated["tensors"]]
    simulated["step"] = 0
    predicted = durations(relative(simulated, ["step"])).set_index(simulated["plan_group"])
    runs = relative(measured, ["step"])
    observed = durations(runs).groupby(runs["group"]).median()
    rows = []
    for group, strategy in zip(simulated["plan_group"], simulated["strategy"]):
        row = {"group": group, "strategy": strategy}
        for column in ("encode_ms", "wire_ms", "decode_ms", "done_ms"):
            row[f"predicted_{column}"] = predicted.loc[group, column]
            row[f"measured_{column}"] = observed.loc[group, column] \
                if group in observed.index else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("plan")
    parser.add_argument("--model", help="the profile's pkg.module:factory, where it is one")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", help="write the comparison here (CSV)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 2:
        sys.exit("group_times.py: --steps must be at least 1 and --warmup at least 2")
    profile = bytecomp.load_profile(args.profile)
    plan = bytecomp.load_plan(args.plan)
    level = None
    if plan.levels:  # an adaptive plan: its start level, as training starts
        level = plan.adaptive.start if plan.adaptive is not None else 0
        plan = plan.level(level)
    dist.init_process_group("gloo")
    try:
        measured, step_ms = measure(profile, plan, args.model, args.steps, args.warmup)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    simulation = bytecomp.simulate(args.profile, args.plan, level=level)
    table = compare(measured, simulation, plan)
    pd.set_option("display.width", 200)
    print(f"step: measured {step_ms:.2f} ms (median of {args.steps}), simulated "
          f"{simulation.iteration_ms:.2f} ms; {len(table)} groups, times in ms after the "
          f"step's first launch:")
    print(table.round(2).to_string(index=False))
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
