"""Plans chosen by measured steps: the finalists a search keeps, the choice by predicted
time x measured steps factor, the plan file's record of them, and `bytecomp plan`
training them on the profiled ranks."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bytecomp.errors import BytecompError
from bytecomp.plan_file import load_plan, plan_from_dict
from bytecomp.search import Planner
from bytecomp.search.finalists import STEPS_TOLERANCE, Finalist, choose, shortlist
from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


def finalist(name, time_ms, factor, fidelity=1.0):
    return Finalist(name, "search", [0], 25.0, time_ms, fidelity, factor)


def test_measured_steps_decide_where_gains_and_steps_disagree():
    """The plan whose gains look best (fidelity 0.95) needs 1.5x fp32's steps; the one
    whose gains look worst (0.6) needs fp32's: measured steps win."""
    good_gains = finalist("good gains", 100.0, 1.5, fidelity=0.95)
    good_steps = finalist("good steps", 110.0, 1.0, fidelity=0.6)
    fp32 = finalist("fp32 DDP", 180.0, 1.0)
    choice = choose([fp32, good_gains, good_steps])
    assert choice.finalist is good_steps
    assert "110.00 ms x 1.00" in choice.reason
    # by gains (the effective time the search ranks by), the other would have won
    assert good_gains.time_ms / good_gains.fidelity < good_steps.time_ms / good_steps.fidelity


def test_within_the_steps_tolerance_the_faster_wins():
    slower = finalist("slower, fewer steps", 120.0, 1.00)
    faster = finalist("faster", 100.0, 1.00 + STEPS_TOLERANCE / 2)
    far = finalist("faster, many more steps", 80.0, 1.6)
    assert choose([slower, faster, far]).finalist is faster
    assert choose([slower, finalist("a bit more", 119.0, 1.0 + 2 * STEPS_TOLERANCE)]) \
        .finalist is slower


def test_a_steps_factor_compares_the_steps_to_the_same_losses():
    """fp32 DDP against itself is 1, however noisy its curve; a curve that takes twice the
    steps to every loss is 2; one that never gets there is the cap."""
    from bytecomp.training.finalist_runs import matched_factor
    from bytecomp.training.probe import MAX_FACTOR

    noisy = [(0, 5.0), (10, 3.0), (20, 2.0), (30, 2.2), (40, 1.5), (50, 1.6), (60, 1.2)]
    assert matched_factor(noisy, noisy, 30) == 1.0
    slower = [(0, 5.0)] + [(2 * s, loss) for s, loss in noisy[1:]]
    assert matched_factor(slower, noisy, 30) == pytest.approx(2.0)
    stuck = [(s, 4.0) for s, _ in noisy]
    assert matched_factor(stuck, noisy, 30) == MAX_FACTOR


def test_untrained_finalists_are_chosen_by_predicted_time():
    assert choose([finalist("a", 10.0, None), finalist("b", 9.0, None)]).finalist.name == "b"


@pytest.fixture(scope="module")
def planned():
    """A synthetic 2-rank MLP on a slow link, with gains and a probe, and its search."""
    shapes = mlp_shapes(3, 512)
    probe = {"fp16": 1.0, "powersgd:rank=4": 1.2, "topk:ratio=0.01": 2.0}
    profile = synthetic_profile(shapes, world_size=2, bandwidth_gbps=0.1, device="cpu",
                                fidelity=True, probe=probe)
    planner = Planner(profile)
    return planner, planner.search(min_gain=10)


def test_the_shortlist_holds_fp32_first_the_plan_the_hooks_and_other_mixes(planned):
    planner, result = planned
    finalists = shortlist(planner, result)
    names = [f.name for f in finalists]
    assert names[0] == "fp32 DDP" and "bytecomp plan" in names
    assert any(n.startswith("PowerSGD hook (rank 4)") for n in names)
    assert any(f.source == "mix" and "or nothing" in f.name for f in finalists)
    fp32 = finalists[0]
    assert all(f.time_ms < fp32.time_ms for f in finalists[1:])  # slower ones left out
    keys = [(tuple(f.assignment), f.cap_mb) for f in finalists]
    assert len(keys) == len(set(keys)) and len(finalists) <= 6
    hook = next(f for f in finalists if f.name.startswith("PowerSGD hook"))
    assert planner.problem.one_bucket(hook.cap_mb)  # the hook needs one bucket


def test_a_synthetic_profile_cannot_be_verified(planned):
    from bytecomp.search.verify import verify

    planner, result = planned
    with pytest.raises(BytecompError, match="synthetic.*--no-verify"):
        verify(planner, result)


def _plan_with(finalists) -> dict:
    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "benchmarks/results/emulated/cnn-2x1-1gbit/plan.yaml")
                          .read_text())
    data["finalists"] = finalists
    return data


GOOD = [{"name": "fp32 DDP", "source": "baseline", "bucket_cap_mb": 25.0, "predicted_ms": 10.0,
         "fidelity": 1.0, "steps_factor": 1.0, "value": 10.0, "chosen": False},
        {"name": "bytecomp plan", "source": "search", "bucket_cap_mb": 25.0, "predicted_ms": 8.0,
         "fidelity": 0.9, "steps_factor": 1.1, "value": 8.8, "chosen": True}]


def test_a_plans_finalists_round_trip():
    plan = plan_from_dict(_plan_with(GOOD))
    assert plan.info["finalists"][1]["chosen"]
    again = plan_from_dict(plan.to_dict())
    assert again.info["finalists"] == GOOD


def test_a_factor_s_range_within_the_noise_floor_round_trips_and_is_optional():
    import copy

    ranged = copy.deepcopy(GOOD)
    ranged[1].update(steps_factor_low=0.95, steps_factor_high=10.0)
    data = _plan_with(ranged)
    data["verification"] = {"steps": 96, "batches": "validation", "seconds": 30.0,
                            "fp32_improvement": 0.4, "fp32_last_quarter": 0.01,
                            "chosen": "bytecomp plan", "reason": "r", "loss_floor": 0.0123}
    plan = plan_from_dict(data)
    again = plan_from_dict(plan.to_dict())
    assert again.info["finalists"] == ranged
    assert again.info["verification"]["loss_floor"] == 0.0123
    assert plan_from_dict(_plan_with(GOOD)).info["finalists"] == GOOD  # older files read
    data["verification"]["loss_floor"] = -1
    with pytest.raises(BytecompError, match=r"verification\.loss_floor"):
        plan_from_dict(data)


@pytest.mark.parametrize("damage,message", [
    (lambda f: f[1].update(steps_factor_low=0.9), "finalists[1].steps_factor_high"),
    (lambda f: f[1].update(steps_factor_low=1.2, steps_factor_high=2.0),
     "finalists[1].steps_factor_low: the range 1.2 to 2.0 must hold the steps_factor"),
    (lambda f: f[1].update(steps_factor_low=0.9, steps_factor_high=11.0),
     "finalists[1].steps_factor_high"),
    (lambda f: f[0].update(chosen=True), "exactly one must be chosen, 2 are"),
    (lambda f: f[1].update(steps_factor=math.nan), "finalists[1].steps_factor"),
    (lambda f: f[1].update(predicted_ms=-1), "finalists[1].predicted_ms"),
    (lambda f: f[0].update(fidelity=2), "finalists[0].fidelity"),
    (lambda f: f[0].pop("name"), "finalists[0].name: missing"),
    (lambda f: f.clear(), "finalists: must be a non-empty list"),
])
def test_damaged_finalists_are_one_line_naming_the_field(damage, message):
    import copy

    finalists = copy.deepcopy(GOOD)
    damage(finalists)
    with pytest.raises(BytecompError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_from_dict(_plan_with(finalists))


@pytest.mark.multirank
def test_bytecomp_plan_trains_the_finalists_and_records_them(cli, monkeypatch, tmp_path):
    """A user's recipe on 2 ranks, planned for a slow link: plan trains its finalists with
    the recipe and says what decided; the plan file records them, one chosen."""
    monkeypatch.syspath_prepend(FIXTURES)
    profile = tmp_path / "profile"
    done = cli("profile", "--model", "factories:with_recipe", "--nproc", "2", "--quick",
               "--out", profile, "--compressor", "fp16", "--compressor", "topk:ratio=0.1",
               "--compressor", "powersgd:rank=1", "--probe-steps", "0")
    assert done.returncode == 0, done.stderr
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\nnodes: 2\nranks_per_node: 1\n"
                    "links:\n  inter: {bandwidth_gbps: 0.01, latency_us: 100}\n")
    done = cli("plan", profile, "--cluster", slow, "--out", tmp_path / "plan.yaml",
               "--verify-steps", "60", "--model", "factories:with_recipe")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "finalists, trained 60 steps" in text
    # how many train is the shortlist's call on this measured profile (timing noise moves
    # it); the line must say the count the plan records as trained, fp32 DDP among them
    said = re.search(r"training (\d+) finalists x 60 steps on 2 ranks \(--no-verify skips; "
                     r"--verify-steps sets the count\)", " ".join(done.stderr.split()))
    assert said, done.stderr
    curves = pd.read_csv(tmp_path / "plan.curves.csv")  # the evidence, beside the plan
    table = pd.read_csv(tmp_path / "plan.finalists.csv")
    assert set(curves.finalist) <= set(table.finalist)
    assert curves[curves.curve_from == "trained"].step.max() == 60
    assert table.chosen.sum() == 1 and (tmp_path / "plan.curves.png").stat().st_size > 0
    assert "evidence: the finalists trained 60 steps on the profiled ranks (losses on " \
           "validation" in text
    plan = load_plan(tmp_path / "plan.yaml")
    finalists = plan.info["finalists"]
    assert finalists[0]["name"] == "fp32 DDP" and finalists[0]["steps_factor"] == 1.0
    assert sum(f["chosen"] for f in finalists) == 1 and len(finalists) >= 2
    assert all(f["steps_factor"] is not None for f in finalists)
    chosen = next(f for f in finalists if f["chosen"])
    assert chosen["value"] == min(f["value"] for f in finalists) or \
        "faster" in plan.info["verification"]["reason"]
    assert plan.info["verification"]["steps"] == 60
    trained = set(curves[curves.curve_from == "trained"].finalist)
    assert int(said.group(1)) == len(trained) >= 2 and "fp32 DDP" in trained, trained
    assert plan.predicted_ms["plan"] == pytest.approx(chosen["predicted_ms"], abs=1e-3)
    if plan.adaptive is not None:  # finalists the prediction cannot separate: a trial
        assert plan.adaptive.family == "finalists" and plan.levels[0].setting == "fp32 DDP"
        assert plan.levels[plan.adaptive.start].setting == chosen["name"]
        assert plan.adaptive.start in plan.adaptive.trial
        assert "the running job first times" in " ".join(done.stderr.split())  # a note
    assert plan.bucket_cap_mb == chosen["bucket_cap_mb"]  # the chosen level's cap


def test_finalists_the_prediction_cannot_separate_become_a_runtime_trial(planned):
    """Two finalists within the prediction's error of each other (after their factors):
    the plan keeps both as levels for the running job to time, fp32 DDP as level 0 (where
    the controller steps back to), every level at the chosen one's bucket cap; one
    clearly ahead: the static plan."""
    from bytecomp.plan_file import FINALISTS
    from bytecomp.search.plans import to_plan
    from bytecomp.search.trials import trial_plan
    from bytecomp.search.verify import Verification, chosen_result

    planner, result = planned
    finalists = shortlist(planner, result)
    fp32, *others = finalists
    fp32.steps_factor = 1.0
    best, second, *rest = sorted(others, key=lambda f: f.time_ms)
    best.steps_factor, second.steps_factor = 1.0, best.time_ms / second.time_ms * 1.01
    for other in rest:
        other.steps_factor = 10.0
    verification = Verification(finalists, choose(finalists), 50, "validation", 1.0, 0.5, 0.0)
    assert verification.choice.finalist is best
    chosen = chosen_result(result, verification)
    static = to_plan(chosen, planner.profile)
    plan = trial_plan(planner, chosen, verification, static)
    assert plan is not None and plan.adaptive.family == FINALISTS
    assert plan.levels[0].setting == "fp32 DDP" and plan.levels[0].steps_factor == 1.0
    names = [level.setting for level in plan.levels]
    assert plan.levels[plan.adaptive.start].setting == best.name
    assert sorted(names[i] for i in plan.adaptive.trial) == sorted([best.name, second.name])
    assert plan.adaptive.trial_steps >= 2 and plan.adaptive.explore_every >= 10**9
    assert plan.bucket_cap_mb == best.cap_mb
    from bytecomp.commands.plan import PlanResult, trial_summary

    summary = PlanResult(plan, None, search=chosen).summary  # the command's plan: line
    assert summary.startswith(chosen.composition() + "; the running job first times 2 ")
    assert summary.endswith(trial_summary(plan)) and best.name in summary
    assert f"for {plan.adaptive.trial_steps} steps after {plan.adaptive.trial_warmup}" in summary
    assert PlanResult(static, None, search=chosen).summary == chosen.composition()
    again = plan_from_dict(plan.to_dict())  # a valid plan file
    assert again.adaptive == plan.adaptive and again.digest() == plan.digest()
    second.steps_factor = 2.0  # now clearly behind
    assert trial_plan(planner, chosen, Verification(finalists, choose(finalists), 50,
                                                    "validation", 1.0, 0.5, 0.0),
                      static) is None


def _fp32_chosen(planner, result):
    """Finalists where the search's plan is fp32 allreduce on every tensor at cap 0, chosen
    (predicted faster than fp32 DDP's buckets), with a compressed finalist 2% behind it:
    within the trial's margin. The verification and the plan written from it."""
    from bytecomp.search.plans import to_plan
    from bytecomp.search.trials import trial_plan
    from bytecomp.search.verify import Verification, chosen_result

    finalists = shortlist(planner, result)
    fp32, *others = finalists
    fp32.steps_factor = 1.0
    searched = Finalist("the search's plan", "search", list(fp32.assignment), 0.0,
                        0.8 * fp32.time_ms, 1.0, 1.0)
    near, *rest = sorted(others, key=lambda f: f.time_ms)
    near.steps_factor = 1.02 * searched.time_ms / near.time_ms
    for other in rest:  # diverged: out of the choice and of the trial
        other.steps_factor = math.inf
    finalists = [fp32, searched, near, *rest]
    verification = Verification(finalists, choose(finalists), 50, "validation", 1.0, 0.5, 0.0)
    assert verification.choice.finalist is searched
    chosen = chosen_result(result, verification)
    static = to_plan(chosen, planner.profile)
    return verification, chosen, trial_plan(planner, chosen, verification, static), static


def test_a_verified_plan_that_chose_fp32_has_no_trial_and_the_chosen_cap(planned):
    """The chosen finalist sends every tensor uncompressed: the plan is that plan, static,
    at its own bucket cap (no trial rotating compressed levels behind a summary that says
    fp32), and the search's "the plan is that baseline" note no longer claims otherwise."""
    from bytecomp.search.trials import trial_candidates

    planner, result = planned
    verification, chosen, with_trial, static = _fp32_chosen(planner, result)
    assert len(trial_candidates(planner, verification)) == 2  # a trial was possible
    assert with_trial is None and static.adaptive is None and not static.levels
    assert static.bucket_cap_mb == 0.0 and chosen.cap_mb == 0.0
    assert {entry.compressor for entry in static.entries} == {None}
    assert not any(note.endswith(": the plan is that baseline") for note in chosen.notes)


def _train_fp32_plan(rank, world, data):
    """15 steps (past the trial's 10 of warm-up) of a 3-layer MLP of the synthetic
    profile's tensors with ``data``'s plan: its moves, its switches, its trial lines."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import bytecomp
    from bytecomp.plan_types import fingerprint

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    torch.manual_seed(0)
    model = Net()
    plan = plan_from_dict({**data, "model_fingerprint": fingerprint(model)})
    ddp = DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb)
    executor = bytecomp.apply_plan(ddp, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(15):
        generator = torch.Generator().manual_seed(100 * rank + step)
        ddp(torch.randn(4, 512, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    said = (len(executor.switches), executor.stats.summary()["switches"],
            list(getattr(executor.stats, "trial", [])))
    executor.close()
    return said


@pytest.mark.multirank
def test_a_verified_fp32_plan_trains_with_no_switches(planned):
    """The plan written where fp32 was chosen, trained past the trial's warm-up on 2 ranks:
    no move, no switch, no trial line."""
    from ranks import run_ranks

    planner, result = planned
    _verification, _chosen, with_trial, static = _fp32_chosen(planner, result)
    assert with_trial is None
    assert run_ranks(_train_fp32_plan, 2, static.to_dict()) == [(0, 0, [])] * 2


@pytest.mark.parametrize("step_ms, candidates, expected", [
    (10.0, 2, 9), (10.0, 3, 10), (25.0, 2, 3), (20.0, 5, 4), (50.0, 2, 1), (500.0, 4, 1)])
def test_a_trial_s_agreement_never_falls_on_one_candidate_s_steps_alone(step_ms, candidates,
                                                                        expected):
    """The candidates take turns step by step and the agreement's allreduce slows the step
    after it: its interval is coprime with their number, so that cost visits each in turn
    (the ladder's interval, 100 ms of steps at most 10, otherwise)."""
    import math

    from bytecomp.search.ladder import agreement_interval
    from bytecomp.search.trials import trial_agreement

    interval = trial_agreement(step_ms, candidates)
    assert interval == expected and math.gcd(interval, candidates) == 1
    assert interval <= agreement_interval(step_ms, 10)
    steps = range(1, candidates * interval * 3 + 1)  # the steps after an agreement
    slowed = [(step - 1) % candidates for step in steps if (step - 1) % interval == 0]
    assert {turn: slowed.count(turn) for turn in range(candidates)} == \
        {turn: len(slowed) // candidates for turn in range(candidates)}


@pytest.mark.clock
@pytest.mark.multirank
def test_the_budgets_are_held_on_the_clock(cli, monkeypatch, tmp_path):
    """A recipe whose every step sleeps (as on a busy machine): profile --budget 45 ends
    within 45 s + 20% + one probe step, its stages held to their shares and its probe
    fitted to what they left; plan --verify-budget 20 ends the finalists' training, on
    every rank (they stop together, and the parent waits for all), within 20 s + 20% +
    one interleaved step of all finalists."""
    import time

    monkeypatch.syspath_prepend(FIXTURES)
    profile = tmp_path / "profile"
    started = time.monotonic()
    done = cli("profile", "--model", "factories:slow_step", "--nproc", "2", "--quick",
               "--out", profile, "--compressor", "fp16", "--compressor", "topk:ratio=0.1",
               "--budget", "45")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    meta = yaml.safe_load((profile / "profile.yaml").read_text())
    probe = meta["probe"]
    assert probe["length"] == "budget" and probe["ran_steps"] >= 10, (probe, meta["stages_s"])
    assert took <= 45 * 1.2 + 0.1 * 3 * 1.5, (took, probe, meta["stages_s"])
    # without a probe, so that plan's finalists are trained (not the probe's configurations)
    profile = tmp_path / "unprobed"
    done = cli("profile", "--model", "factories:slow_step", "--nproc", "2", "--quick",
               "--out", profile, "--compressor", "fp16", "--compressor", "topk:ratio=0.1",
               "--probe-steps", "0")
    assert done.returncode == 0, done.stderr
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\nnodes: 2\nranks_per_node: 1\n"
                    "links:\n  inter: {bandwidth_gbps: 0.01, latency_us: 100}\n")
    started = time.monotonic()
    done = cli("plan", profile, "--cluster", slow, "--out", tmp_path / "plan.yaml",
               "--model", "factories:slow_step", "--verify-budget", "20")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    plan = load_plan(tmp_path / "plan.yaml")
    trained = [f for f in plan.info["finalists"] if f["name"] != "fp32 DDP"]
    step_s = 0.1 * (len(trained) + 1) * 1.5  # every finalist's sleeping step, and its work
    verification = plan.info["verification"]
    assert verification["seconds"] <= 20 * 1.2 + step_s, verification
    assert verification["steps"] >= 10  # it trained, for what the budget afforded
    assert "--verify-budget 20 s" in " ".join(done.stderr.split())
    assert took <= 20 * 1.2 + step_s + 10  # reading, searching and writing around it


def test_finalists_within_the_min_gain_margin_go_to_the_trial(planned):
    """A finalist 8% behind the chosen one (predicted time x measured factor): within a
    --min-gain of 10%, the running job times it; with the margin at its 5% floor, the
    prediction's choice stands alone."""
    from bytecomp.search.plans import to_plan
    from bytecomp.search.trials import trial_plan
    from bytecomp.search.verify import TRIAL_MARGIN, Verification, chosen_result

    planner, result = planned
    assert planner.noise() < 0.08  # the synthetic profile's noise does not widen it
    finalists = shortlist(planner, result)
    fp32, *others = finalists
    fp32.steps_factor = 1.0
    best, second, *rest = sorted(others, key=lambda f: f.time_ms)
    best.steps_factor, second.steps_factor = 1.0, best.time_ms / second.time_ms * 1.08
    for other in rest:
        other.steps_factor = 10.0
    for margin, kept in ((0.10, True), (TRIAL_MARGIN, False)):
        verification = Verification(finalists, choose(finalists), 50, "validation", 1.0, 0.5,
                                    0.0, trial_margin=margin)
        chosen = chosen_result(result, verification)
        plan = trial_plan(planner, chosen, verification, to_plan(chosen, planner.profile))
        assert (plan is not None) == kept, margin
        if plan is not None:
            names = {plan.levels[i].setting for i in plan.adaptive.trial}
            assert names == {best.name, second.name}
            assert plan.adaptive.trial_steps >= 20


def test_an_uncertain_finalist_goes_to_the_trial_rather_than_out(planned):
    """A finalist whose factor the loss's noise floor leaves a range (up to the cap: it
    ended a hair above fp32's losses) is 30% behind the chosen one by its factor, outside
    the margin, but 5% ahead at the low end: the running job times it. The
    same factor measured without a range stays out. The range is in the plan file."""
    from bytecomp.search.plans import to_plan
    from bytecomp.search.trials import trial_candidates, trial_plan
    from bytecomp.search.verify import Verification, chosen_result

    planner, result = planned
    finalists = shortlist(planner, result)
    fp32, *others = finalists
    fp32.steps_factor = 1.0
    best, second, *rest = sorted(others, key=lambda f: f.time_ms)
    best.steps_factor = 1.0
    second.steps_factor = best.time_ms / second.time_ms * 1.3
    for other in rest:
        other.steps_factor = 10.0
    for ranged in (False, True):
        # at its low end it is 5% ahead of the chosen one
        second.steps_low, second.steps_high = (0.95 * best.time_ms / second.time_ms, 10.0) \
            if ranged else (None, None)
        assert second.uncertain == ranged
        verification = Verification(finalists, choose(finalists), 50, "validation", 1.0, 0.5,
                                    0.0)
        assert verification.choice.finalist is best
        candidates = [f.name for f in trial_candidates(planner, verification)]
        assert candidates == ([best.name, second.name] if ranged else [best.name]), candidates
        chosen = chosen_result(result, verification)
        plan = trial_plan(planner, chosen, verification, to_plan(chosen, planner.profile))
        assert (plan is not None) == ranged
    meta = second.to_meta(False)
    assert meta["steps_factor_low"] == round(second.steps_low, 4)
    assert meta["steps_factor_high"] == 10.0
    assert "steps_factor_low" not in best.to_meta(True)


def test_a_short_list_keeps_a_plan_of_a_second_kind(planned):
    """However short the list, the best "X or nothing" mix stays beside the searched
    plan and the hooks: the runtime trial's real alternative."""
    planner, result = planned
    full = shortlist(planner, result)
    mixes = [f.name for f in full if f.source == "mix"]
    assert mixes
    for limit in (3, 4):
        short = shortlist(planner, result, limit=limit)
        assert len(short) == limit and short[0].name == "fp32 DDP"
        assert short[-1].name == mixes[0] and short[1].name == "bytecomp plan"


def test_the_trial_runs_where_the_lead_is_within_the_model_s_measured_error(planned):
    """The searched plan is predicted 20% ahead of the best hand-picked finalist (after
    factors). Measured on the profiled ranks, searched plans ran 1.64x their prediction
    and hand-picked ones 1.15x: the lead is within that error (43%), so the trial times
    the alternative; measured as predicted, the static plan stands. The error is
    recorded in the plan file."""
    from bytecomp.search.trials import alternative, trial_candidates
    from bytecomp.search.verify import Verification, kind_of, model_errors

    planner, result = planned
    assert planner.cluster.measured
    finalists = shortlist(planner, result)
    for f in finalists:
        f.steps_factor = 10.0
    chosen = next(f for f in finalists if f.name == "bytecomp plan")
    hand = [f for f in finalists if kind_of(f) == "hand-picked" and f.name != "fp32 DDP"]
    assert hand and kind_of(chosen) == "searched"
    chosen.steps_factor = 1.0
    other = hand[0]
    other.steps_factor = 1.2 * chosen.time_ms / other.time_ms
    finalists[0].steps_factor = 1.0
    for slow_searched, kept in ((1.64, True), (1.0, False)):
        step_ms = {f.name: f.time_ms * (slow_searched if kind_of(f) == "searched" else 1.15)
                   for f in finalists}
        verification = Verification(finalists, choose(finalists), 50, "validation", 1.0,
                                    0.5, 0.0, step_ms=step_ms)
        assert verification.choice.finalist is chosen
        verification.model_error = model_errors(planner, verification)
        assert verification.model_error["searched"] == pytest.approx(slow_searched)
        assert verification.model_error["hand-picked"] == pytest.approx(1.15)
        assert (alternative(verification) is other) == kept
        names = [f.name for f in trial_candidates(planner, verification)]
        assert (other.name in names) == kept, names
    meta = verification.to_meta()
    assert meta["model_error"] == {"hand-picked": 1.15, "searched": 1.0}
    data = _plan_with(GOOD)
    data["verification"] = {**meta, "chosen": "bytecomp plan"}
    assert plan_from_dict(data).info["verification"]["model_error"] == meta["model_error"]
    data["verification"]["model_error"] = {"searched": 0}
    with pytest.raises(BytecompError, match=r"verification\.model_error"):
        plan_from_dict(data)


def test_the_verification_says_why_it_stopped_and_when_fp32_flattened():
    from bytecomp.search.verify import SETTLED_FALL, Verification, flattened
    from bytecomp.training.convergence import flat, last_quarter

    falling = [(0, 4.0), (25, 2.0), (50, 1.5), (75, 1.2), (100, 1.0)]
    assert last_quarter(falling, 100) == pytest.approx(0.2 / 1.2)
    assert not flat(falling, 100, SETTLED_FALL)
    levelled = falling + [(125, 0.99), (150, 0.985), (175, 0.98), (200, 0.979)]
    assert flat(levelled, 200, SETTLED_FALL)  # 1.0% over steps 150-200, 75% in all
    assert not flat([(0, 4.0), (50, 4.0), (100, 3.99)], 100, SETTLED_FALL)  # not begun
    assert not flat([(0, 4.0), (100, 1.0)], 100, SETTLED_FALL)  # one point in the quarter
    assert flattened(0.75, 0.01) and not flattened(0.02, 0.01) and not flattened(0.5, 0.04)
    one = finalist("fp32 DDP", 10.0, 1.0)
    for stopped_by, budget, says, settled in (
            ("flattened", 60.0, "stopped once fp32 DDP's loss fell 1.0%", True),
            ("budget", 60.0, "stopped by the budget (400 steps planned)", False),
            ("steps", 60.0, "all 400 steps the budget afforded", True),
            ("steps", None, "(--verify-steps); fp32 DDP's loss fell 1.0%", True)):
        verification = Verification([one], choose([one]), 120, "validation", 30.0, 0.7,
                                    0.01 if settled else 0.06, budget_s=budget, planned=400,
                                    stopped_by=stopped_by)
        line = verification.bought()
        assert says.replace("1.0%", "1.0%" if settled else "6.0%") in line, line
        assert ("factors settled" in line) == settled == verification.settled
        assert verification.to_meta()["stopped_by"] == stopped_by


def test_a_chosen_plan_below_min_fidelity_is_said_and_recorded(planned):
    """Measured steps may choose a hand-picked baseline whose predicted fidelity is below
    --min-fidelity (the search itself never does): a note says so, and the plan file
    records the fidelity and the floor, range-checked on load."""
    import copy

    from bytecomp.search.verify import Verification, _overridden

    planner, _ = planned
    floor = planner.problem.objective.min_fidelity
    assert planner.problem.objective.uses_fidelity and floor > 0
    low = finalist("PowerSGD hook (rank 1)", 50.0, 1.0, fidelity=floor - 0.1)
    fp32 = finalist("fp32 DDP", 100.0, 1.0)
    verification = _overridden(Verification([fp32, low], choose([fp32, low]), 60,
                                            "validation", 1.0, 0.5, 0.01), planner)
    assert verification.choice.finalist is low
    assert any(f"below --min-fidelity {floor:g}" in note and "measured steps override" in note
               for note in verification.notes)
    recorded = verification.to_meta()["below_min_fidelity"]
    assert recorded == {"fidelity": pytest.approx(floor - 0.1), "min_fidelity": floor}
    kept = _overridden(Verification([fp32, low], choose([fp32]), 60, "validation", 1.0, 0.5,
                                    0.01), planner)
    assert kept.below_min_fidelity is None and "below_min_fidelity" not in kept.to_meta()
    finalists = copy.deepcopy(GOOD)
    data = _plan_with(finalists)
    data["verification"] = {"steps": 60, "batches": "validation", "seconds": 1.0,
                            "fp32_improvement": 0.5, "fp32_last_quarter": 0.01,
                            "chosen": "bytecomp plan", "reason": "r", "stopped_by": "flattened",
                            "below_min_fidelity": recorded}
    assert plan_from_dict(data).info["verification"]["below_min_fidelity"] == recorded
    for key, bad in (("stopped_by", "bored"), ("below_min_fidelity", {"fidelity": 2})):
        damaged = copy.deepcopy(data)
        damaged["verification"][key] = bad
        with pytest.raises(BytecompError, match=f"verification.{key}"):
            plan_from_dict(damaged)


def _train_until_flat(rank, world, flat_fall):
    """fp32 DDP on a small teacher task for at most 600 steps, evaluated every 10: the
    steps trained, whether it stopped because the loss flattened, and the curve."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from bytecomp.training.convergence import ConvergenceConfig, train_curves
    from bytecomp.training.probe import Trainee
    from bytecomp.training.workloads import load_workload

    torch.manual_seed(0)
    workload = load_workload("mlp:inputs=16,width=32,depth=2")
    ddp = DistributedDataParallel(workload.model)
    trainee = Trainee("fp32 DDP", ddp, torch.optim.Adam(workload.model.parameters(), lr=0.01))
    evidence, _ = workload.evidence_batches(32)
    config = ConvergenceConfig(600, 10, flat_fall=flat_fall, flat_least=50)
    training = train_curves([trainee], workload, 32, torch.device("cpu"), config, evidence)
    return training.steps, training.stopped_flat, training.curves["fp32 DDP"]


@pytest.mark.multirank
def test_training_stops_once_fp32s_loss_has_flattened():
    """With a flatness threshold the run stops at the first evaluation (after the least
    steps) where fp32's loss fell by at most it over the last quarter, on every rank
    alike; without one it trains every step."""
    from bytecomp.training.convergence import flat

    from ranks import run_ranks

    (steps, stopped, curve), other = run_ranks(_train_until_flat, 2, 0.03)
    assert other == (steps, stopped, curve)
    assert stopped and 50 <= steps < 600 and curve[-1][0] == steps
    assert flat(curve, steps, 0.03)
    earlier = [s for s, _ in curve if 50 <= s < steps]  # no evaluation before it was flat
    assert not any(flat([p for p in curve if p[0] <= s], s, 0.03) for s in earlier)
    (steps, stopped, curve), _ = run_ranks(_train_until_flat, 2, None)
    assert steps == 600 and not stopped


def test_the_evidence_shows_every_finalist_s_curve_and_where_it_came_from():
    """Trained finalists' curves as measured; one whose factor the probe measured (or an
    uncompressed one: fp32's steps) as fp32 DDP's curve stretched by that factor, marked
    so; one that diverged (an infinite factor) has none."""
    import csv
    import io

    from bytecomp.search.evidence import curves_csv, finalist_curves
    from bytecomp.search.verify import Verification

    def finalist(name, factor, time_ms=10.0):
        return Finalist(name, "baseline", [0], 25.0, time_ms, 1.0, factor)

    finalists = [finalist("fp32 DDP", 1.0), finalist("topk", 1.1, 5.0),
                 finalist("fp16 hook", 1.5, 8.0), finalist("fp32 at cap 0", 1.0, 9.0),
                 finalist("sign", math.inf, 2.0)]
    fp32 = [[0, 4.0], [10, 3.0], [20, 2.5]]
    verification = Verification(finalists, choose(finalists), 20, "validation", 1.0, 0.4,
                                0.1, curves={"fp32 DDP": fp32, "topk": [[0, 4.0], [20, 2.9]]},
                                factor_from={"fp32 DDP": "fp32", "topk": "trained",
                                             "fp16 hook": "probe", "fp32 at cap 0": "fp32",
                                             "sign": "trained"})
    curves = finalist_curves(verification)
    assert {name: origin for name, (_, origin) in curves.items()} == {
        "fp32 DDP": "trained", "topk": "trained", "fp16 hook": "probe",
        "fp32 at cap 0": "fp32"}
    assert curves["fp16 hook"][0] == [[0, 4.0], [15, 3.0], [30, 2.5]]
    rows = list(csv.DictReader(io.StringIO(curves_csv(verification))))
    assert {row["finalist"] for row in rows} == set(curves)
    probe = [row for row in rows if row["finalist"] == "fp16 hook"]
    assert [row["curve_from"] for row in probe] == ["probe"] * 3
    assert float(probe[-1]["predicted_s"]) == pytest.approx(30 * 8.0 / 1000)
