"""Processes bytecomp starts die with it: ranks spawned by ``--nproc`` and by
``bytecomp emulate``, also when bytecomp is killed outright (SIGKILL).

A spawned rank starts in :func:`rank_boot`, which asks for the parent-death signal
before anything else is imported: this module imports only the standard library, and
the rank's work (torch and all) arrives as bytes it unpacks afterwards. Had the rank's
function been the process target itself, multiprocessing would import its module, and
torch with it (seconds on a busy machine), before the first line of the rank ran.
"""

from __future__ import annotations

import contextlib
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent exits, even when the parent
    is killed outright (Linux's parent-death signal; elsewhere nothing happens). Call
    it in the child; ``parent`` is the parent's pid, to catch a parent already gone."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before we asked
            os._exit(1)


# What stops a job; deferred while a rank is being started (see deferred_stop_signals).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_stop_signals():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then take any that came.
    Around the start of a rank: a stop that lands between the fork and the hand-over of
    the rank's work would leave a child with half its input (and a traceback). The
    child inherits the mask; :func:`rank_boot` lifts it first thing."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# The parent's hand-over of the terminal (see take_terminal): two events, set in a rank.
_terminal: tuple | None = None


def take_terminal(timeout_s: float = 2.0) -> None:
    """In a spawned rank about to draw live progress on the terminal: tell the parent,
    which shows a spinner while its ranks start, and wait (at most ``timeout_s``) until
    it has cleared it, so the two displays do not draw over each other. Elsewhere (not
    a spawned rank, or asked before) nothing happens."""
    global _terminal
    if _terminal is None:
        return
    wanted, given = _terminal
    _terminal = None
    wanted.set()
    given.wait(timeout_s)


def rank_boot(payload: bytes, parent: int, *extra, terminal: tuple | None = None) -> None:
    """A spawned rank's entry: die with ``parent`` first, then unpack ``payload`` (a
    function and its arguments, packed by the parent: :func:`pack`) and call it with the
    arguments, then ``extra`` (objects multiprocessing must hand over itself, a queue).
    ``terminal``: the two events of :func:`take_terminal`, on rank 0."""
    global _terminal
    die_with_parent(parent)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held while it was started
    _terminal = terminal
    from multiprocessing.reduction import ForkingPickler

    # The bytes come from the parent over the spawn pipe, as multiprocessing's own
    # arguments do; they are unpacked here, late, only so that the line above runs first.
    fn, args = ForkingPickler.loads(payload)
    fn(*args, *extra)


def pack(fn, args: tuple) -> bytes:
    """``fn`` and its arguments as :func:`rank_boot` unpacks them."""
    from multiprocessing.reduction import ForkingPickler

    return bytes(ForkingPickler.dumps((fn, args)))
