"""The exact search (bytecomp/search/exact.py): its bound below every completion, its
time cap and what it says when the cap stops it, small problems proven by default."""

from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import replace

import pytest
from test_planner import FIXED, SMALL_INSTANCES

from bytecomp.costs.clusters import load_cluster
from bytecomp.profile_store import save_profile
from bytecomp.search import Planner
from bytecomp.search.exact import _CapSearch, exact_search, relaxed_ms
from bytecomp.testing.synthetic import lstm_shapes, synthetic_profile


def v100(inter_gbps: float):
    cluster = load_cluster("v100-nvlink-100g")
    return replace(cluster, name=f"8 x 8 V100 at {inter_gbps:g} Gbit/s",
                   inter=replace(cluster.inter, bandwidth_gbps=inter_gbps))


def lstm():
    return synthetic_profile(lstm_shapes(), world_size=8, nodes=1, backward_ms=10.0)


def _fix(search: _CapSearch, position: int, option: int) -> None:
    """Fix the tensor at ``position`` as the tree does (the tensors in its order)."""
    bucket = search.owner[position]
    blocks = [list(block) for block in search.blocks[bucket]]
    options = list(search.chosen[bucket])
    if option in options:
        blocks[options.index(option)].append(position)
    else:
        blocks.append([position])
        options.append(option)
    search.left[bucket] -= 1
    search.partial[position] = option
    if search.left[bucket] == 0:
        ordered = sorted(zip(blocks, options), key=lambda item: min(item[0]))
        blocks = [sorted(block) for block, _ in ordered]
        options = [option for _, option in ordered]
        search.current[bucket] = search._groups(bucket, blocks, options)
    else:
        search.current[bucket] = search._partial_groups(bucket, blocks, options)
    search.blocks[bucket], search.chosen[bucket] = blocks, options


@pytest.mark.slow
def test_the_bound_is_below_every_plan_it_bounds():
    """At random nodes of the tree (every small instance, with interference, the
    executor's fixed costs, busy collectives, both objectives), the bound is at most the
    best completion found by brute force (those that run without the executor aside:
    the search starts from them). The model's own simulation of a partial plan was
    above a plan by 0.005 ms on an LSTM, and the lower bound's price per element for a
    bucket's tensors left by 0.1 us here: neither is used."""
    rng = random.Random(1)
    checked = 0
    for shapes, (world, nodes), device, specs, caps in SMALL_INSTANCES:
        for bandwidth, interference, fixed, busy in ((1.0, 0.0, None, 0.0),
                                                      (10.0, 0.3, FIXED, 0.2)):
            for objective in ("time", "effective"):
                profile = synthetic_profile(shapes, world_size=world, nodes=nodes,
                                            device=device,
                                            specs=specs + ["fp16", "powersgd:rank=4"],
                                            bandwidth_gbps=bandwidth,
                                            interference=interference, fidelity=True)
                if fixed:
                    profile.meta["executor"] = fixed
                profile.meta["interference"]["busy_collective_ms"] = busy
                planner = Planner(profile, None, specs, strict=True, objective=objective)
                view = planner.problem.restricted(len(planner.searchable))
                count = len(view.options)
                for cap in caps:
                    values = {plan: view.evaluate(list(plan), cap) for plan in
                              itertools.product(range(count), repeat=len(view.tensors))
                              if not view.is_native(list(plan), cap)}
                    for _ in range(6):
                        search = _CapSearch(view, cap)
                        fixed_options: dict[int, int] = {}
                        for position in search.sequence:
                            option = rng.randrange(count)
                            _fix(search, position, option)
                            fixed_options[position] = option
                            best = min((value for plan, value in values.items()
                                        if all(plan[p] == o for p, o in fixed_options.items())),
                                       default=math.inf)
                            assert search._bound() <= best + 1e-9
                            checked += 1
    assert checked > 500


def test_the_relaxed_timeline_of_a_whole_plan_is_below_the_model():
    """A whole plan's relaxed time is at most the model's, and equal where nothing waits
    (here: an LSTM on a fast network)."""
    planner = Planner(lstm(), v100(100.0), ["topk:ratio=0.01"])
    problem = planner.problem
    rng = random.Random(0)
    for _ in range(200):
        plan = [rng.randrange(len(planner.searchable)) for _ in problem.tensors]
        for cap in (0.0, 1.0, 25.0, 100.0):
            model = problem.iteration_model(cap, problem.is_native(plan, cap))
            relaxed = relaxed_ms(model, problem._groups_by_bucket(plan, cap))
            assert relaxed <= problem.simulate(plan, cap).iteration_ms + 1e-9


def test_small_problems_are_proven_optimal_by_default():
    """A 10-tensor LSTM with top-k on 8 x 8 V100 at 25 Gbit/s: the default search proves
    its plan optimal (no annealing) and says so; the plan is the one a search of every
    option finds, or better."""
    profile = lstm()
    result = Planner(profile, v100(25.0), ["topk:ratio=0.01"]).search()
    assert result.exact and result.algorithm == "exact (branch and bound)"
    assert result.gap_text() == "optimal"
    local = Planner(profile, v100(25.0), ["topk:ratio=0.01"]).search(
        algorithm="local", evaluations=3000)
    assert result.value <= local.value + 1e-9


@pytest.mark.slow
def test_the_exact_search_stops_at_its_budget_and_says_what_it_proved():
    """--algorithm exact on a problem it cannot prove in the time given (an LSTM with every
    compressor): the search ends within the budget or, where the default search it
    starts with takes longer, right after it, returns a plan no worse than the default
    search's, and a note says it stopped at the cap and how far the plan may be from
    the optimum."""
    profile = lstm()
    started = time.process_time()  # (the processor's time: what other processes take
    default = Planner(profile, v100(10.0)).search()  # of a loaded machine is not counted)
    default_s = time.process_time() - started
    started = time.process_time()
    result = Planner(profile, v100(10.0)).search(algorithm="exact", budget_s=0.2)
    assert time.process_time() - started < default_s + 0.2 + 0.5
    assert not result.exact
    assert result.algorithm.endswith("then branch and bound, stopped at its time cap")
    note = next(note for note in result.notes if note.startswith("exact search"))
    assert note.startswith("exact search stopped at its 0.2 s cap (--budget) before proving "
                           "the optimum: the plan is the best found, gap <= ")
    assert result.value <= default.value + 1e-9


def test_the_exact_search_keeps_its_incumbent_when_it_cannot_do_better():
    """Stopped at once (a node limit of 0), the search returns the incumbent it was given,
    unproven, with every cap unfinished."""
    planner = Planner(lstm(), v100(25.0), ["topk:ratio=0.01"])
    view = planner.problem.restricted(len(planner.searchable))
    start = view.uniform(0)
    value = view.evaluate(start, 25.0)
    found = exact_search(view, [0.0, 25.0], start, 25.0, value, node_limit=0)
    assert not found.proven and found.value <= value
    assert found.searched == [] and set(found.unfinished) == {0.0, 25.0}


def test_plan_with_the_exact_algorithm_prints_what_it_proved(cli, tmp_path):
    """The command line: a budget the exact search cannot prove in is a note, not an error,
    and the plan is written."""
    save_profile(lstm(), tmp_path / "lstm")
    done = cli("plan", tmp_path / "lstm", "--cluster", "v100-nvlink-100g", "--algorithm",
               "exact", "--budget", "0.1", "--no-verify", "--out", tmp_path / "plan.yaml")
    assert done.returncode == 0, done.stderr
    assert "note: exact search stopped at its 0.1 s cap (--budget)" in \
        " ".join(done.stderr.split())
    assert (tmp_path / "plan.yaml").exists()

