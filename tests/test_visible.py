"""Nothing long is silent: ``profile``, ``plan`` (training its finalists) and ``bench``
run on a pseudo-terminal, as a user sees them, and no two writes to it are more than
:data:`MOST_SILENT_S` apart (progress bars refresh, spinners turn, every stage opens
with a line). Piped, the same commands print one line per stage on stderr and no bar.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = str(ROOT / "tests" / "fixtures")
BYTECOMP = [sys.executable, "-m", "bytecomp.cli"]
MOST_SILENT_S = 2.0

pytestmark = [pytest.mark.multirank, pytest.mark.clock]  # silences timed on the clock


def on_a_terminal(args: list, cwd: Path, timeout_s: float = 300) -> tuple[int, float, str]:
    """Run ``bytecomp ARGS`` on a pseudo-terminal: its exit code, the longest silence
    between two writes (from the start), and what it wrote (with a mark where that
    silence was)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm", "PYTHONPATH": FIXTURES}
    env.pop("NO_COLOR", None)
    started = time.monotonic()
    process = subprocess.Popen([*BYTECOMP, *map(str, args)], stdin=slave, stdout=slave,
                               stderr=slave, cwd=cwd, env=env, start_new_session=True)
    os.close(slave)
    last, longest, written = started, 0.0, []
    try:
        while time.monotonic() - started < timeout_s:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # the terminal closed: the process is gone
                    break
                if not data:
                    break
                now = time.monotonic()
                if now - last > longest:
                    longest = now - last
                    written.append(f"<<silent {longest:.1f} s>>".encode())
                last = now
                written.append(data)
            elif process.poll() is not None:
                break
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    code = process.wait()
    return code, longest, b"".join(written).decode(errors="replace")


def test_profile_plan_and_bench_are_never_silent_for_long(tmp_path):
    profile = tmp_path / "profile"
    code, silent, text = on_a_terminal(
        ["profile", "--model", "factories:with_recipe", "--nproc", "2", "--quick", "--out",
         profile, "--compressor", "fp16", "--compressor", "topk:ratio=0.1", "--budget", "60"],
        tmp_path)
    assert code == 0, text
    assert silent <= MOST_SILENT_S, f"profile was silent for {silent:.1f} s:\n{text}"
    assert "convergence probe" in text and "--budget sets it" in text
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\nnodes: 2\nranks_per_node: 1\n"
                    "links:\n  inter: {bandwidth_gbps: 0.01, latency_us: 100}\n")
    code, silent, text = on_a_terminal(
        ["plan", profile, "--cluster", slow, "--out", tmp_path / "plan.yaml",
         "--model", "factories:with_recipe", "--verify-budget", "30"], tmp_path)
    assert code == 0, text
    assert silent <= MOST_SILENT_S, f"plan was silent for {silent:.1f} s:\n{text}"
    # it trains what the probe did not (the searched plan differs with the profile's noise:
    # where the probe trained every finalist already, nothing is left to train)
    assert ("--verify-budget sets the time" in text and "training" in text) or \
        "left to train" in text, text
    code, silent, text = on_a_terminal(
        ["bench", profile, "--plan", tmp_path / "plan.yaml", "--out", tmp_path / "bench",
         "--nproc", "2", "--iterations", "3", "--model", "factories:with_recipe",
         "--cluster", slow], tmp_path)
    assert code == 0, text
    assert silent <= MOST_SILENT_S, f"bench was silent for {silent:.1f} s:\n{text}"


def test_piped_there_is_one_line_per_stage_and_no_bar(tmp_path):
    """Piped (a CI log), the same profile prints each stage once, as a line, and no bar:
    rank 0 writes them, so the command runs as a process whose stderr is a pipe."""
    done = subprocess.run(
        [*BYTECOMP, "profile", "--model", "factories:with_recipe", "--nproc", "2", "--quick",
         "--out", str(tmp_path / "profile"), "--compressor", "fp16", "--budget", "60"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": FIXTURES}, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(line.startswith("profiling factories:with_recipe") for line in lines[:3])
    for stage in ("training iterations", "collective sweeps", "compressor sweeps",
                  "gradient fidelity", "convergence probe"):
        assert sum(line.startswith(stage) for line in lines) == 1, done.stderr
    assert "━" not in done.stderr and "\r" not in done.stderr  # no bar drawn
