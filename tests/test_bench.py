"""``bytecomp bench --train-steps``: time to a target validation loss, on 2 gloo ranks."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch

from bytecomp.training.convergence import (
    ConvergenceConfig,
    loss_at,
    step_order,
    steps_to,
    target_loss,
    time_at,
)
from bytecomp.training.workloads import load_workload

from ranks import run_ranks

MLP = "mlp:inputs=16,width=32,depth=2"


def test_curve_arithmetic():
    curve = [(0, 3.0), (10, 2.0), (20, 1.0), (30, 1.5)]
    assert loss_at(curve, 15) == pytest.approx(1.5)
    assert steps_to(curve, 1.5) == pytest.approx(15)
    assert steps_to(curve, 3.5) == 0.0
    assert steps_to(curve, 0.5) is None
    assert steps_to([(0, 3.0), (10, float("inf"))], 1.0) is None
    config = ConvergenceConfig(train_steps=30, eval_every=10)
    assert target_loss([curve], config) == pytest.approx(loss_at(curve, 18))
    assert target_loss([curve], ConvergenceConfig(30, 10, to_loss=2.5)) == 2.5
    assert time_at([10.0, 20.0, 30.0], 2.5) == pytest.approx(0.045)
    assert time_at([10.0, 20.0], 2) == pytest.approx(0.03)


def test_each_step_takes_the_strategies_in_an_order_of_its_own():
    orders = [step_order(8, 0, step) for step in range(1, 41)]
    assert all(sorted(order) == list(range(8)) for order in orders)
    assert orders == [step_order(8, 0, step) for step in range(1, 41)]  # every rank alike
    assert len({order[0] for order in orders}) > 4  # no strategy always first
    # no strategy always after the same one
    for strategy in range(8):
        before = {order[order.index(strategy) - 1] for order in orders
                  if order.index(strategy) > 0}
        assert len(before) > 2
    assert [step_order(8, 1, step) for step in range(1, 41)] != orders  # the seed's
    assert step_order(1, 0, 5) == [0]


def _curves_in_both_orders(rank, world):
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from bytecomp.training.convergence import train_curves
    from bytecomp.training.probe import Trainee

    workload = load_workload(MLP)
    out = {}
    for shuffle in (False, True):
        torch.manual_seed(0)
        trainees = []
        for name in ("fp32", "fp16", "fp32 again"):
            model = copy.deepcopy(workload.model)
            ddp = DistributedDataParallel(model)
            if name == "fp16":
                ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            trainees.append(Trainee(name, ddp, torch.optim.Adam(model.parameters(), 1e-3)))
        training = train_curves(trainees, workload, 8, torch.device("cpu"),
                                ConvergenceConfig(6, 3, shuffle=shuffle),
                                workload.validation(8, 2))
        out[shuffle] = training.curves
    return out


@pytest.mark.multirank
def test_the_order_of_the_strategies_changes_no_curve():
    for curves in run_ranks(_curves_in_both_orders, 2):
        assert curves[True] == curves[False]
        assert curves[True]["fp32"] == curves[True]["fp32 again"]
        assert len(curves[True]["fp16"]) == 3  # steps 0, 3 and 6


def _curves_on_two_data_orders(rank, world):
    import copy

    from torch.nn.parallel import DistributedDataParallel

    from bytecomp.bencher.runner import Strategy
    from bytecomp.training.convergence import train_curves

    workload = load_workload(MLP)
    strategies = []
    for name, seed in (("fp32", None), ("fp32 again", None), ("seed 1", 1),
                       ("seed 1 again", 1)):
        model = copy.deepcopy(workload.model)
        strategies.append(Strategy(name, name, DistributedDataParallel(model),
                                   torch.optim.Adam(model.parameters(), 1e-3), data_seed=seed))
    return train_curves(strategies, workload, 8, torch.device("cpu"), ConvergenceConfig(6, 3),
                        workload.validation(8, 2)).curves


@pytest.mark.multirank
def test_a_reference_run_trains_on_a_second_data_order():
    """The noise floor's second fp32 run: its batches come from its own seed (the same
    for two copies of it, not the run's), from the same initial weights."""
    for curves in run_ranks(_curves_on_two_data_orders, 2):
        assert curves["fp32"] == curves["fp32 again"]
        assert curves["seed 1"] == curves["seed 1 again"]
        assert curves["seed 1"][0] == curves["fp32"][0]  # one initial model
        assert curves["seed 1"][1:] != curves["fp32"][1:]  # other batches


def test_only_workloads_with_real_data_validate():
    assert load_workload(MLP).validation(8, 2) is not None  # the teacher task
    assert load_workload("transformer:layers=1,width=32,heads=2,seq_len=16").validation(4, 2)
    assert load_workload("cnn").validation(8, 2) is None  # random images


@pytest.mark.multirank
def test_time_to_accuracy_on_mlp(tmp_path, cli):
    profile, plan, out = tmp_path / "profile", tmp_path / "plan.yaml", tmp_path / "bench"
    adaptive = tmp_path / "adaptive.yaml"
    done = cli("profile", "--model", MLP, "--nproc", "2", "--quick", "--out", profile,
               "--compressor", "topk:ratio=0.05", "--compressor", "fp16",
               "--compressor", "powersgd:rank=2", "--ladder", "dgc")
    assert done.returncode == 0, done.stderr
    assert (profile / "fidelity.csv").exists()
    probe = pd.read_csv(profile / "probe.csv").set_index("spec")
    assert {"fp16", "topk:ratio=0.05", "powersgd:rank=2", "dgc:ratio=0.1"} <= set(probe.index)
    assert 0.9 <= probe.steps_factor["fp16"] <= 1.1  # fp16 trains as fp32 does
    assert (probe.steps == 20).all()  # --quick
    # the gain while training: 1 for fp16, below for top-k 5%, a fraction for every spec
    assert probe.gain["fp16"] == 1.0 and 0 < probe.gain["topk:ratio=0.05"] < 0.99
    assert probe.gain.between(0, 1).all()
    done = cli("plan", profile, "--out", plan)
    assert done.returncode == 0, done.stderr
    # a slow link, so that compressing pays: the ladder's levels differ
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\nnodes: 2\nranks_per_node: 1\nlinks:\n  inter:\n"
                    "    bandwidth_gbps: 0.001\n    latency_us: 50\n")
    done = cli("plan", profile, "--out", adaptive, "--adaptive", "dgc", "--window", "2",
               "--timing", "predicted", "--cluster", slow)
    assert done.returncode == 0, done.stderr
    assert "adaptive plan: dgc ladder" in done.stdout
    done = cli("bench", profile, "--plan", plan, "--plan", adaptive, "--nproc", "2", "--out",
               out, "--iterations", "3", "--warmup", "2", "--train-steps", "30",
               "--eval-every", "10", "--compressor", "topk:ratio=0.05",
               "--compressor", "fp16", "--train-levels")
    assert done.returncode == 0, done.stderr
    convergence = pd.read_csv(out / "convergence.csv")
    names = list(convergence.strategy)
    assert names[0] == "fp32 DDP" and "bytecomp plan" in names
    assert {"topk:ratio=0.05 on every tensor", "fp16 on every tensor"} <= set(names)
    assert "compute only (no communication)" not in names
    assert "bytecomp plan: adaptive" in names
    assert any(name.startswith("bytecomp plan: adaptive level 1 (dgc:ratio=") for name in names)
    timing = pd.read_csv(out / "bench.csv")
    assert any(name.startswith("bytecomp plan: adaptive level 0") for name in timing.strategy)
    fp32 = convergence.iloc[0]
    assert 0 < fp32.steps_to_target <= 18 + 1e-9  # its own loss at 60% of 30 steps
    steps = pd.read_csv(out / "steps.csv")
    fp32_steps = list(steps[steps.strategy == "fp32 DDP"].ms)
    assert len(fp32_steps) == 30 and min(fp32_steps) > 0
    assert fp32.time_to_target_raw_s == pytest.approx(time_at(fp32_steps,
                                                              fp32.steps_to_target))
    # the typical time: the median step x steps (no stall of the machine counted)
    assert fp32.time_to_target_s == pytest.approx(
        statistics.median(fp32_steps) * fp32.steps_to_target / 1000)
    levels = pd.read_csv(out / "levels.csv")
    assert set(levels.strategy) == {"bytecomp plan: adaptive"} and len(levels) == 30
    curves = pd.read_csv(out / "curves.csv")
    first = curves[curves.strategy == "fp32 DDP"]
    assert list(first.step) == [0, 10, 20, 30]
    assert first.validation_loss.iloc[-1] < first.validation_loss.iloc[0]  # it learns
    # same weights and data: fp16 on every tensor follows fp32 closely
    fp16 = curves[curves.strategy == "fp16 on every tensor"].validation_loss.to_numpy()
    assert fp16 == pytest.approx(first.validation_loss.to_numpy(), rel=1e-2)
    assert curves[curves.step == 0].validation_loss.nunique() == 1  # one initial model
    assert (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_digits_is_real_data_with_a_fixed_split():
    pytest.importorskip("sklearn", reason="the digits workload needs the digits extra")
    workload = load_workload("digits")
    inputs, labels = workload.make_batch(16)
    assert inputs.shape == (16, 1, 8, 8) and 0 <= float(inputs.min()) <= float(inputs.max()) <= 1
    held_out = workload.validation(32, 8)
    assert sum(len(batch[1]) for batch in held_out) == 360  # every fifth of 1,797 images
    assert all(torch.equal(a[0], b[0]) for a, b in zip(held_out, workload.validation(32, 8)))
    assert workload.loss(workload.model(inputs), labels).isfinite()


def test_typical_step_times_are_medians_per_level():
    from bytecomp.training.convergence import Training

    training = Training({"a": [(0, 1.0)], "b": [(0, 1.0)]},
                        {"a": [3.0, 30.0, 3.2, 2.9, float("nan")],
                         "b": [10.0, 12.0, 50.0, 11.0, 20.0]},
                        {"b": [(1, 0, 1.0), (2, 0, 1.0), (3, 1, 0.9), (4, 1, 0.9), (5, 1, 0.9)]})
    assert training.typical_ms("a")[:4] == [3.1] * 4  # the 30 ms stall is not a's
    assert training.typical_ms("a")[4] != training.typical_ms("a")[4]  # stopped: NaN
    assert training.typical_ms("b") == [11.0, 11.0, 20.0, 20.0, 20.0]


def test_the_drift_correction_scales_every_compute_time_of_the_profile():
    """The timing bench's drift correction (``scaled_compute``) scales the compute
    phases, ready times, encodes, decodes, their between-round part and the
    aggregation, and no communication."""
    from bytecomp.bencher.runner import scaled_compute
    from bytecomp.profiler import load_profile

    profile = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "transformer")
    profile.compressors["advance_ms"] = profile.compressors["encode_ms"] / 2
    scaled = scaled_compute(profile, 1.5)
    for column in ("encode_ms", "decode_ms", "advance_ms"):
        assert list(scaled.compressors[column]) == pytest.approx(
            list(1.5 * profile.compressors[column]))
    assert list(scaled.tensors["ready_ms"]) == pytest.approx(
        list(1.5 * profile.tensors["ready_ms"]))
    assert scaled.time_ms("backward_compute") == pytest.approx(
        1.5 * profile.time_ms("backward_compute"))
    assert scaled.collectives.equals(profile.collectives)


# -- the link bench runs on against the predictions' cluster ------------------------------

def test_a_link_within_twice_the_prediction_is_no_mismatch():
    from bytecomp.bencher.link_probe import link_mismatch

    for measured in (5.0, 10.0, 19.9):
        assert link_mismatch(measured, 10.0, 1 << 20, "gbe1") is None
    slower = link_mismatch(25.0, 10.0, 1 << 20, "gbe1")
    faster = link_mismatch(10.0, 87.0, 4 << 20, "slow")
    assert "does not match gbe1" in slower and "2.5x slower than the 10 ms predicted" in slower
    assert "8.7x faster than the 87 ms predicted" in faster and "4 MiB" in faster
    assert "\n" not in slower + faster


def _link_warnings(rank, world):
    from bytecomp.bencher.link_probe import link_warning
    from bytecomp.costs.clusters import Cluster, Link
    from bytecomp.profile_store import load_profile

    profile = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "cnn")
    slow = Cluster("a 1 Mbit/s cluster", 1, 2, intra=Link(latency_us=1000.0,
                                                          bandwidth_gbps=0.001))
    instant = Cluster("an instant cluster", 1, 2, intra=Link(latency_us=0.0,
                                                            bandwidth_gbps=100_000.0))
    return [link_warning(profile, cluster, torch.device("cpu")) for cluster in (slow, instant)]


@pytest.mark.multirank
def test_bench_warns_where_the_link_is_not_the_predictions_cluster():
    """On loopback gloo ranks: a cluster of 1 Mbit/s links predicts far slower than this
    link, one of no latency and 100 Tbit/s far faster; each is one line, on every rank."""
    for slow, instant in run_ranks(_link_warnings, 2):
        assert "does not match a 1 Mbit/s cluster" in slow and "faster than the" in slow
        assert "does not match an instant cluster" in instant and "slower than the" in instant


def test_the_default_every_tensor_baseline_is_a_compressor_the_profile_timed():
    # a plan that compresses nothing names no compressor: the baseline falls back to top-k
    # at 1% only where the profile timed it, else to the profile's first (CI once benched a
    # plan of fp16 and top-k 10% against top-k 1% and refused: "has no cpu timings")
    from bytecomp.bencher.runner import BenchConfig, _every_compressors
    from bytecomp.plan_file import plan_for_model
    from bytecomp.plan_types import Option
    from bytecomp.testing.synthetic import synthetic_profile

    model = torch.nn.Linear(4, 2)
    plain = plan_for_model(model, lambda name, param: Option(), 2)
    assert plain.compressors == []
    config = BenchConfig("profile", "plan.yaml")
    shapes = [("fc.weight", (64, 64))]
    lacking = synthetic_profile(shapes, specs=["fp16", "topk:ratio=0.1"])
    assert _every_compressors(config, plain, lacking) == ["fp16"]
    having = synthetic_profile(shapes, specs=["topk:ratio=0.1", "topk:ratio=0.01"])
    assert _every_compressors(config, plain, having) == ["topk:ratio=0.01"]
    chosen = plan_for_model(model, lambda name, param: Option("topk:ratio=0.1", "device",
                                                              "allgather"), 2)
    assert _every_compressors(config, chosen, lacking) == ["topk:ratio=0.1"]
