"""Adaptive plans: the controller's rule, the executor moving between levels on real gloo
ranks (the same decisions everywhere, residuals conserved, resume bit for bit), and
the plan file's ladders."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.comm.schemes import take_residuals
from bytecomp.errors import BytecompError
from bytecomp.plan_file import ladder_for_model, load_plan, plan_from_dict
from bytecomp.plan_types import Adaptive, Option
from bytecomp.runtime.controller import Controller

from ranks import run_ranks

# -- the rule, on given gains ------------------------------------------------------------------


def controller(levels=3, predicted=(30.0, 20.0, 10.0), calibration=(), fidelity=(),
               **settings) -> Controller:
    values = {"family": "topk", "window": 3, "tolerance": 0.03, "explore_every": 12,
              "timing": "predicted", **settings}
    return Controller(Adaptive(**values), levels, list(predicted)[:levels], list(calibration),
                      list(fidelity))


def drive(control: Controller, gains, first_step: int = 1) -> list[int]:
    """The level chosen after each observed gain (a function of the level: ``gains(level)``)."""
    levels = []
    for step in range(first_step, first_step + len(gains)):
        gain = gains[step - first_step]
        levels.append(control.observe(step, gain(control.level) if callable(gain) else gain,
                                      None))
    return levels


def test_the_controller_climbs_while_the_gain_holds_and_settles_at_the_top():
    control = controller()
    levels = drive(control, [1.0] * 12)
    assert levels[2] == 1 and levels[5] == 2 and levels[-1] == 2  # a decision every 3 steps
    assert control.mode == "settled"
    assert [(s.source, s.target) for s in control.switches] == [(0, 1), (1, 2)]


def test_the_controller_steps_back_when_the_gain_falls_below_the_threshold():
    control = controller()
    drive(control, [1.0] * 9)
    assert control.level == 2
    levels = drive(control, [0.5] * 9, first_step=10)  # every level now keeps half
    assert levels[-1] == 0 and 1 in levels
    assert all(s.reason == "gain below the threshold" for s in control.switches[2:])


def test_a_settled_controller_tries_the_next_level_again_when_the_gain_rises():
    control = controller()
    dense = [lambda level: 1.0 if level == 0 else 0.4] * 30
    drive(control, dense)
    assert control.level == 0  # it tried level 1, which lost too much, and came back
    sparse = [1.0] * 40
    levels = drive(control, sparse, first_step=31)
    assert levels[-1] == 2, levels


def test_the_controller_settles_where_throughput_x_gain_stops_improving():
    # level 2 keeps less and is barely faster: 0.8 / 19 is no better than 1.0 / 20
    control = controller(predicted=(30.0, 20.0, 19.0))
    drive(control, [lambda level: 0.8 if level == 2 else 1.0] * 12)
    assert control.level == 1 and control.mode == "settled"
    assert control.switches[-1].reason == "no better than the level below"


def test_training_starts_at_the_plans_start():
    control = controller(levels=5, predicted=(50.0, 40.0, 30.0, 20.0, 19.5), start=3)
    levels = drive(control, [1.0] * 9)
    assert levels == [3] * 9 and not control.switches  # no window at level 0 first
    # the start scores better than level 0 (gain 1, never measured), and level 4 could
    # not pay: settled there
    assert control.mode == "settled"


def test_a_start_that_measures_worse_than_level_0_is_left_for_level_0():
    # predicted 20 ms, measured 45 ms at the start: level 0 (predicted 30; the start's
    # misprediction does not slow it down) wins, is measured at 30, and stays
    control = controller(levels=4, predicted=(30.0, 25.0, 20.0, 19.9), start=2,
                         timing="measured")
    for step in range(1, 13):
        control.observe(step, 1.0, {0: 30.0, 2: 45.0}.get(control.level, 40.0))
    assert control.switches[0].source == 2 and control.switches[0].target == 0
    assert control.switches[0].reason == "no better than the level below"
    assert control.level == 0 and control.time_ms[0] == pytest.approx(30.0)


def test_on_a_machine_slower_than_the_profile_the_start_is_taken_back():
    # every level measures twice its prediction: level 0 looked better on its prediction,
    # measures 60 ms in its window, and the start (40 ms) is taken back
    control = controller(levels=3, predicted=(30.0, 25.0, 20.0), start=2, timing="measured")
    for step in range(1, 10):
        control.observe(step, 1.0, 2 * control.predicted_ms[control.level])
    assert [(s.source, s.target) for s in control.switches] == [(2, 0), (0, 2)]
    assert control.switches[-1].reason == "a level above measured better"
    assert control.level == 2 and control.mode == "settled"


def test_a_level_the_plan_did_not_pick_is_tried_only_once_gains_rise():
    # level 2 is planned to keep 0.7, below the threshold: not tried while level 1 keeps
    # the 0.95 the plan said. Once level 1 keeps 0.99 it loses a fifth of the planned
    # 1 - 0.95^2, so level 2 is projected to lose a fifth of 1 - 0.7^2: it keeps 0.95,
    # and pays (0.95 / 15 ms against 0.99 / 20)
    def at(gains):
        return lambda level: gains[level]

    control = controller(levels=3, predicted=(30.0, 20.0, 15.0), start=1, explore_every=6,
                         fidelity=(1.0, 0.95, 0.7))
    drive(control, [at((1.0, 0.95, 0.7))] * 24)
    assert control.level == 1 and not control.switches
    assert control.projected_gain(2) == pytest.approx(0.7)
    levels = drive(control, [at((1.0, 0.99, 0.95))] * 12, first_step=25)
    assert 2 in levels and control.switches[0].reason == "exploring the next level"
    unplanned = controller(levels=3, predicted=(30.0, 20.0, 15.0), start=1, explore_every=6)
    assert 2 in drive(unplanned, [at((1.0, 0.95, 0.7))] * 12)  # bounded by gain 1: tried


def test_measured_gains_are_read_on_the_calibrated_scale():
    # level 1 was planned at gain 0.64 and fidelity 0.8 (calibration log 0.8 / log 0.64 = 0.5):
    # a measured 0.64 reads 0.8, above the threshold; uncalibrated it would fall below
    calibrated = controller(levels=2, calibration=(1.0, 0.5))
    drive(calibrated, [lambda level: 1.0 if level == 0 else 0.64] * 12)
    assert calibrated.level == 1 and calibrated.gain[1] == pytest.approx(0.8)
    raw = controller(levels=2)
    drive(raw, [lambda level: 1.0 if level == 0 else 0.64] * 12)
    assert raw.level == 0


def test_a_levels_calibration_comes_from_its_fidelity_and_gain():
    from bytecomp.plan_types import Level

    assert Level("x", [], fidelity=0.8, gain=0.64).calibration == pytest.approx(0.5)
    assert Level("x", [], fidelity=0.8).calibration == 1.0  # no gain recorded: none
    assert Level("x", [], fidelity=1.0, gain=1.0).calibration == 1.0


def test_the_controller_state_round_trips():
    control = controller()
    drive(control, [1.0] * 7)
    restored = controller()
    restored.load_state_dict(copy.deepcopy(control.state_dict()))
    assert restored.state_dict() == control.state_dict()
    assert drive(restored, [0.5] * 6, 8) == drive(control, [0.5] * 6, 8)
    with pytest.raises(BytecompError, match="does not fit"):
        controller(levels=2, predicted=(1.0, 2.0)).load_state_dict(control.state_dict())


# -- the executor, on real ranks ---------------------------------------------------------------

SIZE = 4096


class Crafted(torch.nn.Module):
    """Parameters whose gradients are exactly the input: ``w`` gets it all, ``v`` its
    first 64 elements (so a plan has two tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(SIZE))
        self.v = torch.nn.Parameter(torch.zeros(64))

    def forward(self, gradient):
        return (self.w * gradient).sum() + (self.v * gradient[:64]).sum()


def gradient(rank: int, step: int, sparse: bool) -> torch.Tensor:
    """Dense Gaussian, or sparse: 0.2% of the elements (top-k of 1% keeps all of them)."""
    generator = torch.Generator().manual_seed(1000 * rank + step)
    values = torch.randn(SIZE, generator=generator)
    if sparse:
        mask = torch.zeros(SIZE)
        mask[torch.randperm(SIZE, generator=generator)[: SIZE // 500]] = 1
        values = values * mask * 10
    return values


def topk_ladder(model, world, scheme="allgather", nodes=1, **settings):
    values = {"window": 3, "tolerance": 0.03, "explore_every": 12, "timing": "predicted",
              **settings}
    chooses = [lambda n, p: Option()] + [
        lambda n, p, ratio=ratio: Option(f"topk:ratio={ratio}", "device", scheme)
        for ratio in (0.1, 0.01)]
    return ladder_for_model(model, chooses, world, Adaptive("topk", **values), nodes,
                            bucket_cap_mb=0.01, predicted_ms=[30.0, 20.0, 10.0])


def run_phases(rank, world, phases, settings, device="cpu"):
    """Train ``Crafted`` (on ``device``) through ``phases`` ([(steps, sparse)]); the level
    of every step and the switches."""
    model = Crafted().to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, topk_ladder(model, world, **settings))
    levels, step = [], 0
    for steps, sparse in phases:
        for _ in range(steps):
            ddp(gradient(rank, step, sparse).to(device)).backward()
            levels.append(executor.level)
            model.zero_grad()
            step += 1
    switches = [s.to_list() for s in executor.switches]
    assert executor.stats.switches == len(switches)
    executor.close()
    return levels, switches


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("agree_every", [1, 4])
def test_every_rank_takes_the_same_decisions_on_its_own_gradients(world, agree_every):
    # measured step times: each rank's own clock, agreed over the ranks
    runs = run_ranks(run_phases, world, [(15, True), (25, False)],
                     {"timing": "measured", "agree_every": agree_every})
    assert all(run == runs[0] for run in runs), "ranks disagree on the levels"
    assert runs[0][1], "no switch happened: the test shows nothing"


@pytest.mark.multirank
def test_agreeing_every_few_steps_decides_only_when_a_batch_is_agreed():
    """With ``agree_every: 4`` the ranks share four steps' measurements at once: the
    controller observes them at the step after each fourth (steps 5, 9, ...), so every
    move happens there; it still climbs on sparse gradients and steps back on dense ones."""
    levels, switches = run_ranks(run_phases, 2, [(20, True), (30, False), (50, True)],
                                 {"agree_every": 4})[0]
    assert switches and all(step % 4 == 1 for step, *_ in switches), switches
    assert levels[19] == 2 and min(levels[20:50]) == 0 and levels[-1] == 2, levels


@pytest.mark.multirank
def test_the_executor_follows_the_compressibility_of_the_gradients():
    levels, switches = run_ranks(run_phases, 2, [(15, True), (30, False), (45, True)], {})[0]
    assert levels[14] == 2, levels  # sparse: climbed to top-k 1%
    assert min(levels[15:45]) == 0 and levels[44] < 2, levels  # dense: back down
    assert levels[-1] == 2, levels  # sparse again: up, after an exploration
    assert any(target < source for _, source, target, _, _ in switches)


def at_level_0(rank, world, spec):
    """An adaptive plan held at level 0 (``spec``, none or fp16: level 1 is predicted
    slower, so it never pays) and DDP with PyTorch's hook for the same exchange, 12 steps
    each from the same weights: parameters, steps counted, time and bytes exchanged."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    results = []
    for adaptive in (True, False):
        model = Crafted()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
        executor = None
        if not adaptive and spec == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        if adaptive:
            chooses = [lambda n, p: Option(spec, "device", "allreduce"),
                       lambda n, p: Option("topk:ratio=0.1", "device", "allgather")]
            plan = ladder_for_model(model, chooses, world,
                                    Adaptive("topk", window=3, timing="predicted"),
                                    bucket_cap_mb=0.01, predicted_ms=[10.0, 30.0])
            executor = bytecomp.apply_plan(ddp, plan)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(12):
            ddp(gradient(rank, step, sparse=False)).backward()
            optimizer.step()
            optimizer.zero_grad()
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        if executor is not None:
            stats = executor.stats  # no exchange timed: PyTorch's hook exchanged
            results.append((executor.level, executor.step, stats.steps, stats.communicate_s,
                            stats.sent_bytes / stats.fp32_bytes))
            executor.close()
    return results


@pytest.mark.multirank
@pytest.mark.parametrize("spec,sent", [("none", 1.0), ("fp16", 0.5)])
def test_an_adaptive_plan_at_a_level_pytorch_has_a_hook_for_trains_as_that_hook(spec, sent):
    # fp32 or fp16 allreduce everywhere: PyTorch's hook exchanges, not the executor's groups
    for adaptive, (level, step, counted, timed, ratio), plain in run_ranks(at_level_0, 2,
                                                                           spec):
        assert (level, step, counted, timed, ratio) == (0, 12, 12, 0.0, sent)
        assert torch.equal(adaptive, plain)


def reported_times(rank, world):
    """Steps reported as 100 + 10 x level ms (far from their wall-clock time): the
    controller's step times per level."""
    model = Crafted()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, topk_ladder(model, world, timing="measured"))
    for step in range(15):
        ddp(gradient(rank, step, True)).backward()
        executor.report_step_ms(100.0 + 10 * executor.level)
        model.zero_grad()
    times = list(executor.controller.time_ms)
    executor.close()
    return times


@pytest.mark.multirank
def test_reported_step_times_replace_the_wall_clock():
    # bytecomp bench trains every strategy in turn: the wall-clock time between two steps
    # of one executor holds all the others' steps
    times = run_ranks(reported_times, 2)[0]
    measured = [(level, ms) for level, ms in enumerate(times) if ms is not None]
    assert len(measured) >= 2, times
    for level, ms in measured:
        assert ms == pytest.approx(100.0 + 10 * level), times


def conservation(rank, world, scheme, nodes, threshold):
    """Sum over steps of the applied averages (x world) plus every rank's residuals,
    against the sum of every rank's gradients."""
    model = Crafted()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, topk_ladder(model, world, scheme, nodes,
                                                    threshold=threshold))
    applied = torch.zeros(SIZE, dtype=torch.float64)
    given = torch.zeros(SIZE, dtype=torch.float64)
    for step in range(14):
        local = gradient(rank, step, sparse=False)
        given += local
        ddp(local).backward()
        applied += model.w.grad.double()
        model.zero_grad()
    left = torch.zeros(SIZE, dtype=torch.float64)
    for group in executor.groups:
        state = executor.states.by_group.get(group.key, {})
        residual = take_residuals(state, group.scheme, group.numel,
                                  executor.device_path.topology)
        if residual is not None and "w" in group.names:
            offset = sum(math.prod(s) for s in group.shapes[:group.names.index("w")])
            left += residual[offset:offset + SIZE].double()
    assert not executor.pending
    for tensor in (given, left):
        dist.all_reduce(tensor)
    moves = [(s.source, s.target) for s in executor.switches]
    executor.close()
    return float((applied * world + left - given).abs().max()), float(given.abs().max()), moves


@pytest.mark.multirank
@pytest.mark.parametrize("world,scheme,nodes", [(2, "allgather", 1), (2, "twoshot", 1),
                                                (4, "hierarchical", 2), (4, "twolevel", 2)])
@pytest.mark.parametrize("threshold", [0.0, 0.99])  # climbs to the top / falls back to fp32
def test_residuals_are_conserved_across_switches(world, scheme, nodes, threshold):
    for error, scale, moves in run_ranks(conservation, world, scheme, nodes, threshold):
        assert moves, "no switch: nothing tested"
        assert error <= 1e-4 * scale, (moves, error, scale)


def resume(rank, world, tmp, device="cpu", settings=None):
    """30 steps straight, and 12 + (saved, restored) 18 (on ``device``): parameters and
    levels."""
    def run(stop, saved=None):
        model = Crafted().to(device)
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
        executor = bytecomp.apply_plan(ddp, topk_ladder(model, world, **(settings or {})))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        start = 0
        if saved is not None:
            checkpoint = torch.load(saved, weights_only=True)
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            executor.load_state_dict(checkpoint["bytecomp"])
            start = executor.step
        levels = []
        for step in range(start, stop):
            ddp(gradient(rank, step, sparse=step >= 20).to(device)).backward()
            optimizer.step()
            optimizer.zero_grad()
            levels.append(executor.level)
        state = executor.state_dict()
        path = f"{tmp}/ckpt-{rank}.pt"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "bytecomp": state}, path)
        switches = [s.to_list() for s in executor.switches]
        executor.close()
        return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]), levels, \
            switches, path

    straight, levels, switches, _ = run(30)
    _, before, _, saved = run(12)
    resumed, after, switches_resumed, _ = run(30, saved)
    return (torch.equal(straight, resumed), levels == before + after,
            switches == switches_resumed, [s[0] for s in switches])


@pytest.mark.multirank
@pytest.mark.smoke
@pytest.mark.parametrize("agree_every", [1, 5])  # 5: saved with two steps not yet agreed
def test_a_resumed_run_continues_bit_for_bit_across_a_switch(tmp_path, agree_every):
    for equal, same_levels, same_switches, steps in run_ranks(
            resume, 2, str(tmp_path), "cpu", {"agree_every": agree_every}):
        assert any(s <= 12 for s in steps) and any(s > 12 for s in steps), steps
        assert equal and same_levels and same_switches


def wrong_world(rank, world):
    model = Crafted()
    plan = topk_ladder(model, world * 2)
    try:
        bytecomp.apply_plan(DistributedDataParallel(model), plan)
    except BytecompError as error:
        return str(error)
    return None


@pytest.mark.multirank
def test_a_ladder_for_another_world_size_fails_on_every_rank():
    for error in run_ranks(wrong_world, 2):
        assert error is not None and "the plan is for 4 ranks but this job has 2" in error


# -- ladders in plan files ---------------------------------------------------------------------


@pytest.fixture
def ladder_file(tmp_path):
    path = tmp_path / "ladder.yaml"
    topk_ladder(Crafted(), 2).save(path)
    return path


def test_a_ladder_round_trips_and_its_digest_covers_the_levels(ladder_file):
    plan = load_plan(ladder_file)
    assert len(plan.levels) == 3 and plan.adaptive.window == 3
    assert plan.entries == plan.levels[0].entries
    assert plan.level(2).compressors == ["topk:ratio=0.01"]
    data = yaml.safe_load(ladder_file.read_text())
    for entry in data["levels"][2]["tensors"]:
        entry["compressor"] = "topk:ratio=0.02"
    data["levels"][2]["setting"] = "topk:ratio=0.02"  # the level's setting names it
    assert plan_from_dict(data).digest() != plan.digest()


def _edit(data, change):
    if change == "no levels":
        data["levels"] = data["levels"][:1]
    elif change == "both":
        data["tensors"] = [dict(e) for e in data["levels"][0]["tensors"]]  # no YAML alias
    elif change == "no ef":
        for entry in data["levels"][1]["tensors"]:
            entry["compressor"] = "topk:ratio=0.1,ef=false"
    elif change == "other tensors":
        data["levels"][2]["tensors"][0]["name"] = "u"
    elif change == "threshold":
        data["adaptive"]["threshold"] = 1.5
    elif change == "window":
        data["adaptive"]["window"] = 0
    elif change == "agree_every":
        data["adaptive"]["agree_every"] = "often"
    elif change == "unknown":
        data["adaptive"]["speed"] = 3
    elif change == "timing":
        data["adaptive"]["timing"] = "guessed"
    elif change == "start":
        data["adaptive"]["start"] = 3
    elif change == "gain":
        data["levels"][1]["gain"] = 1.2
    elif change == "adaptive without levels":
        data["tensors"] = data.pop("levels")[0]["tensors"]
    return data


def test_the_adaptive_ranges_are_declared_once_on_adaptive(ladder_file):
    """Each range and choice Adaptive declares is what the plan file is held to, at its
    bounds, and what plan's options name (--window, --agree-every, --gain-threshold)."""
    from dataclasses import fields

    from bytecomp.options import PlanOptions
    from bytecomp.schema import Integer, Number, check_of

    data = yaml.safe_load(ladder_file.read_text())
    declared = [item.name for item in fields(Adaptive) if "check" in item.metadata]
    assert {"threshold", "window", "tolerance", "explore_every", "timing",
            "agree_every"} <= set(declared)
    for name in declared:
        check = check_of(Adaptive, name)
        if isinstance(check, Integer):
            inside, outside = check.most, check.most + 1
        elif isinstance(check, Number):
            inside, outside = check.high, check.high + 0.5
        else:
            inside, outside = check.choices[-1], "elsewhere"
        if name == "trial_steps":  # at least one step per level: a trial of none is empty
            inside = 0
        plan_from_dict(copy.deepcopy({**data, "adaptive": {**data["adaptive"], name: inside}}))
        with pytest.raises(BytecompError, match=re.escape(
                f"adaptive.{name}: {check.problem(outside)}")):
            plan_from_dict({**data, "adaptive": {**data["adaptive"], name: outside}})
    for option, name in (("window", "window"), ("agree_every", "agree_every"),
                         ("gain_threshold", "threshold")):
        check = check_of(Adaptive, name)
        most = check.most if isinstance(check, Integer) else check.high
        PlanOptions.build(None, adaptive="topk", **{option: most})
        with pytest.raises(BytecompError, match=f"{most:,g}" if isinstance(most, float)
                           else f"{most:,}"):
            PlanOptions.build(None, adaptive="topk", **{option: most + 1})


@pytest.mark.parametrize("change,message", [
    ("no levels", "levels: an adaptive plan needs at least two levels"),
    ("both", "tensors: an adaptive plan holds its entries under levels"),
    ("no ef", "levels[1].tensors[0].compressor: topk:ratio=0.1,ef=false has no error feedback"),
    ("other tensors", "levels[2].tensors: must name the same tensors as levels[0]"),
    ("threshold", "adaptive.threshold: must be a number from 0 to 1, got 1.5"),
    ("window", "adaptive.window: must be an integer from 1 to 100,000 (steps), got 0"),
    ("agree_every", "adaptive.agree_every: must be an integer from 1 to 100,000 (steps), got "
                    "'often'"),
    ("unknown", "adaptive.speed: unknown setting"),
    ("timing", "adaptive.timing: 'guessed' is not one of measured, predicted"),
    ("adaptive without levels", "adaptive: an adaptive plan needs its levels"),
    ("start", "adaptive.start: level 3 does not exist (levels 0 to 2)"),
    ("gain", "levels[1].gain: must be a number from 0 to 1 or null, got 1.2"),
])
def test_bad_ladders_name_the_file_field_and_reason(ladder_file, change, message):
    ladder_file.write_text(yaml.safe_dump(_edit(yaml.safe_load(ladder_file.read_text()),
                                                change)))
    with pytest.raises(BytecompError) as error:
        load_plan(ladder_file)
    assert str(error.value) == f"{ladder_file}: {message}" or \
        str(error.value).startswith(f"{ladder_file}: {message}"), str(error.value)


# -- planning ladders ---------------------------------------------------------------------------


def ladder_profile(specs):
    from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile

    return synthetic_profile(mlp_shapes(), world_size=8, nodes=2, bandwidth_gbps=1.0,
                             specs=specs, fidelity=True)


def test_a_ladder_has_one_plan_per_profiled_setting_mild_to_aggressive():
    from bytecomp.search.ladder import plan_ladder, to_ladder_plan

    specs = ["fp16", "topk:ratio=0.001", "topk:ratio=0.1", "topk:ratio=0.01", "dgc:ratio=0.01"]
    profile = ladder_profile(specs)
    result = plan_ladder(profile, None, Adaptive("topk"))
    assert result.settings[1:] == ["topk:ratio=0.1", "topk:ratio=0.01", "topk:ratio=0.001"]
    assert result.settings[0] in ("fp16", "none")
    assert len({level.cap_mb for level in result.levels}) == 1  # DDP's buckets are fixed
    for setting, level in zip(result.settings[1:], result.levels[1:]):
        used = {level.problem.options[o].spec for o in level.assignment}
        assert used <= {setting, "none"} and setting in used  # only its setting, or nothing
    # of GraVAC's ten settings (0.1 halving down to 1e-4) the profile has 0.1 only
    assert any("no timings for 9 setting(s)" in note for note in result.notes)
    plan = to_ladder_plan(result, profile)
    again = plan_from_dict(plan.to_dict())
    assert [level.setting for level in again.levels] == result.settings
    assert again.adaptive == Adaptive("topk", start=result.adaptive.start)
    # the start: the best predicted effective time among the levels keeping the threshold
    effective = {n: level.time_ms / fidelity for n, (level, fidelity) in
                 enumerate(zip(result.levels, result.fidelities)) if n == 0 or fidelity >= 0.75}
    assert result.adaptive.start == min(effective, key=effective.get)
    assert [level.gain for level in again.levels] == \
        [round(gain, 6) for gain in result.gains]


@pytest.mark.parametrize("min_gain", [0.0, 5.0, 99.0])
def test_level_0_is_one_of_pytorchs_hooks(min_gain):
    """fp16 allreduce of every tensor (the fp16 hook) where predicted min_gain faster than
    fp32 DDP at the ladder's cap, else fp32 DDP: never a searched mix the executor's own
    exchange would run."""
    from bytecomp.plan_types import NO_COMPRESSION
    from bytecomp.search.ladder import plan_ladder
    from bytecomp.search.settings import SearchOptions

    profile = ladder_profile(["fp16", "topk:ratio=0.1", "topk:ratio=0.01"])
    result = plan_ladder(profile, None, Adaptive("topk"), SearchOptions(min_gain=min_gain))
    level = result.levels[0]
    fp16 = Option("fp16", "device", "allreduce")
    used = {level.problem.options[o] for o in level.assignment}
    fp32_ms = level.problem.simulate(level.problem.uniform(level.problem.index_of(
        NO_COMPRESSION)), level.cap_mb).iteration_ms
    fp16_ms = level.problem.simulate(level.problem.uniform(level.problem.index_of(fp16)),
                                     level.cap_mb).iteration_ms
    if fp16_ms < fp32_ms * (1 - min_gain / 100):
        assert used == {fp16} and result.settings[0] == "fp16"
        assert level.time_ms == pytest.approx(fp16_ms)
    else:
        assert used == {NO_COMPRESSION} and result.settings[0] == "none"
    if min_gain == 99.0:
        assert used == {NO_COMPRESSION}


def test_a_levels_gain_is_taken_at_the_probes_gain_and_its_fidelity_at_its_factor():
    """The controller compares what it measures while training with the gain the probe
    measured while training (the fidelity table's come from the first iterations)."""
    from bytecomp.costs.gains import FidelityModel, compose
    from bytecomp.search.ladder import plan_ladder
    from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile

    specs = ["fp16", "topk:ratio=0.1", "topk:ratio=0.01"]
    factors = {"topk:ratio=0.1": 1.2, "topk:ratio=0.01": 2.0}
    profile = synthetic_profile(mlp_shapes(), world_size=8, nodes=2, bandwidth_gbps=0.01,
                                specs=specs, fidelity=True, probe=factors)
    result = plan_ladder(profile, None, Adaptive("topk"))
    raw = FidelityModel(profile, calibrate=False)
    names = list(profile.tensors["name"])
    uniform = {s: compose([raw.shares[n] for n in names], [raw.gain(n, s) for n in names])
               for s in factors}
    before = dict(zip(result.settings, result.gains))
    profile.probe["gain"] = [0.5 * uniform[s] for s in profile.probe["spec"]]
    result = plan_ladder(profile, None, Adaptive("topk"))
    checked = 0
    for setting, gain, fidelity, level in zip(result.settings, result.gains,
                                               result.fidelities, result.levels):
        if setting in factors and \
                all(level.problem.options[o].spec == setting for o in level.assignment):
            assert gain == pytest.approx(0.5 * before[setting])  # half, as the probe's
            assert fidelity == pytest.approx(1 / factors[setting], rel=1e-6)
            checked += 1
    assert checked >= 1  # a setting compresses every tensor on this slow link


def test_the_ranks_agree_every_step_on_long_steps_and_every_few_on_short_ones(tmp_path):
    from bytecomp.search.ladder import AGREE_MS, agreement_interval, plan_ladder, to_ladder_plan

    assert agreement_interval(AGREE_MS * 2, 10) == 1
    assert agreement_interval(AGREE_MS / 4, 10) == 4
    assert agreement_interval(AGREE_MS / 40, 10) == 10  # at most a window
    assert agreement_interval(0.0, 10) == 1
    profile = ladder_profile(["topk:ratio=0.1", "topk:ratio=0.01"])
    result = plan_ladder(profile, None, Adaptive("topk"))
    start = result.levels[result.adaptive.start]
    assert result.adaptive.agree_every == agreement_interval(start.time_ms, 10)
    assert plan_ladder(profile, None, Adaptive("topk"), agree_every=3).adaptive.agree_every == 3
    path = tmp_path / "plan.yaml"
    to_ladder_plan(plan_ladder(profile, None, Adaptive("topk"), agree_every=3),
                   profile).save(path)
    assert load_plan(path).adaptive.agree_every == 3


def test_a_plan_agreeing_every_step_keeps_the_digest_it_had_before_the_setting():
    plan = topk_ladder(Crafted(), 2)
    assert "agree_every" not in plan.adaptive.to_dict()
    assert topk_ladder(Crafted(), 2, agree_every=2).digest() != plan.digest()


def test_the_start_is_the_best_effective_level_that_keeps_the_threshold():
    from types import SimpleNamespace

    from bytecomp.search.ladder import best_start

    levels = [SimpleNamespace(time_ms=t) for t in (100.0, 60.0, 40.0, 30.0)]
    # effective: 100, 66.7, 50, 50 (level 3 below the threshold)
    assert best_start(levels, [1.0, 0.9, 0.8, 0.6], 0.75) == 2
    assert best_start(levels, [1.0, 0.9, 0.8, 0.6], 0.5) == 2  # a tie keeps the milder
    assert best_start(levels, [1.0, 0.5, 0.4, 0.3], 0.75) == 0
    assert best_start(levels, [None] * 4, 0.75) == 0  # fidelity unknown


def test_a_ladder_without_profiled_settings_is_one_clear_error():
    from bytecomp.search.ladder import plan_ladder

    profile = ladder_profile(["fp16", "powersgd:rank=4"])
    with pytest.raises(BytecompError, match="no timings for any topk setting.*--ladder topk"):
        plan_ladder(profile, None, Adaptive("topk"))
    with pytest.raises(BytecompError, match="no adaptive ladder for 'int8'"):
        plan_ladder(profile, None, Adaptive("int8"))


def test_simulate_takes_a_level_of_an_adaptive_plan(tmp_path, cli):
    from bytecomp.profiler import save_profile
    from bytecomp.search.ladder import plan_ladder, to_ladder_plan

    profile = ladder_profile(["fp16", "topk:ratio=0.1", "topk:ratio=0.01"])
    folder = save_profile(profile, tmp_path / "profile")
    plan = tmp_path / "ladder.yaml"
    to_ladder_plan(plan_ladder(profile, None, Adaptive("topk")), profile).save(plan)
    levels = load_plan(plan).levels
    for number, level in enumerate(levels):
        done = cli("simulate", folder, plan, "--level", number)
        assert done.returncode == 0, done.stderr
        shown = float(re.search(r"\biteration\s*\W\s*([\d.]+)", done.stdout).group(1))
        assert shown == pytest.approx(level.predicted_ms, rel=1e-3)
    failed = cli("simulate", folder, plan, "--level", len(levels))
    assert failed.returncode == 2 and f"has no level {len(levels)}" in failed.stderr


def test_plan_takes_the_agreement_interval_and_refuses_a_bad_one(tmp_path, cli):
    from bytecomp.profiler import save_profile

    profile = ladder_profile(["fp16", "topk:ratio=0.1", "topk:ratio=0.01"])
    folder = save_profile(profile, tmp_path / "profile")
    plan = tmp_path / "ladder.yaml"
    done = cli("plan", "--no-verify", folder, "--adaptive", "topk", "--agree-every", 3, "--out", plan)
    assert done.returncode == 0, done.stderr
    assert "agree every 3 step(s)" in " ".join(done.stdout.split())
    assert load_plan(plan).adaptive.agree_every == 3
    failed = cli("plan", "--no-verify", folder, "--adaptive", "topk", "--agree-every", 0, "--out",
                 tmp_path / "other.yaml")
    assert failed.returncode == 2 and "--agree-every must be from 1 to" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and not (tmp_path / "other.yaml").exists()


def test_a_level_that_cannot_pay_is_never_tried():
    # level 1 is predicted no faster than level 0 (within the tolerance): it could not
    # win even keeping the whole gradient, so neither the climb nor an exploration goes
    control = controller(levels=2, predicted=(30.0, 29.5), explore_every=6)
    assert drive(control, [1.0] * 30) == [0] * 30
    assert control.mode == "settled" and not control.switches
    # measured: once a level is known to be slow, it is not explored again
    measured = controller(levels=2, predicted=(30.0, 20.0), explore_every=6, timing="measured")
    for step in range(1, 31):
        level = measured.level
        measured.observe(step, 1.0, 30.0 if level == 0 else 45.0)
    assert [(s.source, s.target) for s in measured.switches] == [(0, 1), (1, 0)]
