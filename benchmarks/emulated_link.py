"""What the emulated link's token bucket does to gloo allreduces, per rate and bucket depth.

A real link sends a message in size / rate however long it was idle; tc's token
bucket (tbf) lets a sender that was idle send its depth at once. For each rate
and depth, 2 nodes x 1 rank under ``bytecomp emulate --burst``:

* the bus bandwidth of a 16 MiB allreduce, as a share of the rate (a bucket too
  shallow for this machine's timers loses throughput);
* a 160 KB allreduce back to back and after 30 ms idle, against the line-rate
  time of the bytes each rank sends (2 (n-1)/n x size): a deep bucket makes the
  one after a pause nearly free, which no real link does.

Medians of 8 (16 MiB) and 20 (160 KB) repetitions. Needs root.

    sudo python benchmarks/emulated_link.py --rates 100mbit 1gbit --bursts 256kb 32kb auto
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [(16 << 20, 0.0, 8), (160_000, 0.0, 20), (160_000, 0.030, 20)]


def rank_program(report: str) -> None:
    """One rank: time the CASES and write rank 0's medians (slowest rank) to ``report``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    medians = []
    for nbytes, idle_s, repeats in CASES:
        tensor = torch.ones(nbytes // 4)
        dist.all_reduce(tensor)
        times = []
        for _ in range(repeats):
            dist.barrier()
            if idle_s:
                time.sleep(idle_s)
                dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        medians.append(1000 * statistics.median(slowest.tolist()))
    if dist.get_rank() == 0:
        Path(report).write_text(json.dumps(medians))
    dist.destroy_process_group()


def measure(rate: str, burst: str) -> list[float]:
    with tempfile.TemporaryDirectory() as scratch:
        os.chmod(scratch, 0o755)
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "bytecomp", "emulate", "--nodes", "2",
                   "--bandwidth", rate, *(["--burst", burst] if burst != "auto" else []), "--",
                   sys.executable, __file__, "--rank-report", str(report)]
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
        return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    parser.add_argument("--bursts", nargs="+", default=["256kb", "64kb", "32kb", "auto"])
    parser.add_argument("--rank-report", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_report:
        rank_program(args.rank_report)
        return
    from bytecomp.emulate.netns import parse_rate, parse_size, tbf_burst_bytes

    print(f"load: {os.getloadavg()}")
    print("| rate | bucket | 16 MiB share of rate | 160 KB back to back | 160 KB after 30 ms "
          "idle | line-rate 160 KB |")
    print("|---|---|---|---|---|---|")
    for rate in args.rates:
        bps = parse_rate(rate)
        for burst in args.bursts:
            size = tbf_burst_bytes(bps) if burst == "auto" else parse_size(burst)
            big, small, idle = measure(rate, burst)
            share = (16 << 20) * 8 / (big / 1000) / bps  # 2 ranks: bus bytes = size
            line = 160_000 * 8 / bps * 1000
            print(f"| {rate} | {size / 1024:.0f} KiB{' (auto)' if burst == 'auto' else ''} | "
                  f"{100 * share:.1f}% | {small:.2f} ms | {idle:.2f} ms | {line:.2f} ms |",
                  flush=True)
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
