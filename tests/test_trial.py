"""The runtime trial: a verified plan's finalists that the prediction cannot separate,
timed in the running job, the same decision on every rank, resumed bit for bit."""

from __future__ import annotations

import io

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.plan_file import FINALISTS, ladder_for_model, plan_from_dict
from bytecomp.plan_types import Adaptive, Option
from bytecomp.runtime.trial import Trial

from ranks import run_ranks


def test_the_trial_takes_the_candidates_in_turn_after_its_warmup():
    trial = Trial([2, 0, 3], warmup=4, steps=6, factors=[1.0] * 4)
    assert [trial.level_for(step, fallback=1) for step in range(12)] == \
        [1, 1, 1, 1, 2, 0, 3, 2, 0, 3, 1, 1]


def test_it_keeps_the_least_median_time_x_steps_factor_once_all_is_measured():
    trial = Trial([1, 2], warmup=2, steps=6, factors=[1.0, 1.0, 1.5])
    for level, ms in [(0, 99.0), (0, 99.0), (1, 10.0), (2, 6.0), (1, 10.2), (2, 6.1),
                      (1, 10.1), (2, 6.05)]:
        assert trial.decide() is None  # not all measured yet
        trial.observe(level, ms)
    # level 1: median 10.1 x 1.0; level 2: median 6.05 x 1.5 = 9.075, 10% ahead where one
    # step's noise is about 1%
    assert trial.decide() == 2 and trial.scores() == {1: pytest.approx(10.1),
                                                      2: pytest.approx(9.075)}
    assert trial.rounds == 1 and "level 2 is ahead" in trial.verdict
    assert 0 not in trial.samples  # the warm-up's steps are not the trial's


def _measure(trial, times):
    """Observe ``times`` (level, ms) in order, asking for a decision after each, as the
    executor does: the decisions made."""
    decisions = []
    for level, ms in times:
        trial.observe(level, ms)
        decisions.append(trial.decide())
    return decisions


def test_within_its_noise_it_repeats_once_then_keeps_the_safer_level():
    """Levels 2% apart in steps that spread 10%: not a decision. The trial runs its window
    again (the turns go on), and still tied keeps the lower (safer) of the two, whichever
    was faster and whichever was the plan's choice."""
    trial = Trial([3, 1], warmup=0, steps=6, factors=[1.0] * 4)
    round_1 = [(3, 100.0), (1, 102.0), (3, 90.0), (1, 112.0), (3, 110.0), (1, 92.0)]
    assert _measure(trial, round_1) == [None] * 6
    assert trial.rounds == 2 and not trial.decided
    assert [trial.level_for(step, fallback=3) for step in range(6, 13)] == [3, 1, 3, 1, 3, 1, 3]
    assert _measure(trial, round_1)[-1] == 1 and trial.chosen == 1
    assert "the safer, level 1, is kept" in trial.verdict and "after 2 rounds" in trial.verdict
    assert trial.scores()[3] < trial.scores()[1]  # the faster by its medians, inside the noise


def test_identical_levels_keep_the_safer_and_a_repeat_can_separate_them():
    same = Trial([2, 1], warmup=0, steps=4, factors=[1.0] * 3)
    _measure(same, [(2, 5.0), (1, 5.0)] * 4)
    assert same.chosen == 1 and "safer" in same.verdict  # no spread, no difference: a tie
    # a noisy first round, then a second whose steps separate them (all samples pooled)
    noisy = Trial([1, 2], warmup=0, steps=4, factors=[1.0] * 3)
    assert _measure(noisy, [(1, 10.0), (2, 6.0), (1, 6.0), (2, 10.0)]) == [None] * 4
    decisions = _measure(noisy, [(1, 10.0), (2, 6.0), (1, 10.1), (2, 6.1)])
    assert decisions[-1] == 2 and "ahead" in noisy.verdict


def test_too_few_samples_measure_no_noise_and_decide_nothing():
    trial = Trial([1, 2], warmup=0, steps=2, factors=[1.0] * 3)
    _measure(trial, [(1, 10.0), (2, 5.0)])  # one sample each: the spread is unmeasured
    assert trial.noise() == float("inf") and trial.rounds == 2 and not trial.decided
    _measure(trial, [(1, 10.0), (2, 5.0)])  # two turns: still too few to measure a spread
    assert trial.chosen == 1 and "standard error unmeasured" in trial.verdict
    three = Trial([1, 2], warmup=0, steps=6, factors=[1.0] * 3)
    _measure(three, [(1, 10.0), (2, 5.0)] * 3)  # three turns alike: no spread, 2x apart
    assert three.chosen == 2 and "standard error 0.0%" in three.verdict
    lone = Trial([2, 1], warmup=0, steps=2, factors=[1.0] * 3)
    _measure(lone, [(2, 5.0), (1, None), (2, 5.0), (1, None)])  # level 1 never timed
    assert lone.chosen == 2 and "the only candidate timed" in lone.verdict


def test_its_state_round_trips_and_damage_is_one_line():
    trial = Trial([1, 2], warmup=1, steps=4, factors=[1.0] * 3)
    for level, ms in [(0, 5.0), (1, 4.0), (2, 3.0)]:
        trial.observe(level, ms)
    again = Trial([1, 2], warmup=1, steps=4, factors=[1.0] * 3)
    again.load_state_dict(trial.state_dict())
    assert again == trial
    repeated = Trial([1, 2], warmup=0, steps=2, factors=[1.0] * 3)
    _measure(repeated, [(1, 4.0), (2, 4.0)])
    assert repeated.rounds == 2  # one sample each: no noise measured, the repeat
    again = Trial([1, 2], warmup=0, steps=2, factors=[1.0] * 3)
    again.load_state_dict(repeated.state_dict())
    assert again == repeated
    older = {k: v for k, v in trial.state_dict().items() if k not in ("rounds", "verdict")}
    again.load_state_dict(older)  # saved before the repeat existed: its first round
    assert again.rounds == 1 and again.samples == trial.samples
    for damaged in ({"seen": -1, "chosen": None, "samples": {}},
                    {"seen": 3, "chosen": 7, "samples": {}},
                    {"seen": 3, "chosen": None, "samples": {"1": [float("nan")]}},
                    {"seen": 3, "chosen": None, "samples": {}, "rounds": 3},
                    {"seen": 3, "chosen": None, "samples": {}, "verdict": 5},
                    {"seen": "x"}, None):
        with pytest.raises(BytecompError, match="trial"):
            Trial([1, 2], 1, 4, [1.0] * 3).load_state_dict(damaged)


def _finalists(model, world, trial=(1, 2), steps=6, warmup=2, start=1):
    """A verified plan's shape: fp32 DDP, top-k 10% and PowerSGD rank 1 (factors 1, 1.0,
    1.5) as levels, the trial over the last two."""
    options = [Option(), Option("topk:ratio=0.1", "device", "allgather"),
               Option("powersgd:rank=1", "device", "allreduce")]
    adaptive = Adaptive(FINALISTS, threshold=0.0, explore_every=10**9, start=start,
                        trial=tuple(trial), trial_steps=steps, trial_warmup=warmup)
    plan = ladder_for_model(model, [lambda n, p, o=o: o for o in options], world, adaptive,
                            bucket_cap_mb=0.01, predicted_ms=[10.0, 6.0, 5.0])
    data = plan.to_dict()
    for level, factor in zip(data["levels"], (1.0, 1.0, 1.5)):
        level["steps_factor"] = factor
    return plan_from_dict(data)


def _batch(rank, step):
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 32, generator=generator), torch.randint(0, 10, (8,),
                                                                   generator=generator)


def _train(rank, world, steps, resume_at=None):
    """Train with the finalists' plan, each step reported as 10 ms at level 1 and 7 ms at
    level 2 (rank 1 a little slower): the trial keeps level 2 (7 x 1.5 = 10.5 > 10 x 1.0)
    ... unless the ranks disagree. The parameters, the levels step by step, the moves."""
    from bytecomp.training.workloads import load_workload

    torch.manual_seed(0)
    workload = load_workload("mlp:inputs=32,width=64,depth=2")
    plan = _finalists(workload.model, world)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, plan)
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.05)
    levels = []
    for step in range(steps):
        if step == resume_at:
            saved = io.BytesIO()
            torch.save({"bytecomp": executor.state_dict(),
                        "optimizer": optimizer.state_dict()}, saved)
            executor.close()
            ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
            executor = bytecomp.apply_plan(ddp, plan)
            saved.seek(0)
            executor.load_state_dict(torch.load(saved, weights_only=True)["bytecomp"])
        inputs, target = _batch(rank, step)
        workload.loss(ddp(inputs), target).backward()
        optimizer.step()
        optimizer.zero_grad()
        levels.append(executor.level)
        executor.report_step_ms({0: 20.0, 1: 10.0, 2: 7.0}[executor.level] + rank * 0.5)
    parameters = torch.cat([p.detach().reshape(-1) for p in workload.model.parameters()])
    moves = [s.to_list()[:3] for s in executor.switches]
    trial = executor.adaptation.trial.state_dict()
    executor.close()
    return parameters, levels, moves, trial


@pytest.mark.multirank
@pytest.mark.smoke
def test_every_rank_runs_the_same_trial_and_keeps_the_same_finalist():
    runs = run_ranks(_train, 2, 16)
    (parameters, levels, moves, trial), (other, levels_1, moves_1, trial_1) = runs
    assert torch.equal(parameters, other) and levels == levels_1 and moves == moves_1
    assert trial == trial_1
    # steps 0-1 at the plan's choice (level 1), 2-7 in turn, then the kept one
    assert levels[:2] == [1, 1] and levels[2:8] == [1, 2, 1, 2, 1, 2]
    # level 1: 10.25 ms x 1.0 = 10.25 (the ranks' mean); level 2: 7.25 x 1.5 = 10.875
    assert trial["chosen"] == 1 and set(levels[10:]) == {1}, (levels, trial)
    assert moves and all(source != target for _, source, target in moves)


@pytest.mark.multirank
@pytest.mark.parametrize("resume_at", [5, 9])  # inside the trial; measured, not yet decided
def test_a_run_resumed_inside_the_trial_continues_bit_for_bit(resume_at):
    straight = run_ranks(_train, 2, 16)
    resumed = run_ranks(_train, 2, 16, resume_at)
    for (p, levels, moves, trial), (q, levels_r, moves_r, trial_r) in zip(straight, resumed):
        assert torch.equal(p, q)
        assert levels == levels_r and moves == moves_r and trial == trial_r


def _twins(model, world, start):
    """fp32 DDP, then two identical levels (fp16, steps factor 1), both in the trial: 12
    steps a round after 6 of warm-up (a new model's first steps are slow), starting at
    ``start``."""
    fp16 = Option("fp16", "device", "allreduce")
    adaptive = Adaptive(FINALISTS, threshold=0.0, explore_every=10**9, start=start,
                        trial=(start, 3 - start), trial_steps=12, trial_warmup=6)
    plan = ladder_for_model(model, [lambda n, p: Option(), lambda n, p: fp16,
                                    lambda n, p: fp16], world, adaptive, bucket_cap_mb=0.01,
                            predicted_ms=[10.0, 6.0, 6.0])
    data = plan.to_dict()
    for level in data["levels"]:
        level["steps_factor"] = 1.0
    return plan_from_dict(data)


def _kept(rank, world, start, slow_level, runs):
    """``runs`` trials in a row, each with a fresh DDP model and executor, every step timed
    by the executor itself (the machine's real noise); a step at ``slow_level`` sleeps 20
    ms more. The level each trial kept, its verdict, and every rank's agreement."""
    import time

    from bytecomp.training.workloads import load_workload

    kept = []
    for run in range(runs):
        torch.manual_seed(run)
        workload = load_workload("mlp:inputs=32,width=64,depth=2")
        plan = _twins(workload.model, world, start)
        ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
        executor = bytecomp.apply_plan(ddp, plan)
        optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.05)
        trial = executor.adaptation.trial
        step = 0
        while not trial.decided and step < 60:
            inputs, target = _batch(rank, step)
            workload.loss(ddp(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            if executor.level == slow_level:
                time.sleep(0.02)
            step += 1
        kept.append((trial.chosen, trial.rounds, trial.verdict, executor.level))
        executor.close()
    return kept


@pytest.mark.clock
@pytest.mark.multirank
@pytest.mark.parametrize("start", [1, 2])
def test_identical_levels_keep_the_safer_one_every_time(start):
    """Two identical levels timed by the machine: their medians differ by its noise only,
    and every trial keeps the safer (lower) level, on every rank, whichever is the plan's
    choice. The verdict is a tie after the repeat, or, where a stall of the busy machine
    put one level outside the other's noise (the t threshold is not a promise against
    stalls), level 1 ahead: either way level 1, never the other twin."""
    ranks = run_ranks(_kept, 2, start, None, 4)
    assert ranks[0] == ranks[1]
    for chosen, rounds, verdict, level in ranks[0]:
        assert chosen == 1 and level == 1, ranks[0]
        assert ("the safer, level 1, is kept" in verdict and rounds == 2) or \
            "level 1 is ahead" in verdict, verdict
    ties = sum("the safer, level 1, is kept" in verdict for _c, _r, verdict, _l in ranks[0])
    assert ties >= len(ranks[0]) - 1, ranks[0]  # at most one stall-made call in four


@pytest.mark.clock
@pytest.mark.multirank
def test_a_clearly_faster_level_still_wins():
    """The same twins, level 1's steps 20 ms slower: level 2 is kept every time, on every
    rank, though level 1 is the safer and the plan's choice; in the first round but where
    a loaded machine's noise made that round undecided (at most one call in three: a CI
    run's third trial measured a standard error of 20% and decided in its second)."""
    ranks = run_ranks(_kept, 2, 1, 1, 3)
    assert ranks[0] == ranks[1]
    for chosen, rounds, verdict, level in ranks[0]:
        assert chosen == 2 and level == 2 and rounds <= 2, ranks[0]
        assert "level 2 is ahead" in verdict
    assert sum(rounds == 1 for _c, rounds, _v, _l in ranks[0]) >= len(ranks[0]) - 1, ranks[0]


def _announced(rank, world):
    """The finalists' plan trained 16 steps (the trial decides at step 10), rank 0's
    stderr captured: what it printed, what the stats and the logger kept."""
    import contextlib
    import logging

    from bytecomp.training.workloads import load_workload

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore
    logger = logging.getLogger("bytecomp")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    torch.manual_seed(0)
    workload = load_workload("mlp:inputs=32,width=64,depth=2")
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, _finalists(workload.model, world))
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.05)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            for step in range(16):
                inputs, target = _batch(rank, step)
                workload.loss(ddp(inputs), target).backward()
                optimizer.step()
                optimizer.zero_grad()
                executor.report_step_ms({0: 20.0, 1: 10.0, 2: 7.0}[executor.level])
    finally:
        logger.removeHandler(handler)
    said = list(executor.stats.trial)
    executor.close()
    return printed.getvalue(), said, [r for r in records if "runtime trial" in r]


@pytest.mark.multirank
def test_the_trial_says_when_it_starts_and_what_it_kept():
    """One line on rank 0's stderr as the trial starts (its candidates by level and name,
    its steps) and one as it decides (the level kept, why); the same two lines on every
    rank's ``bytecomp`` logger and in the executor's stats; nothing printed elsewhere."""
    (printed, said, logged), (printed_1, said_1, logged_1) = run_ranks(_announced, 2)
    assert len(said) == 2 and said == said_1 == logged == logged_1
    start, decision = said
    assert "step 2: the runtime trial times levels 1 (" in start and "for 6 steps" in start
    assert "powersgd" in start.lower() and "topk" in start.lower()
    assert "the runtime trial keeps level 1 (" in decision and "ahead" in decision
    assert printed.splitlines() == said and printed_1 == ""
