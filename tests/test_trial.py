"""The runtime trial: a verified plan's finalists that the prediction cannot separate,
timed in the running job, the same decision on every rank, resumed bit for bit."""

from __future__ import annotations

import io

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.plan_file import FINALISTS, Adaptive, Option, ladder_for_model, plan_from_dict
from bytecomp.runtime.trial import Trial

from ranks import run_ranks


def test_the_trial_takes_the_candidates_in_turn_after_its_warmup():
    trial = Trial([2, 0, 3], warmup=4, steps=6, factors=[1.0] * 4)
    assert [trial.level_for(step, fallback=1) for step in range(12)] == \
        [1, 1, 1, 1, 2, 0, 3, 2, 0, 3, 1, 1]


def test_it_keeps_the_least_median_time_x_steps_factor_once_all_is_measured():
    trial = Trial([1, 2], warmup=2, steps=4, factors=[1.0, 1.0, 1.5])
    for level, ms in [(0, 99.0), (0, 99.0), (1, 10.0), (2, 6.0), (1, 12.0), (2, 6.5)]:
        assert trial.decide() is None  # not all measured yet
        trial.observe(level, ms)
    # level 1: median 11 x 1.0 = 11; level 2: median 6.25 x 1.5 = 9.375
    assert trial.decide() == 2 and trial.scores() == {1: 11.0, 2: pytest.approx(9.375)}
    assert 0 not in trial.samples  # the warm-up's steps are not the trial's


def test_unmeasured_steps_do_not_count_and_an_untimed_trial_keeps_the_first():
    trial = Trial([3, 1], warmup=0, steps=2, factors=[1.0] * 4)
    trial.observe(3, None)
    trial.observe(1, float("nan"))
    assert trial.decide() == 3


def test_its_state_round_trips_and_damage_is_one_line():
    trial = Trial([1, 2], warmup=1, steps=4, factors=[1.0] * 3)
    for level, ms in [(0, 5.0), (1, 4.0), (2, 3.0)]:
        trial.observe(level, ms)
    again = Trial([1, 2], warmup=1, steps=4, factors=[1.0] * 3)
    again.load_state_dict(trial.state_dict())
    assert again == trial
    for damaged in ({"seen": -1, "chosen": None, "samples": {}},
                    {"seen": 3, "chosen": 7, "samples": {}},
                    {"seen": 3, "chosen": None, "samples": {"1": [float("nan")]}},
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
    from bytecomp.profiler.workloads import load_workload

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
