"""How long a small gloo allreduce takes on a thread, back to back or a pause apart,
while the rank's main thread sleeps, multiplies matrices, or sleeps beside a busy-loop
process of its own (two local ranks, CPU).

The profile's ``interference.busy_collective_ms`` compares the first row with the
fourth (back to back beside an idle rank, as the collective sweep times them, against
2 ms apart beside compute, as the executor issues them): see docs/model.md's timeline.
Per condition it prints the median, mean and 90th percentile over every allreduce of
the rank whose mean is the largest, and the load before and after.

    python benchmarks/busy_collectives.py [--seconds 1] [--rounds 3] [--dim 384]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from machine_load import load  # noqa: E402

from bytecomp.launch import spawn  # noqa: E402
from bytecomp.profiler.iteration_times import (  # noqa: E402
    BUSY_PAUSE_S,
    SMALL_COLLECTIVE_BYTES,
    _BackgroundTraffic,
)

CONDITIONS = [  # (name, pause between allreduces in s, what the main thread does)
    ("back to back, idle rank", 0.0, "sleep"),
    ("back to back, rank computing", 0.0, "compute"),
    (f"{BUSY_PAUSE_S * 1000:g} ms apart, idle rank", BUSY_PAUSE_S, "sleep"),
    (f"{BUSY_PAUSE_S * 1000:g} ms apart, rank computing", BUSY_PAUSE_S, "compute"),
    ("back to back, idle rank beside a busy process", 0.0, "hog"),
]


def one_condition(group, pause_s: float, main: str, seconds: float, dim: int) -> list[float]:
    """Allreduce times (ms) of one condition on this rank (collective)."""
    hog = None
    if main == "hog":
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)
    a = torch.randn(dim, dim)
    dist.barrier()
    traffic = _BackgroundTraffic(group, torch.device("cpu"), SMALL_COLLECTIVE_BYTES, pause_s)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if main == "compute":
            torch.mm(a, a)
        else:
            time.sleep(0.01)
    traffic.stop()
    if hog is not None:
        hog.kill()
        hog.wait()
    return [1000 * t for t in traffic.times_s[1:-1]]  # the first may wait for the peer


def rank_main(seconds: float, rounds: int, dim: int) -> None:
    group = dist.new_group([0, 1])
    samples: dict[str, list[float]] = {name: [] for name, _, _ in CONDITIONS}
    for _ in range(rounds):  # interleaved, so that drift hits every condition alike
        for name, pause_s, main in CONDITIONS:
            samples[name] += one_condition(group, pause_s, main, seconds, dim)
    rows = []
    for name, times in samples.items():
        values = torch.tensor(times or [0.0], dtype=torch.float64)
        stats = torch.stack([values.mean(), values.median(), values.quantile(0.9)])
        everyone = [torch.zeros(3, dtype=torch.float64) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, stats)
        rows.append((name, len(times), max(everyone, key=lambda s: float(s[0]))))
    if dist.get_rank() == 0:
        print("| condition | allreduces | median ms | mean ms | p90 ms |\n|---|---|---|---|---|")
        for name, count, (mean, median, p90) in rows:
            print(f"| {name} | {count} | {median:.2f} | {mean:.2f} | {p90:.2f} |")
        busy = float(rows[3][2][0] - rows[0][2][0])
        print(f"\nbusy_collective_ms as the profile computes it (row 4 - row 1, means): "
              f"{max(0.0, busy):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per condition and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dim", type=int, default=384, help="the matrices' size")
    args = parser.parse_args()
    print(f"{SMALL_COLLECTIVE_BYTES} B allreduces, 2 gloo ranks; before: {load()}")
    spawn(rank_main, (args.seconds, args.rounds, args.dim), nproc=2, backend="gloo",
          timeout_s=120)
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
