"""Spawn real gloo ranks on localhost for multi-rank tests.

``run_ranks(fn, world_size, *args)`` starts ``world_size`` processes, initializes
a gloo process group on a free port in each, calls ``fn(rank, world_size,
*args)`` and returns the per-rank results. A failing rank fails the test with
its traceback; the others are stopped, so nothing hangs.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import socket
import time
import traceback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(fn, rank, world_size, port, args, results, env):
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args, timeout: float = 300, env: dict | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank_main, args=(fn, rank, world_size, port, args, results,
                                                 dict(env or {})), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    values: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(processes)
                        if p.exitcode not in (None, 0) and r not in values]
                if dead:
                    raise AssertionError(f"rank {dead[0]} died with exit code "
                                         f"{processes[dead[0]].exitcode}") from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks timed out after {timeout} s") from None
                continue
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            values[rank] = value
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    return [values[rank] for rank in range(world_size)]
