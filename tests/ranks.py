"""Spawn real gloo ranks on localhost for multi-rank tests.

``run_ranks(fn, world_size, *args)`` calls ``fn(rank, world_size, *args)`` on
``world_size`` processes with a gloo process group up, and returns the per-rank
results. A failing rank fails the test with its traceback; the others are
stopped, so nothing hangs.

The ranks stay up for the next call with the same world size and ``env``: a
spawn costs seconds (every rank imports torch), a call on live ranks next to
nothing. Each call gets a fresh torch seed and the caller's ``sys.path``, as a
new process would; after any failure the ranks are stopped, and the next call
spawns new ones, so no call runs on a broken group.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import multiprocessing
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from multiprocessing.reduction import ForkingPickler


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank, world_size, port, env, tasks, results):
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        for task in iter(tasks.get, None):
            try:
                path, fn, args = pickle.loads(task)
                sys.path[:] = path
                torch.seed()
                results.put((rank, True, fn(rank, world_size, *args)))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
            finally:
                _release_groups_left(dist)
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    results.close()
    results.join_thread()
    os._exit(0)  # the results are sent: skip the interpreter's teardown (most of a second)


def _release_groups_left(dist) -> None:
    """Destroy the groups a call left (an executor that was never closed): every idle
    gloo group keeps a thread polling its sockets, and hundreds of them, left by one
    test after another, took about a core from the tests that followed."""
    default = dist.distributed_c10d._get_default_group()
    for group in list(dist.distributed_c10d._world.pg_map):
        if group is not default:
            dist.destroy_process_group(group)
    gc.collect()


class _Ranks:
    """``world_size`` live ranks, each waiting for the next function to run."""

    def __init__(self, world_size: int, env: dict) -> None:
        context = multiprocessing.get_context("spawn")
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(world_size)]
        port = free_port()
        self.processes = [
            context.Process(target=_rank_main, daemon=True,
                            args=(rank, world_size, port, env, self.tasks[rank], self.results))
            for rank in range(world_size)
        ]
        for process in self.processes:
            process.start()

    def alive(self) -> bool:
        return all(process.is_alive() for process in self.processes)

    def call(self, fn, args: tuple, timeout: float) -> list:
        """``fn(rank, world_size, *args)`` on every rank; on any failure, stop the ranks."""
        task = bytes(ForkingPickler.dumps((list(sys.path), fn, args)))  # fails here, not there
        try:
            for tasks in self.tasks:
                tasks.put(task)
            return self._collect(timeout)
        except BaseException:
            self.stop(wait=0)
            raise

    def _collect(self, timeout: float) -> list:
        world_size = len(self.processes)
        values: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        while len(values) < world_size:
            try:
                rank, ok, value = self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.processes) if p.exitcode is not None]
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks timed out after {timeout} s") from None
                if not dead:
                    continue
                try:  # its own report may still be in flight
                    rank, ok, value = self.results.get(timeout=1)
                except queue.Empty:
                    raise AssertionError(f"rank {dead[0]} died with exit code "
                                         f"{self.processes[dead[0]].exitcode}") from None
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            values[rank] = value
        return [values[rank] for rank in range(world_size)]

    def stop(self, wait: float = 5) -> None:
        """Let idle ranks leave the group (``wait`` seconds), then end the rest."""
        if wait:
            for tasks in self.tasks:
                tasks.put(None)
        for process in self.processes:
            process.join(timeout=wait)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


_live: dict[tuple, _Ranks] = {}


@atexit.register
def _stop_all() -> None:
    while _live:
        _live.popitem()[1].stop()


def run_ranks(fn, world_size: int, *args, timeout: float = 300, env: dict | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks."""
    key = (world_size, tuple(sorted((env or {}).items())))
    ranks = _live.pop(key, None)
    if ranks is not None and not ranks.alive():
        ranks.stop(wait=0)
        ranks = None
    if ranks is None:
        ranks = _Ranks(world_size, dict(env or {}))
    values = ranks.call(fn, args, timeout)
    _live[key] = ranks
    return values
