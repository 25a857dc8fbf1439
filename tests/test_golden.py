"""Plans and executor results recorded before a refactoring (tests/golden/) are still
what bytecomp gives: the same plan for every shipped profile and every case of the
search benchmark's sets, and the same parameters and executor state to the bit."""

from __future__ import annotations

import json
import math

import pytest
import torch
from golden import executor as golden_executor
from golden import plans as golden_plans

PLANS = json.loads(golden_plans.RECORD.read_text())
EXECUTOR = json.loads(golden_executor.RECORD.read_text())


def _same(recorded, now, where: str = "") -> list[str]:
    """Where ``now`` differs from ``recorded`` (floats to 1e-9 relative)."""
    if isinstance(recorded, float) or isinstance(now, float):
        if isinstance(recorded, (int, float)) and isinstance(now, (int, float)) and \
                math.isclose(recorded, now, rel_tol=1e-9, abs_tol=1e-12):
            return []
        return [f"{where}: {recorded!r} -> {now!r}"]
    if isinstance(recorded, dict) and isinstance(now, dict):
        if recorded.keys() != now.keys():
            return [f"{where}: keys {sorted(recorded)} -> {sorted(now)}"]
        return [d for key in recorded for d in _same(recorded[key], now[key], f"{where}.{key}")]
    if isinstance(recorded, list) and isinstance(now, list) and len(recorded) == len(now):
        return [d for i, (a, b) in enumerate(zip(recorded, now))
                for d in _same(a, b, f"{where}[{i}]")]
    return [] if recorded == now else [f"{where}: {recorded!r} -> {now!r}"]


# The shipped profiles at their profiled cluster: the fast tier's sample of the record.
QUICK = [name for name, entry in PLANS.items()
         if entry["case"].get("cluster", "") is None and entry["case"].get("args") == []]


@pytest.mark.parametrize("name", QUICK)
def test_the_shipped_profiles_plan_as_recorded(name):
    entry = PLANS[name]
    differences = _same(entry["plan"], golden_plans.plan_case(entry["case"]))
    assert not differences, differences[:5]


# make test-all's sample (about a third of the record's time): the shipped profiles on every
# cluster, every adaptive ladder, and the search benchmark's smaller models.
# `python tests/golden/plans.py --check` compares every case.
SAMPLE = [name for name, entry in PLANS.items()
          if entry["case"].get("profile", "").startswith("profiles/")
          or "--adaptive" in entry["case"].get("args", [])
          or entry["case"].get("model") in ("MLP", "LSTM", "VGG-16")]


@pytest.mark.slow
def test_a_sample_of_the_recorded_cases_plans_as_recorded():
    failures = {}
    for name in SAMPLE:
        entry = PLANS[name]
        differences = _same(entry["plan"], golden_plans.plan_case(entry["case"]))
        if differences:
            failures[name] = differences[:3]
    assert len(SAMPLE) > 40 and not failures, failures


@pytest.mark.multirank
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != EXECUTOR["cpu_capability"],
                    reason=f"recorded on a {EXECUTOR['cpu_capability']} CPU: this one's vector "
                           f"unit rounds otherwise")
@pytest.mark.parametrize("world,nodes", golden_executor.SHAPES)
def test_the_executor_gives_the_recorded_results_to_the_bit(world, nodes):
    from ranks import run_ranks

    per_rank = run_ranks(golden_executor.run_cases, world, nodes)
    recorded = EXECUTOR["runs"][f"{world}x{nodes}"]
    differences = _same(recorded, per_rank[0])
    assert not differences, differences[:5]
