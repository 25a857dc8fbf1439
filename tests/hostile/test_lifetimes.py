"""Class 2 of the hostile corpus: nothing outlives its parent. ``bytecomp profile --nproc
2`` killed (SIGKILL) or hung up on (SIGHUP) while its ranks start, and ``bytecomp plan``
killed while its finalists train: 2 s later no process of the command is left (ranks,
multiprocessing's resource tracker). The command runs in a session of its own, so every
process it started is found by its session id, wherever it was reparented.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BYTECOMP = [sys.executable, "-m", "bytecomp.cli"]
LEFT_WITHIN_S = 2.0

pytestmark = [pytest.mark.faults, pytest.mark.multirank]


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _children(pid: int) -> list[int]:
    return [p for p in _session(pid) if p != pid and (_stat(p) or ["", "0"])[1] == str(pid)]


def _start(args: list, tmp_path: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*BYTECOMP, *map(str, args)], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=None if env is None else {**os.environ, **env})


def _wait_for_ranks(process: subprocess.Popen, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(_children(process.pid)) < count:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.02)


def _assert_none_left(process: subprocess.Popen, sig: int) -> None:
    os.kill(process.pid, sig)
    process.wait(timeout=30)
    deadline = time.monotonic() + LEFT_WITHIN_S
    while _session(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _session(process.pid)
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"{len(left)} processes outlived their parent by {LEFT_WITHIN_S} s"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM])
def test_profile_ranks_die_with_their_parent_during_start_up(tmp_path, sig):
    """Killed the moment its two ranks exist: they are still importing torch."""
    process = _start(["profile", "--model", "mlp", "--nproc", "2", "--quick", "--out",
                      tmp_path / "profile"], tmp_path)
    _wait_for_ranks(process, 2, 60)
    _assert_none_left(process, sig)
    if sig != signal.SIGKILL:  # a handled stop: it says so, and writes no profile
        assert process.returncode == 130 and "interrupted" in process.stderr.read()
        assert not (tmp_path / "profile").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_plan_ranks_die_with_their_parent_while_finalists_train(tmp_path, sig):
    """... and the finalists' scratch folder goes with a handled stop; killed outright,
    the next bytecomp command (any) removes it."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    process = _start(["plan", ROOT / "profiles" / "cnn", "--cluster", "gbe1", "--out",
                      tmp_path / "plan.yaml", "--verify-steps", "1000"], tmp_path, env)
    _wait_for_ranks(process, 2, 120)
    time.sleep(3)  # training
    _assert_none_left(process, sig)
    assert not (tmp_path / "plan.yaml").exists()
    folders = list(scratch.glob("bytecomp-*/finalists.*"))
    assert len(folders) == (1 if sig == signal.SIGKILL else 0), folders
    subprocess.run([*BYTECOMP, "compressors", "fp16"], env={**os.environ, **env}, check=True,
                   stdout=subprocess.DEVNULL)
    assert list(scratch.glob("bytecomp-*/finalists.*")) == []


def _report(path: str) -> None:
    """Run in a booted rank: was torch loaded, and is the parent-death signal set?"""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int()
    libc.prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    Path(path).write_text(f"{'torch' in sys.modules} {value.value}")


def test_a_rank_asks_for_the_parent_death_signal_before_it_imports_torch(tmp_path):
    """What makes the tests above hold on a busy machine, where importing torch takes
    seconds: the rank's entry sets the signal before unpacking its work."""
    import multiprocessing

    from bytecomp.lifetime import pack, rank_boot

    out = tmp_path / "report"
    process = multiprocessing.get_context("spawn").Process(
        target=rank_boot, args=(pack(_report, (str(out),)), os.getpid()))
    process.start()
    process.join(60)
    assert out.read_text() == f"False {int(signal.SIGKILL)}"
