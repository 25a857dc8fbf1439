"""The hostile-input corpus (``cases.py``): every case runs in this process through the
command line's entry point, under a time limit. Each must end in one line on stderr
and exit code 2, or succeed where its input is still valid; no input may change and
no temporary may be left behind.

``python -m pytest tests/hostile -q -s`` prints the corpus size and outcome counts.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import sys
from collections import Counter
from pathlib import Path

import pytest
from refusal import refusal_lines

from cases import all_cases, materialize

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")
TIME_LIMIT_S = 20
TEMPORARY = re.compile(r"\..*\.\d+\.[A-Za-z0-9_]+\.(tmp|old)|\.bytecomp-probe\..*")
CASES = all_cases()
OUTCOMES: Counter = Counter()


class CaseTimedOut(BaseException):
    """Raised by SIGALRM in the case's command (not an Exception: nothing catches it)."""


def _inputs(root: Path) -> dict[str, str]:
    """A digest of every input under ``root`` (not the outputs): file contents, and the
    kind or link target of anything else."""
    digests = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if relative.startswith("out"):
            continue
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            digests[relative] = "link to " + os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            digests[relative] = hashlib.sha256(path.read_bytes()).hexdigest() \
                if info.st_size < 1 << 20 else f"{info.st_size} bytes, {info.st_mtime_ns}"
        else:
            digests[relative] = stat.filemode(info.st_mode)
    return digests


def _leftovers(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if TEMPORARY.fullmatch(p.name)]


def _run_limited(cli, args: list[str], cwd: Path):
    expired = []

    def expire(_signum, _frame):
        expired.append(True)
        raise CaseTimedOut

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        result = cli(*args, cwd=cwd)
    except CaseTimedOut:
        result = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if expired:  # also where the command caught it (a factory's BaseException is one line)
        pytest.fail(f"`bytecomp {' '.join(args)}` ran past {TIME_LIMIT_S} s", pytrace=False)
    return result


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_input(case, cli, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    values = materialize(tmp_path)
    case.mutate(tmp_path)
    before = _inputs(tmp_path)
    args = [arg.format(**values) for arg in case.args]
    result = _run_limited(cli, args, tmp_path)
    if result.returncode == 0:
        assert case.expect == "any", f"accepted an invalid input: {result.stdout[-2000:]}"
        OUTCOMES["succeeded (valid input)"] += 1
    else:
        assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
        refusal_lines(result.stderr)
        OUTCOMES["one-line error, exit 2"] += 1
    assert _inputs(tmp_path) == before, "an input was modified"
    assert _leftovers(tmp_path) == []


def teardown_module(module) -> None:
    if OUTCOMES:
        counts = ", ".join(f"{count} {what}" for what, count in sorted(OUTCOMES.items()))
        print(f"\nhostile corpus: {len(CASES)} cases; run: {sum(OUTCOMES.values())}: {counts}",
              file=sys.__stdout__)
