"""Class 10 of the hostile corpus: what a kill leaves. ``bytecomp emulate`` killed outright
(SIGKILL) at start-up and while its ranks run: its janitor removes the namespaces, links
and qdiscs and kills the ranks' children within seconds; with the janitor killed too, the
next emulate run removes them. (A plan killed while its finalists train:
test_lifetimes.py.) Needs root and network namespaces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from test_emulate import BYTECOMP, _sleepers, netns

from bytecomp.emulate.netns import leftovers, reap_abandoned

pytestmark = [pytest.mark.faults, pytest.mark.multirank]


def _janitors(run_id: str) -> list[str]:
    return _sleepers(f"bytecomp.emulate.janitor {run_id}")


@netns
@pytest.mark.parametrize("after_s", [0.5, 3.0])
def test_a_killed_emulate_leaves_nothing_its_janitor_does_not_remove(after_s):
    """Killed outright (at start-up or while its ranks run), emulate cannot clean up: its
    ranks die with it (the parent-death signal) and its janitor kills their children and
    removes the namespaces, links and qdiscs within seconds."""
    pattern = f"^sleep 30.{int(after_s * 10)}25"  # the ranks' children (sh -c "sleep ...")
    before = set(leftovers())
    process = subprocess.Popen([*BYTECOMP, "emulate", "--nodes", "2", "--", "sh", "-c",
                                f"{pattern[1:]}; true"], stderr=subprocess.DEVNULL,
                               start_new_session=True)
    time.sleep(after_s)
    process.kill()  # emulate alone, no chance to clean up
    process.wait(timeout=10)
    deadline = time.monotonic() + 15
    while (set(leftovers()) - before or _sleepers(pattern)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(leftovers()) - before == set()
    assert _sleepers(pattern) == [], "a rank's child outlived its emulate"


@netns
def test_the_next_run_removes_what_a_killed_run_and_its_janitor_left_behind():
    """Should the janitor be killed too, the run's owner file lets the next run kill what
    still runs in its namespaces and remove them."""
    pattern = "^sleep 30.125"  # the ranks' children, not the ranks (sh -c "sleep ...; true")
    process = subprocess.Popen([*BYTECOMP, "emulate", "--nodes", "2", "--", "sh", "-c",
                                "sleep 30.125; true"], stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    run_id = process.stderr.readline().split("run ")[1].split(",")[0]
    deadline = time.monotonic() + 20
    while (len(leftovers(run_id)) < 3 or len(_sleepers(pattern)) < 2) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_sleepers(pattern)) == 2 and len(_janitors(run_id)) == 1
    for pid in _janitors(run_id):
        os.kill(int(pid), signal.SIGKILL)
    process.kill()
    process.wait(timeout=10)
    assert len(leftovers(run_id)) >= 3
    reaped = reap_abandoned()
    assert run_id in reaped and len(reaped[run_id]) >= 3
    assert leftovers(run_id) == []
    deadline = time.monotonic() + 5
    while _sleepers(pattern) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleepers(pattern) == [], "a rank's child outlived the reaped run"
