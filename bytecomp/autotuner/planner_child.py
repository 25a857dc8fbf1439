"""The planner beside the job: rank 0's child process running
:func:`bytecomp.search.in_job.main` on the agreed measurements, on idle cores, paused
whenever it costs the steps more than the share (:meth:`PlannerChild.step`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN_TIMEOUT_S = 600.0  # the child is stopped after this; the job keeps its exchange
# The planner's child: on idle cores only (nice 19, and SCHED_IDLE where Linux has it)
# before it imports the planner, and dying with the job (bytecomp.search.in_job.main)
CHILD = ("import contextlib, os, sys\n"
         "with contextlib.suppress(OSError, AttributeError):\n"
         "    os.nice(19)\n"
         "    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
         "from bytecomp.search.in_job import main\n"
         "sys.exit(main(sys.argv[1:]))\n")
RUNNING, READY, FAILED = 0, 1, 2


class PlannerChild:
    """Rank 0's planner: started on ``measurements`` in a private temporary directory;
    :meth:`step` at every step's first bucket, :meth:`state`, :meth:`result`, then
    :meth:`close` (the child killed, the directory removed)."""

    def __init__(self, measurements: dict, share: float, step_mean_ms: float) -> None:
        self.share = share
        self.step_mean_s = step_mean_ms / 1000
        self.started = time.monotonic()
        self.timed_out = False
        self.pauses = 0
        self.paused = False
        self.sums = [0.0, 0, 0.0, 0]  # the steps' seconds and count, running and paused
        self.workdir: Path | None = Path(tempfile.mkdtemp(prefix="bytecomp-autotune-"))
        (self.workdir / "measurements.json").write_text(json.dumps(measurements))
        with open(self.workdir / "stderr.txt", "wb") as stderr:  # never a full pipe
            self.process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(self.workdir)], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr)

    def step(self, took_s: float) -> None:
        """A step took ``took_s``: keep what planning costs the steps within the share.
        The steps run while the child ran, less as many at the mean of those run while it
        was paused (before any, the measured mean), is its cost; while that exceeds
        ``share`` x the planning phase's time the child is paused (SIGSTOP), else resumed
        (SIGCONT). Paused, its cost stays and the time grows: it always resumes. On spare
        cores it never slows a step and runs through; on the cores the ranks use, it runs
        in the share the steps leave."""
        process = self.process
        if process is None or not hasattr(signal, "SIGSTOP"):
            return
        sums = self.sums
        offset = 2 if self.paused else 0
        sums[offset] += took_s
        sums[offset + 1] += 1
        base = sums[2] / sums[3] if sums[3] >= 3 else self.step_mean_s
        over = sums[0] - sums[1] * base > self.share * (sums[0] + sums[2])
        if over != self.paused and process.poll() is None:
            os.kill(process.pid, signal.SIGSTOP if over else signal.SIGCONT)
            self.paused = over
            self.pauses += over

    def state(self) -> int:
        """:data:`RUNNING`, :data:`READY` or :data:`FAILED` (exited otherwise, or stopped
        after :data:`PLAN_TIMEOUT_S`)."""
        process = self.process
        if process is None:
            return FAILED
        code = process.poll()
        if code is None:
            if time.monotonic() - self.started > PLAN_TIMEOUT_S:
                process.kill()
                process.wait()
                self.timed_out = True
                return FAILED
            return RUNNING
        return READY if code == 0 else FAILED

    def result(self, state: int) -> str:
        """The plan as JSON text (:data:`READY`), else why there is none, in one line."""
        assert self.workdir is not None
        if state == READY:
            from bytecomp.safe_yaml import load_yaml

            return json.dumps(load_yaml((self.workdir / "plan.yaml").read_text(), "plan.yaml"))
        if self.timed_out:
            return f"no plan after {PLAN_TIMEOUT_S:.0f} s"
        error = self.workdir / "error.txt"
        if error.exists():
            return error.read_text().strip()[:500]
        stderr = (self.workdir / "stderr.txt").read_text(errors="replace")
        return (stderr.strip().splitlines() or ["the planner exited without a reason"])[-1][:500]

    def close(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()  # SIGKILL: stopped or not
            self.process.wait()
            self.process = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
