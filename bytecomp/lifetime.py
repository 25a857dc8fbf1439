"""Processes bytecomp starts die with it: ranks spawned by ``--nproc`` and by
``bytecomp emulate``, also when bytecomp is killed outright (SIGKILL)."""

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
