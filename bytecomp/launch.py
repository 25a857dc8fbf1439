"""Run a function on every rank: spawn local ranks, or join a torchrun job.

``run_on_ranks(fn, nproc, ...)``:

* under torchrun (``RANK`` and ``WORLD_SIZE`` set) it initializes the process
  group from the environment and calls ``fn`` on this rank;
* otherwise it spawns ``nproc`` local ranks on a free port (gloo on CPU, NCCL
  when ``cuda``), and waits. If any rank fails, the others are stopped at once
  and the failure is raised as one line naming the rank that failed (not one
  that only saw its peer go: a broken connection or a timed-out collective is
  a symptom); every collective also has a timeout, so nothing hangs.

Spawned ranks die with their parent: the kernel kills them when it exits, even
when it is killed outright (``PR_SET_PDEATHSIG``), and a SIGTERM to the parent
(or SIGHUP) stops them before it exits. Each rank asks for that signal at its first
instruction, before it imports torch (:mod:`bytecomp.lifetime`). A rank still running ``timeout`` seconds after
another finished is killed.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import multiprocessing
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.lifetime import deferred_stop_signals, pack, rank_boot
from bytecomp.ui import Stage

REPORT_GRACE_S = 2.0  # after a symptom, how long to wait for the root cause's report
# What a rank sees when a peer died or stopped: a symptom, not the cause.
PEER_SYMPTOM = re.compile(r"connection (closed|reset)|broken pipe|timed? ?out|timeout|"
                          r"DistNetworkError|DistBackendError|DistStoreError|gloo|nccl|socket",
                          re.IGNORECASE)


class RankFailed(BytecompError):
    """A rank raised or died; the message says which and why."""

    exit_code = 1


@dataclass(frozen=True)
class JobShape:
    world_size: int
    nodes: int
    ranks_per_node: int


@dataclass(frozen=True)
class Report:
    """What a failing rank sent its parent."""

    rank: int
    message: str
    user_error: bool = False  # a BytecompError: the same one-line message on every rank
    symptom: bool = False  # it only saw a peer fail (a broken connection, a timeout)
    details: str = ""  # the traceback, with BYTECOMP_DEBUG set


def in_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _env_int(name: str, default: str | None = None) -> int:
    text = os.environ.get(name, default)
    try:
        value = int(text or "")
    except ValueError:
        raise BytecompError(f"environment variable {name}={text!r} is not an integer "
                            f"(torchrun sets it)") from None
    if value < (0 if name == "RANK" else 1):
        raise BytecompError(f"environment variable {name}={value} is out of range")
    return value


def torchrun_shape() -> JobShape:
    """The job's shape from torchrun's environment, or a one-line error."""
    world = _env_int("WORLD_SIZE")
    rank = _env_int("RANK")
    per_node = _env_int("LOCAL_WORLD_SIZE", str(world))
    if rank >= world:
        raise BytecompError(f"RANK={rank} is not below WORLD_SIZE={world}")
    if world % per_node:
        raise BytecompError(f"LOCAL_WORLD_SIZE={per_node} does not divide WORLD_SIZE={world}")
    return JobShape(world, world // per_node, per_node)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BACKENDS = ("gloo", "nccl", "cpu:gloo,cuda:nccl")


def pick_device(choice: str, local_rank: int) -> torch.device:
    """The device of the rank ``local_rank`` of this node: ``choice`` is ``--device``
    (``auto``: a GPU where there is one)."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def backend_for(device_type: str) -> str:
    """The process-group backend for a job whose tensors live on ``device_type``. A CUDA
    job gets NCCL for its CUDA tensors and gloo for its CPU ones (host-placed payloads,
    timings and counters that ranks agree on): an NCCL-only group refuses CPU tensors.
    ``BYTECOMP_BACKEND`` (one of :data:`BACKENDS`) overrides it: ``gloo`` for ranks that
    share one GPU, which NCCL refuses (gloo carries CUDA tensors through the host)."""
    forced = os.environ.get("BYTECOMP_BACKEND")
    if forced is not None:
        if forced not in BACKENDS:
            raise BytecompError(f"BYTECOMP_BACKEND={forced!r} is not one of "
                                f"{', '.join(BACKENDS)}")
        return forced
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def init_from_env(backend: str, timeout_s: float) -> None:
    """Join the job described by the environment; a rendezvous that fails (a peer that
    never comes, a bad address) is a one-line error."""
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as error:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise BytecompError(f"cannot join the job as rank {os.environ.get('RANK')} of "
                            f"{os.environ.get('WORLD_SIZE')} at {where} within {timeout_s:g} s "
                            f"(is every rank started?): {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    if isinstance(error, BytecompError):
        return str(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


def _is_symptom(error: BaseException) -> bool:
    return isinstance(error, getattr(dist, "DistError", ())) or \
        bool(PEER_SYMPTOM.search(_one_line(error)))


class _Stopped(SystemExit):
    """The parent stopped this rank (SIGTERM): not a failure of its own."""


def _rank_entry(fn, args, rank, nproc, port, backend, timeout_s, errors):
    """A spawned rank, after :func:`bytecomp.lifetime.rank_boot` tied it to its parent."""
    def stop(_signum, _frame):
        raise _Stopped(143)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                      GROUP_RANK="0")
    # Each rank gets its share of the cores: torch's default (every core to each rank)
    # oversubscribes the machine, and one busy core then slows every rank many times over.
    torch.set_num_threads(threads_per_rank(nproc))
    try:
        init_from_env(backend, timeout_s)
        fn(*args)
        dist.barrier()
    except BaseException as error:  # reported to the parent, which stops the others
        if not isinstance(error, (_Stopped, KeyboardInterrupt)):
            details = traceback.format_exc() if os.environ.get("BYTECOMP_DEBUG") else ""
            message = f"called sys.exit({error.code!r})" if isinstance(error, SystemExit) \
                else _one_line(error)
            errors.put(Report(rank, message, isinstance(error, BytecompError),
                              _is_symptom(error), details))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # done: no interpreter teardown (a stuck thread's join) can keep it alive


# Signals that stop a job as Ctrl-C does: a terminal that closes (SIGHUP) is a stop too.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, so the ranks are
    stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# Local ranks per core beyond which a spawn is refused: each rank is a whole Python process
# with torch loaded (~300 MB), and a gloo job of many more ranks than cores is dominated by
# context switches, so its measurements would describe the oversubscription, not the job.
MAX_RANKS_PER_CORE = 4


def check_nproc(nproc: int | None) -> list[str]:
    """Refuse an ``--nproc`` below 1 or above :data:`MAX_RANKS_PER_CORE` per core of this
    machine, in one line; return a warning where it is above the cores (measurements of
    oversubscribed ranks are slower than the job will be)."""
    if nproc is None:
        return []
    cores = os.cpu_count() or 1
    limit = MAX_RANKS_PER_CORE * cores
    if not 1 <= nproc <= limit:
        raise BytecompError(f"--nproc must be from 1 to {limit} ({MAX_RANKS_PER_CORE} per core "
                            f"of this machine's {cores}), got {nproc}")
    if nproc > cores:
        return [f"--nproc {nproc} on {cores} cores: the ranks share cores, so every time "
                f"measured is slower than on a machine with a core per rank"]
    return []


def spawn(fn: Callable, args: tuple, nproc: int, backend: str, timeout_s: float,
          on_stop: Callable[[], None] = lambda: None) -> None:
    """Run ``fn(*args)`` on ``nproc`` spawned ranks, each with its share of the cores as
    torch threads (:func:`threads_per_rank`); raise if any of them fails."""
    from bytecomp.mainguard import check_main_guard

    check_nproc(nproc)
    check_main_guard()  # each rank would run the script's unguarded calls again
    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    port = free_port()
    # rank 0 asks for the terminal before it draws (lifetime.take_terminal)
    terminal = (context.Event(), context.Event())
    # rank_boot ties each rank to this process before it imports anything of the job
    processes = [context.Process(target=rank_boot, daemon=True,
                                 args=(pack(_rank_entry, (fn, args, rank, nproc, port, backend,
                                                          timeout_s)), os.getpid(), errors),
                                 kwargs={"terminal": terminal if rank == 0 else None})
                 for rank in range(nproc)]
    with _terminate_as_interrupt():
        try:
            with Stage(f"starting {nproc} rank{'s' if nproc > 1 else ''} (each imports "
                       f"torch and builds the job)", after_s=0.5, lines=False) as starting:
                for process in processes:
                    with deferred_stop_signals():  # a rank is started whole, or not at all
                        process.start()
                failure = _watch(processes, errors, timeout_s,
                                 lambda: _hand_over(terminal, starting))
        except KeyboardInterrupt:
            _stop(processes)
            on_stop()
            raise
        if failure is not None:
            _stop(processes)
            on_stop()
            if failure.details:
                print(failure.details, file=sys.stderr)
            if failure.user_error:
                raise BytecompError(failure.message)
            raise RankFailed(f"rank {failure.rank} failed: {failure.message}")


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _hand_over(terminal: tuple, starting: Stage) -> None:
    """Rank 0 wants the terminal for its progress: clear the spinner, then let it draw."""
    wanted, given = terminal
    if wanted.is_set() and not given.is_set():
        starting.end()
        given.set()


def _watch(processes, errors, timeout_s: float,
           tick: Callable[[], None] = lambda: None) -> Report | None:
    """Wait for every rank; the failure to report, or None when all succeeded.
    ``tick`` runs at every poll (the terminal's hand-over)."""
    reports: list[Report] = []
    first_failure: float | None = None
    finished: float | None = None
    while True:
        tick()
        with contextlib.suppress(queue.Empty):
            reports.append(errors.get(timeout=0.2))
            while True:
                reports.append(errors.get_nowait())
        codes = [p.exitcode for p in processes]
        now = time.monotonic()
        if all(code == 0 for code in codes):
            return None
        failed = bool(reports) or any(code not in (None, 0) for code in codes)
        if failed and first_failure is None:
            first_failure = now
        causes = [r for r in reports if r.user_error or not r.symptom]
        if causes:
            return causes[0]
        if first_failure is not None and now - first_failure >= REPORT_GRACE_S:
            return _blame(reports, codes)
        if finished is None and 0 in codes:
            finished = now
        if not failed and finished is not None and now - finished > timeout_s + 5:
            stuck = [rank for rank, code in enumerate(codes) if code is None]
            return Report(stuck[0], f"was still running {timeout_s + 5:g} s after rank "
                                    f"{codes.index(0)} finished (stuck); it was killed")


def _blame(reports: list[Report], codes: list[int | None]) -> Report:
    """Every report is a symptom: blame a rank that died without a report, else one
    that is still running (stuck) while the others saw it go; the symptom follows."""
    seen = f" ({', '.join(f'rank {r.rank}: {r.message}' for r in reports[:2])})" \
        if reports else ""
    reported = {r.rank for r in reports}
    for rank, code in enumerate(codes):
        if code not in (None, 0) and rank not in reported:
            return Report(rank, _exit_text(code) + seen)
    for rank, code in enumerate(codes):
        if code is None and rank not in reported:
            return Report(rank, "stopped responding" + seen)
    return reports[0]


def _stop(processes) -> None:
    processes = [p for p in processes if p.pid is not None]  # the ones started
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
            # the DDP models fn made sit in reference cycles: freed at exit, after their
            # process group, they can make gloo abort the process (docs/executor.md)
            gc.collect()
            dist.destroy_process_group()
        return
    nproc = 1 if nproc is None else nproc
    spawn(_spawned, (fn, args, nproc), nproc, backend, timeout_s, on_stop)


def _spawned(fn: Callable, args: tuple, nproc: int) -> None:
    fn(*args, 1, nproc)


def threads_per_rank(nproc: int) -> int:
    """The torch threads a spawned rank uses: its share of this machine's cores."""
    return max(1, (os.cpu_count() or 1) // nproc)
