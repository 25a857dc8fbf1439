"""Run a function on every rank: spawn local ranks, or join a torchrun job.

``run_on_ranks(fn, nproc, ...)``:

* under torchrun (``RANK`` and ``WORLD_SIZE`` set) it initializes the process
  group from the environment and calls ``fn`` on this rank;
* otherwise it spawns ``nproc`` local ranks on a free port (gloo on CPU, NCCL
  when ``cuda``), and waits. If any rank fails, the others are stopped at once
  and the failure is raised as one line; every collective also has a timeout,
  so nothing hangs.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import signal
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from bytecomp.errors import BytecompError


class RankFailed(BytecompError):
    """A rank raised or died; the message says which and why."""

    exit_code = 1


@dataclass(frozen=True)
class JobShape:
    world_size: int
    nodes: int
    ranks_per_node: int


def in_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_shape() -> JobShape:
    world = int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if per_node < 1 or world % per_node:
        raise BytecompError(f"LOCAL_WORLD_SIZE={per_node} does not divide WORLD_SIZE={world}")
    return JobShape(world, world // per_node, per_node)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_from_env(backend: str, timeout_s: float) -> None:
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))


def _one_line(error: BaseException) -> str:
    if isinstance(error, BytecompError):
        return str(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


def _rank_entry(fn, args, rank, nproc, port, backend, timeout_s, errors):
    def stop(_signum, _frame):
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, stop)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                      GROUP_RANK="0")
    try:
        init_from_env(backend, timeout_s)
        fn(*args)
        dist.barrier()
    except BaseException as error:  # reported to the parent, which stops the others
        if not isinstance(error, (SystemExit, KeyboardInterrupt)):
            details = traceback.format_exc() if os.environ.get("BYTECOMP_DEBUG") else ""
            errors.put((rank, _one_line(error), isinstance(error, BytecompError), details))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable, args: tuple, nproc: int, backend: str, timeout_s: float,
          on_stop: Callable[[], None] = lambda: None) -> None:
    """Run ``fn(*args)`` on ``nproc`` spawned ranks; raise if any of them fails."""
    if nproc < 1:
        raise BytecompError(f"--nproc must be at least 1, got {nproc}")
    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank_entry, daemon=True,
                                 args=(fn, args, rank, nproc, port, backend, timeout_s, errors))
                 for rank in range(nproc)]
    for process in processes:
        process.start()
    try:
        failure = _watch(processes, errors)
    except KeyboardInterrupt:
        _stop(processes)
        on_stop()
        raise
    if failure is not None:
        _stop(processes)
        on_stop()
        rank, message, user_error, details = failure
        if details:
            print(details)
        if user_error:
            raise BytecompError(message)
        raise RankFailed(f"rank {rank} failed: {message}")


def _watch(processes, errors):
    while True:
        try:
            return errors.get(timeout=0.2)
        except queue.Empty:
            pass
        codes = [p.exitcode for p in processes]
        if all(code == 0 for code in codes):
            return None
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                try:  # its own report may still be in flight
                    return errors.get(timeout=1.0)
                except queue.Empty:
                    return rank, f"exited with code {code}", False, ""


def _stop(processes) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def run_job(fn: Callable, args: tuple, nproc: int | None, backend: str, timeout_s: float,
            on_stop: Callable[[], None] = lambda: None) -> None:
    """``fn(*args, nodes, ranks_per_node)`` on every rank: this torchrun job's ranks, or
    ``nproc`` spawned local ranks (default 1)."""
    if in_torchrun():
        shape = torchrun_shape()
        if nproc is not None and nproc != shape.world_size:
            raise BytecompError(f"--nproc {nproc} differs from torchrun's WORLD_SIZE "
                                f"{shape.world_size}; leave --nproc out under torchrun")
        init_from_env(backend, timeout_s)
        try:
            fn(*args, shape.nodes, shape.ranks_per_node)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        return
    nproc = 1 if nproc is None else nproc
    spawn(_spawned, (fn, args, nproc), nproc, backend, timeout_s, on_stop)


def _spawned(fn: Callable, args: tuple, nproc: int) -> None:
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    fn(*args, 1, nproc)
