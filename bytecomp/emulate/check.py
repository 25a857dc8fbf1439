"""The rank program of ``bytecomp emulate --check``: time a float32 allreduce.

Bus bandwidth as nccl-tests defines it: size / time x 2 (n - 1) / n.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=float, default=16.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    tensor = torch.ones(int(args.size_mb * (1 << 20)) // 4)
    nbytes = tensor.numel() * 4
    dist.all_reduce(tensor)  # connections and first touch
    times = []
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = statistics.median(slowest.tolist())
    ranks = dist.get_world_size()
    busbw = nbytes / seconds * 2 * (ranks - 1) / ranks
    if dist.get_rank() == 0:
        with open(args.report, "w") as out:
            json.dump({"bytes": nbytes, "ranks": ranks, "time_ms": 1000 * seconds,
                       "achieved_gbps": busbw * 8 / 1e9}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
