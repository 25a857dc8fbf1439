"""Which rank failed: heartbeats in the job's store, read when a collective fails.

A gloo or NCCL collective that loses a peer fails with the transport's words
("Connection reset by peer", "Timed out waiting 20000ms for send operation") on
every surviving rank, naming no rank. While an executor runs, every rank adds 1
to its own counter in the job's store (the ``TCPStore`` that
``init_process_group`` rendezvoused on) every :data:`BEAT_S`. When one of the
executor's exchanges fails, the rank that saw it reads every counter, waits
:data:`SETTLE_S`, and reads them again: a rank whose counter did not move died or
stopped responding (a SIGSTOPped process beats no more than a killed one). The
store lives in rank 0's process (or in torchrun's agent): if it does not answer,
that host is the one that stopped.

Counters, not clocks: the ranks' clocks need not agree.
"""

from __future__ import annotations

import queue
import re
import threading
from typing import Literal

import torch.distributed as dist

from bytecomp.comm.topology import job_timeout
from bytecomp.errors import BytecompError

BEAT_S = 0.5  # a live rank's heartbeat period
SETTLE_S = 4 * BEAT_S  # how long a survivor watches the counters: 4 beats of a live rank
STORE_WAIT_S = 3.0  # beyond SETTLE_S: a store that has not answered by then is gone
PREFIX = "bytecomp/heartbeat/"


class PeerFailure(BytecompError):
    """A collective of the executor failed because a rank died or stopped responding.
    ``ranks``: those found silent (empty where none could be named); ``cause``: the
    transport's own error."""

    def __init__(self, message: str, ranks: list[int], cause: BaseException) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.cause = cause


def job_store():
    """The store of the default process group, or None where torch hides it (it is
    not public API: ``_get_default_store``)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - an older or newer torch without it: no heartbeats
        return None


class Heartbeats:
    """This rank's heartbeat thread, and the reading of everyone's (see the module
    docstring). ``store`` None: nothing is sent and failures name no rank."""

    def __init__(self, store, rank: int, world: int) -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self._stop = threading.Event()
        self._thread = None
        if store is not None and world > 1:
            self._thread = threading.Thread(target=self._beat, name="bytecomp-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        key = f"{PREFIX}{self.rank}"
        while True:
            try:
                self.store.add(key, 1)
            except Exception:  # noqa: BLE001 - the store is gone: a failure will say so
                return
            if self._stop.wait(BEAT_S):
                return

    def _counts(self) -> list[int]:
        return [self.store.add(f"{PREFIX}{rank}", 0) for rank in range(self.world)]

    def silent_ranks(self) -> list[int]:
        """The other ranks whose heartbeat stopped (takes :data:`SETTLE_S`); raises
        ``TimeoutError`` or the store's error when the store does not answer."""
        def watch() -> list[int]:
            before = self._counts()
            self._stop.wait(SETTLE_S)
            after = self._counts()
            return [rank for rank in range(self.world)
                    if rank != self.rank and after[rank] == before[rank]]

        # a daemon thread, not a pool's: a store that never answers (its host stopped)
        # holds the thread, and the interpreter joins a pool's threads at exit (it hung)
        answer: queue.Queue = queue.Queue(1)

        def run() -> None:
            try:
                answer.put((True, watch()))
            except Exception as error:  # noqa: BLE001 - the store's error, raised below
                answer.put((False, error))

        threading.Thread(target=run, name="bytecomp-peers", daemon=True).start()
        try:
            ok, value = answer.get(timeout=SETTLE_S + STORE_WAIT_S)
        except queue.Empty:
            raise TimeoutError("the job's store did not answer") from None
        if not ok:
            raise value
        return value

    def explain(self, error: BaseException) -> BytecompError:
        """``error`` of a failed exchange as one line naming the rank to blame and what was
        seen (:func:`seen`), where it is a peer's failure (a BytecompError of bytecomp's
        own passes through)."""
        if isinstance(error, BytecompError):
            return error
        what, detail = seen(error)

        def line(rank: str, *more: str) -> str:
            return f"{rank} {what} ({'; '.join(m for m in (detail, *more) if m)})"

        if self.store is None or self.world < 2:
            return PeerFailure(line("a peer", f"seen by rank {self.rank}"), [], error)
        try:
            silent = self.silent_ranks()
        except Exception:  # noqa: BLE001 - the store's host is the one that stopped
            return PeerFailure(line("rank 0", f"seen by rank {self.rank}", "the job's store, "
                                    "which rank 0 hosts unless torchrun's agent does, did "
                                    "not answer"), [0], error)
        if not silent:
            return PeerFailure(f"a collective failed on rank {self.rank}, every peer still "
                               f"responding: {cause_of(error)}", [], error)
        named = ", ".join(str(rank) for rank in silent)
        return PeerFailure(line(f"rank{'s' if len(silent) > 1 else ''} {named}",
                                f"seen by rank {self.rank}", "no heartbeat since"),
                           silent, error)

    def close(self) -> None:
        self._stop.set()


# What a failed collective's error says, in gloo's and NCCL's words (a RuntimeError of
# DDP's own allreduce or of PyTorch's hooks, which bytecomp's futures do not see).
TRANSPORT_WORDS = ("gloo", "nccl", "connection reset", "connection closed", "connection refused",
                   "timed out", "broken pipe", "socket", "peer")
# gloo's and NCCL's words for a peer whose socket closed (killed, or its process ended)
CLOSED_WORDS = ("connection reset", "connection closed", "connection refused", "broken pipe",
                "end of file", "read error", "got 0 bytes")
TIMEOUT_MS = re.compile(r"timed out waiting (\d+)\s*ms", re.IGNORECASE)


def cause_of(error: BaseException) -> str:
    """The transport's own words, on one line and at most 200 characters."""
    return " ".join(str(error).split())[:200] or type(error).__name__


def seen(error: BaseException) -> tuple[str, str | None]:
    """What a failed collective saw of the peer: ("closed its connection", None), or
    ("stopped responding", "timeout after 30 s") (the transport's timeout, else the job's),
    else ("failed or stopped responding", the transport's words)."""
    text = str(error).lower()
    if any(word in text for word in CLOSED_WORDS):
        return "closed its connection", None
    waited = TIMEOUT_MS.search(text)
    if waited:
        return "stopped responding", f"timeout after {int(waited.group(1)) / 1000:g} s"
    if "timed out" in text or "timeout" in text:
        timeout = job_timeout()
        return "stopped responding", (f"timeout after {timeout.total_seconds():g} s"
                                      if timeout is not None else "a timeout")
    return "failed or stopped responding", cause_of(error)


def is_transport_error(error: BaseException) -> bool:
    """Whether ``error`` reads as a collective that lost a peer."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in TRANSPORT_WORDS)


class ReportsPeerFailures:
    """``with bytecomp.apply_plan(ddp, plan) as executor:`` closes the executor after the
    block, and turns a collective that failed inside it into the :class:`PeerFailure`
    naming the rank to blame (DDP hands a hook's error to ``backward`` as a RuntimeError
    of its own words). Needs ``heartbeats``, ``failure`` and ``close()``."""

    heartbeats: Heartbeats
    failure: BytecompError | None = None

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        if error is None:
            self.close()
            return False
        # a failed job goes down without closing: closing waits on groups a dead peer holds
        if isinstance(error, BytecompError) or not isinstance(error, RuntimeError):
            return False
        failure = self.failure
        if failure is None and is_transport_error(error):
            failure = self.failure = self.heartbeats.explain(error)
        if failure is None:
            return False
        raise failure from None
