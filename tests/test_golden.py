"""Plans and executor results recorded before a refactoring (tests/golden/) are still
what bytecomp gives: the same plan for every shipped profile and every case of the
search benchmark's sets, and the same parameters and executor state: to the bit where the
code orders every sum, within a stated tolerance where a BLAS library does
(tests/golden/executor.py)."""

from __future__ import annotations

import functools
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


DIGESTS = ("parameters", "state", "values", "state_values")


def _executor_differences(recorded: dict, now: dict, to_the_bit: bool) -> list[str]:
    """Where the executor's results differ from the record: every case to the bit
    (``to_the_bit``: this machine's vector capability and products round as the
    recording one's) but those whose exchange multiplies matrices, which are compared
    within the tolerance, as every case is where this machine rounds otherwise
    (tests/golden/executor.py says why); steps, bytes and switches to the bit always."""
    if recorded.keys() != now.keys():
        return [f"cases {sorted(recorded.keys() ^ now.keys())}"]
    differences = []
    for case, entry in recorded.items():
        if to_the_bit and not golden_executor.library_order(case):
            differences += _same(entry, now[case], case)
            continue
        exact = [key for key in entry if key not in DIGESTS]
        differences += _same({k: entry[k] for k in exact}, {k: now[case][k] for k in exact},
                             case)
        for key in ("values", "state_values"):
            tolerance, scale, of = _tolerance(case, key, entry[key])
            worst = max(abs(a - b) for a, b in zip(entry[key], now[case][key]))
            if not worst <= tolerance * scale:
                differences.append(f"{case}.{key}: {worst:.3g} from the record, above "
                                   f"{tolerance:g} x {scale:.6g} ({of})")
    return differences


@functools.cache
def _initial() -> list[float]:
    return golden_executor.initial_values()


def _tolerance(case: str, key: str, recorded: list[float]) -> tuple[float, float, str]:
    """(tolerance, scale, what the scale is) for a case's parameters or state: the
    parameters relative to the update's size (the root mean square of the recorded
    projections less the initial parameters'), a state relative to its norm."""
    if key == "values":
        moved = [a - b for a, b in zip(recorded[1:], _initial()[1:])]
        return (golden_executor.UPDATE_TOLERANCE, math.sqrt(math.fsum(m * m for m in moved)
                                                            / len(moved)), "the update")
    tolerance = golden_executor.LOWRANK_STATE_TOLERANCE if golden_executor.library_order(
        case) else golden_executor.TOLERANCE
    return tolerance, recorded[0], "the norm"


def rounds_as_recorded(products: str) -> bool:
    """Whether this machine rounds as the recording one: the same vector capability
    (``ATEN_CPU_CAPABILITY`` may lower it) and the same model gradients (``products``)."""
    return torch.backends.cpu.get_cpu_capability() == EXECUTOR["cpu_capability"] and \
        products == EXECUTOR["products"]


@pytest.mark.multirank
@pytest.mark.parametrize("world,nodes", golden_executor.SHAPES)
def test_the_executor_gives_the_recorded_results(world, nodes, record_property):
    """To the bit where the code orders every sum (and this machine rounds as the
    recording one), within the stated tolerance where a BLAS library does or this
    machine rounds otherwise; the same on every rank, and where two runs must match, to
    the bit on any machine. Runs on every CPU: which comparison ran is the test's
    ``comparison`` property (in the JUnit XML) and in a failure's message."""
    from ranks import run_ranks

    per_rank = run_ranks(golden_executor.run_cases, world, nodes)
    now = per_rank[0]
    for case in now:  # every rank holds the same parameters
        assert len({r[case]["parameters"] for r in per_rank}) == 1, case
    for first, second in golden_executor.SAME[world]:
        assert now[first]["parameters"] == now[second]["parameters"], (first, second)
    products = run_ranks(golden_executor.products, world)[0]
    to_the_bit = rounds_as_recorded(products)
    comparison = "to the bit" if to_the_bit else (
        f"within the tolerance: a {torch.backends.cpu.get_cpu_capability()} CPU whose "
        f"products round {'alike' if products == EXECUTOR['products'] else 'otherwise'}, "
        f"recorded on {EXECUTOR['cpu_capability']}")
    record_property("comparison", comparison)
    differences = _executor_differences(EXECUTOR["runs"][f"{world}x{nodes}"], now, to_the_bit)
    assert not differences, (comparison, len(differences), differences[:5])


def test_the_record_is_compared_to_the_bit_or_within_the_tolerance_as_stated():
    import copy

    recorded = EXECUTOR["runs"]["2x1"]
    now = copy.deepcopy(recorded)
    for entry in now.values():  # another rounding of every product: new digests, close values
        entry["parameters"] = entry["state"] = "f" * 64
        update = _tolerance("", "values", entry["values"])[1]
        entry["values"] = [v + 1e-4 * update for v in entry["values"]]
    assert _executor_differences(recorded, now, to_the_bit=False) == []
    bitwise = _executor_differences(recorded, now, to_the_bit=True)
    lowrank = [case for case in recorded if golden_executor.library_order(case)]
    assert len(lowrank) == 5 and not any(d.startswith(tuple(lowrank)) for d in bitwise)
    assert len(bitwise) >= 2 * (len(recorded) - len(lowrank))  # the rest: digests differ
    case = lowrank[0]
    now[case]["values"][3] += 1e-2 * _tolerance(case, "values", recorded[case]["values"])[1]
    now[lowrank[1]]["steps"] += 1
    moved = _executor_differences(recorded, now, to_the_bit=False)
    assert len(moved) == 2 and moved[0].startswith(f"{case}.values: ") and \
        "steps" in moved[1], moved
    # a low-rank state turns with its subspace (within LOWRANK_STATE_TOLERANCE); any
    # other case's state, and a low-rank state moved further, is a change
    now = copy.deepcopy(recorded)
    ordered = next(c for c in recorded if not golden_executor.library_order(c) and
                   recorded[c]["state_values"][0] > 0)
    now[case]["state_values"][1] += 2e-3 * recorded[case]["state_values"][0]
    assert _executor_differences(recorded, now, to_the_bit=False) == []
    now[ordered]["state_values"][1] += 2e-4 * recorded[ordered]["state_values"][0]
    now[lowrank[1]]["state_values"][2] += 2e-2 * recorded[lowrank[1]]["state_values"][0]
    moved = _executor_differences(recorded, now, to_the_bit=False)
    assert sorted(d.split(".state_values")[0] for d in moved) == sorted([ordered, lowrank[1]])


def test_it_compares_to_the_bit_only_where_this_machine_rounds_as_the_recording_one():
    recorded_here = torch.backends.cpu.get_cpu_capability() == EXECUTOR["cpu_capability"]
    assert rounds_as_recorded(EXECUTOR["products"]) is recorded_here
    assert rounds_as_recorded("0" * 64) is False
