"""Class 9 of the hostile corpus: a dead or stopped peer. examples/train.py (the README's
snippet: it catches BytecompError) runs a plan on 2 ranks; one rank is killed (SIGKILL) or
stopped (SIGSTOP) under a static plan and inside a verified plan's runtime trial; the
survivor exits 2 with exactly one line naming the rank and what was seen, no traceback,
within the job's timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bytecomp.plan_file import FINALISTS, ladder_for_model, plan_for_model
from bytecomp.plan_types import Adaptive, Option

from ranks import free_port

pytestmark = [pytest.mark.faults, pytest.mark.multirank]

TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train.py"
TRAIN_MODEL = "mlp:inputs=64,width=256,depth=3"
# torch's own C++ log lines at rendezvous ("[W1127 17:37:10.29 socket.cpp:207] [c10d] The
# hostname of the client socket cannot be retrieved"), and the store's warning where its
# host died ("[rank1]:[W1201 ...TCPStore.cpp:125] [c10d] recvValue failed ...", then the C++
# exception's origin and frames): not the script's output
C10D_LOG = re.compile(r"(\[rank\d+\]:)?\[[WIE]\d{4} [\d:.]+ \S+\] \[c10d\]")
C10D_MORE = re.compile(r"Exception raised from |frame #\d+: |<omitting python frames>")


def _example_plan(path: Path, trial: bool = False) -> None:
    """A plan for examples/train.py's model that runs through bytecomp's executor; with
    ``trial``, a verified plan's shape whose runtime trial is still timing its candidates
    (top-k and PowerSGD in turn) when the test strikes."""
    from bytecomp.training.workloads import load_workload

    model = load_workload(TRAIN_MODEL, seed=0).model
    if not trial:
        plan_for_model(model, lambda name, param: Option("topk:ratio=0.1", "device",
                                                         "allgather"),
                       2, bucket_cap_mb=1.0).save(path)
        return
    options = [Option(), Option("topk:ratio=0.1", "device", "allgather"),
               Option("powersgd:rank=1", "device", "allreduce")]
    adaptive = Adaptive(FINALISTS, threshold=0.0, explore_every=10**9, start=1, trial=(1, 2),
                        trial_steps=1000, trial_warmup=2)
    ladder_for_model(model, [lambda n, p, o=o: o for o in options], 2, adaptive,
                     bucket_cap_mb=1.0, predicted_ms=[10.0, 6.0, 5.0]).save(path)


def _script_lines(stderr: str) -> list[str]:
    """The script's own lines of ``stderr``: not torch's C++ log (C10D_LOG)."""
    lines, in_log = [], False
    for line in stderr.splitlines():
        if C10D_LOG.match(line):
            in_log = True
        elif not (in_log and (C10D_MORE.match(line) or not line.strip())):
            in_log = False
            if line.strip():
                lines.append(line)
    return lines


def _start_ranks(plan: Path, port: int, timeout_s: float) -> list[subprocess.Popen]:
    ranks = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        ranks.append(subprocess.Popen(
            [sys.executable, str(TRAIN_SCRIPT), "--plan", str(plan), "--steps", "1000000",
             "--log-every", "10", "--timeout", str(timeout_s)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return ranks


# a static plan and a verified plan's runtime trial, each with a peer killed and one
# stopped; a killed rank 0 takes the job's store with it
@pytest.mark.parametrize("victim,sig,trial", [(1, signal.SIGKILL, False),
                                              (1, signal.SIGSTOP, False),
                                              (0, signal.SIGSTOP, True),
                                              (0, signal.SIGKILL, True)],
                         ids=["rank-1-killed", "rank-1-stopped", "rank-0-stopped-in-the-trial",
                              "rank-0-killed-in-the-trial"])
def test_the_survivor_of_a_dead_or_stopped_peer_prints_one_line_naming_it(tmp_path, victim,
                                                                          sig, trial):
    timeout_s = 5.0
    plan = tmp_path / "plan.yaml"
    _example_plan(plan, trial)
    ranks = _start_ranks(plan, free_port(), timeout_s)
    survivor = ranks[1 - victim]
    try:
        assert ranks[0].stdout is not None
        for line in ranks[0].stdout:  # rank 0 logs: training is under way on both
            if line.startswith("step 20:"):
                break
        else:
            pytest.fail(f"no training: {ranks[0].stderr.read() if ranks[0].stderr else ''}")
        os.kill(ranks[victim].pid, sig)
        started = time.monotonic()
        _, stderr = survivor.communicate(timeout=timeout_s + 30)
        seconds = time.monotonic() - started
    finally:
        for process in ranks:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.wait(10)
    lines = _script_lines(stderr)
    assert survivor.returncode == 2, (survivor.returncode, stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    what = "closed its connection (" if sig == signal.SIGKILL else \
        f"stopped responding (timeout after {timeout_s:g} s; "
    assert lines[0].startswith(f"error: rank {1 - victim}: rank {victim} {what}seen by rank "
                               f"{1 - victim}"), lines[0]
    assert seconds <= timeout_s + 10, seconds


def test_torchs_store_warning_is_told_from_the_scripts_lines():
    logged = ("[rank1]:[W1201 23:24:21.102493245 TCPStore.cpp:125] [c10d] recvValue failed\n"
              "Exception raised from recvBytes at Utils.hpp:787 (most recent call first):\n"
              "frame #0: c10::Error::Error + 0x98 (0x7f in libc10.so)\n"
              "<omitting python frames>\n\n"
              "error: rank 1: rank 0 closed its connection (seen by rank 1; ...)\n"
              "frame #1: not torch's log\n")
    assert _script_lines(logged) == ["error: rank 1: rank 0 closed its connection (seen by "
                                     "rank 1; ...)", "frame #1: not torch's log"]
