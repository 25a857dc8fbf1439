"""Does a training step's time depend on the strategy that stepped before it?

The convergence bench (``bytecomp bench --train-steps``) and the profile's probe
train every strategy interleaved step by step. This trains copies of two of
PyTorch's own hooks, the fp16 hook and the PowerSGD hook (rank 4), the same
strategy several times over, from the same weights on the same batches, through
the same loop (:func:`bytecomp.training.convergence.train_curves`), once with the
strategies in a fixed order every step and once in each step's own order (the
default), alternating ``--rounds`` times. Identical copies should take the same
time; for the fixed order it prints each copy's median step beside the strategy
before it, and for both orders the spread of the copies of each hook (slowest
median over fastest). Run it where the link matters, on the emulated cluster::

    sudo python -m bytecomp emulate --nodes 2 --bandwidth 100mbit -- \\
        python benchmarks/interleaving_order.py [--steps 100] [--rounds 2]

(without a launcher it spawns two local gloo ranks on loopback).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from machine_load import load  # noqa: E402

from bytecomp.launch import in_torchrun, run_job  # noqa: E402
from bytecomp.training.convergence import ConvergenceConfig, train_curves  # noqa: E402
from bytecomp.training.probe import Trainee  # noqa: E402
from bytecomp.training.workloads import load_workload  # noqa: E402

WORKLOAD = "transformer:layers=2,width=128,heads=4,seq_len=64,vocab=256"
# each hook both after itself and after the other one
KINDS = ["fp16", "powersgd", "powersgd", "fp16", "fp16", "powersgd", "fp16", "powersgd"]
SKIP = 5  # first steps left out (PowerSGD's hook runs plain allreduce for two)


def trainee(workload, index: int, kind: str) -> Trainee:
    model = copy.deepcopy(workload.model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    if kind == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                       start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    return Trainee(f"{index}:{kind}", ddp, torch.optim.Adam(model.parameters(), lr=1e-3))


def one_run(workload, steps: int, shuffle: bool) -> list[float]:
    """Each copy's median step (ms, the slowest rank's) over one training run."""
    torch.manual_seed(0)
    trainees = [trainee(workload, i, kind) for i, kind in enumerate(KINDS)]
    validation = workload.validation(8, 1)
    config = ConvergenceConfig(steps, steps, shuffle=shuffle)
    training = train_curves(trainees, workload, 8, torch.device("cpu"), config, validation)
    return [statistics.median(training.step_ms[t.name][SKIP:]) for t in trainees]


def spread(medians: list[float], kind: str) -> float:
    mine = [m for m, k in zip(medians, KINDS) if k == kind]
    return max(mine) / min(mine) - 1


def rank_main(steps: int, rounds: int, nodes: int, ranks_per_node: int) -> None:
    """Both orders, ``rounds`` times each; rank 0 prints the tables (the job's shape,
    which run_job passes, is not used: every rank trains every copy)."""
    workload = load_workload(WORKLOAD)
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    for _ in range(rounds):  # alternated, so that drift hits both orders alike
        for shuffle in (False, True):
            runs[shuffle].append(one_run(workload, steps, shuffle))
    if dist.get_rank() != 0:
        return
    print(f"\n{WORKLOAD}, {steps} steps a run, median step of each copy (ms)")
    print("| copy | after | " + " | ".join(f"fixed {r + 1}" for r in range(rounds)) + " | " +
          " | ".join(f"shuffled {r + 1}" for r in range(rounds)) + " |")
    print("|---|---|" + "---|" * (2 * rounds))
    for index, kind in enumerate(KINDS):
        cells = [f"{run[index]:.1f}" for run in runs[False] + runs[True]]
        print(f"| {index}: {kind} | {KINDS[index - 1]} | " + " | ".join(cells) + " |")
    for kind in ("fp16", "powersgd"):
        for shuffle, name in ((False, "fixed"), (True, "shuffled")):
            spreads = ", ".join(f"{100 * spread(run, kind):.1f}%" for run in runs[shuffle])
            print(f"{kind} copies, {name} order: slowest over fastest {spreads}")
    for kind in ("fp16", "powersgd"):
        same, other = [], []
        for run in runs[False]:
            for index, k in enumerate(KINDS):
                if k == kind:
                    (same if KINDS[index - 1] == kind else other).append(run[index])
        print(f"{kind}, fixed order: median after {kind} {statistics.median(same):.1f} ms, "
              f"after the other hook {statistics.median(other):.1f} ms "
              f"({100 * (statistics.median(other) / statistics.median(same) - 1):+.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps a run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each order")
    args = parser.parse_args()
    first = os.environ.get("RANK", "0") == "0"  # this launcher's rank 0, or no launcher
    if first:
        print(f"before: {load()}", flush=True)
    run_job(rank_main, (args.steps, args.rounds), None if in_torchrun() else 2, "gloo", 3600)
    if first:
        print(f"after: {load()}")

if __name__ == "__main__":
    main()
