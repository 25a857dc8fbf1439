"""Class 3 of the hostile corpus: runs without end. The exact search on the shipped
20-tensor cnn (the case that ran past 400 s) ends at its default cap and says what it
proved; ``--budget`` caps it; both never give a plan worse than the default search's.
``simulate`` on 10,000 tensors: tests/test_simulate_scale.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from bytecomp.search.planner import EXACT_CAP_S

ROOT = Path(__file__).resolve().parents[2]
CNN = ROOT / "profiles" / "cnn"
SLACK_S = 5.0  # the default search before the exact one, and start-up


def _value(path: Path) -> float:
    return yaml.safe_load(path.read_text())["predicted_ms"]["plan"]


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, "1"])
def test_the_exact_search_ends_at_its_cap_and_says_what_it_proved(cli, tmp_path, budget):
    default = tmp_path / "default.yaml"
    assert cli("plan", CNN, "--cluster", "gbe1", "--no-verify", "--out", default).returncode == 0
    exact = tmp_path / "exact.yaml"
    started = time.process_time()  # a loaded machine does not inflate it
    done = cli("plan", CNN, "--cluster", "gbe1", "--no-verify", "--algorithm", "exact",
               "--out", exact, *(["--budget", budget] if budget else []))
    spent = time.process_time() - started
    assert done.returncode == 0, done.stderr
    cap = float(budget) if budget else EXACT_CAP_S
    assert spent <= cap + SLACK_S, spent
    text = " ".join((done.stdout + done.stderr).split())
    assert "optimal" in text or "exact search stopped" in text
    assert _value(exact) <= _value(default) + 1e-9
