"""Gradient fidelity: gains of known cases on real DDP gradients, the profile's table,
and the planner's effective-time objective against brute force."""

from __future__ import annotations

import itertools
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bytecomp.compress import from_spec
from bytecomp.errors import BytecompError
from bytecomp.profiler import load_profile, save_profile
from bytecomp.profiler.fidelity import FidelityMeter, gain
from bytecomp.search import Planner
from bytecomp.testing.synthetic import mlp_shapes, resnet50_shapes, synthetic_profile

from ranks import run_ranks

ROOT = Path(__file__).resolve().parents[1]


def test_gain_of_known_cases():
    x = torch.randn(1000, dtype=torch.float64)
    assert gain(x, x) == 1.0
    assert gain(x, torch.zeros_like(x)) == 0.0
    assert gain(torch.zeros(10), torch.ones(10)) == 1.0  # nothing to lose
    kept = x.clone()
    kept[500:] = 0
    assert gain(x, kept) == pytest.approx(math.sqrt(float(x[:500].pow(2).sum() /
                                                         x.pow(2).sum())), rel=1e-9)
    assert gain(x, 3 * x) == 0.0  # an error larger than the gradient: nothing delivered


def _gains_on_ddp_gradients(rank, world):
    """Local gradients captured from a real DDP job's buckets, and the meter's gains."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bytecomp.profiler.fidelity import capture_local_gradients

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8))
    reference.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
    names = {id(p): n for n, p in model.named_parameters()}
    captured: dict = {}
    capture_local_gradients(ddp, names, captured)
    torch.manual_seed(100 + rank)  # each rank its own batch
    inputs, target = torch.randn(16, 32), torch.randint(0, 8, (16,))
    torch.nn.functional.cross_entropy(ddp(inputs), target).backward()
    torch.nn.functional.cross_entropy(reference(inputs), target).backward()
    local = {n: p.grad for n, p in reference.named_parameters()}
    averaged = {n: p.grad.clone() for n, p in model.named_parameters()}
    for grad in local.values():
        dist.all_reduce(grad)
    specs = ["none", "fp16", "topk:ratio=0.1"]
    meter = FidelityMeter(specs, {n: tuple(p.shape) for n, p in model.named_parameters()})
    meter.observe(captured)
    return ({n: g.clone() for n, g in captured.items()},
            {n: (averaged[n] - local[n] / world).abs().max().item() for n in local},
            meter.rows())


@pytest.mark.multirank
def test_gains_on_real_ddp_buckets():
    results = run_ranks(_gains_on_ddp_gradients, 2)
    for captured, averaged_error, rows in results:
        assert max(averaged_error.values()) < 1e-6  # DDP still averages after the capture
        total = sum(float(g.pow(2).sum()) for g in captured.values())
        by_key = {(row["tensor"], row["spec"]): row for row in rows}
        assert sum(row["norm_share"] for row in rows if row["spec"] == "none") == \
            pytest.approx(1.0, abs=1e-6)
        for name, grad in captured.items():
            flat = grad.reshape(-1)
            assert by_key[(name, "none")]["gain"] == 1.0
            assert by_key[(name, "fp16")]["gain"] > 0.9999
            k = math.ceil(0.1 * flat.numel())
            top = flat.abs().topk(k).values.pow(2).sum()
            assert by_key[(name, "topk:ratio=0.1")]["gain"] == pytest.approx(
                math.sqrt(float(top / flat.pow(2).sum())), abs=2e-6)
            assert by_key[(name, "none")]["norm_share"] == pytest.approx(
                float(flat.pow(2).sum()) / total, abs=1e-6)
    assert results[0][0].keys() == results[1][0].keys()
    assert any(not torch.equal(results[0][0][n], results[1][0][n]) for n in results[0][0])


def test_random_k_gain_matches_its_expectation():
    """Without error feedback, random-k's squared gain is the kept share of the norm:
    in expectation 1 - (1 - 1/n)^k (indices drawn with replacement)."""
    torch.manual_seed(1)
    x = torch.randn(400) * torch.linspace(0.1, 3.0, 400)  # uneven magnitudes
    spec = "randomk:ratio=0.25,ef=false"
    squares = []
    for salt in range(300):
        meter = FidelityMeter([spec], {"x": (400,)})
        meter.states[(spec, "x")]["salt"] = salt
        meter.observe({"x": x})
        squares.append(meter.gains[(spec, "x")][0] ** 2)
    mean = sum(squares) / len(squares)
    spread = (sum((s - mean) ** 2 for s in squares) / (len(squares) - 1)) ** 0.5
    expected = 1 - (1 - 1 / 400) ** 100
    assert abs(mean - expected) < 5 * spread / len(squares) ** 0.5


def test_error_feedback_raises_the_gain_of_the_next_steps():
    """With error feedback x is the compensated gradient: what top-k left behind comes
    back, so on a steady gradient the gain after the first step is not the first's."""
    x = torch.linspace(-1, 1, 1000)
    meter = FidelityMeter(["topk:ratio=0.01"], {"x": (1000,)})
    for _ in range(5):
        meter.observe({"x": x})
    gains = meter.gains[("topk:ratio=0.01", "x")]
    assert gains[0] == pytest.approx(math.sqrt(float(x.abs().topk(10).values.pow(2).sum()
                                                     / x.pow(2).sum())), rel=1e-6)
    assert gains[1] != pytest.approx(gains[0])


# -- the profile's table ---------------------------------------------------------------


def test_fidelity_table_round_trips_and_is_validated(tmp_path):
    profile = synthetic_profile(mlp_shapes(3, 64), world_size=2, fidelity=True)
    save_profile(profile, tmp_path / "p")
    loaded = load_profile(tmp_path / "p")
    assert loaded.has_fidelity and len(loaded.fidelity) == len(profile.fidelity)
    path = tmp_path / "p" / "fidelity.csv"
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], text[1].replace(text[1].split(",")[2], "1.5", 1),
                               *text[2:]]) + "\n")
    with pytest.raises(BytecompError, match="column 'gain', row 1: must be between 0 and 1"):
        load_profile(tmp_path / "p")
    path.write_text("\n".join([text[0], "ghost" + text[1][text[1].index(","):], *text[2:]]))
    with pytest.raises(BytecompError, match="'ghost' is not in tensors.csv"):
        load_profile(tmp_path / "p")


def test_a_profile_without_fidelity_plans_by_time_and_refuses_the_objective(tmp_path, cli):
    old = tmp_path / "old"
    shutil.copytree(ROOT / "profiles" / "cnn", old)
    (old / "fidelity.csv").unlink(missing_ok=True)
    planner = Planner(load_profile(old))
    result = planner.search()
    assert result.objective.name == "time" and result.fidelity is None
    assert any("fidelity unknown" in note for note in result.notes)
    for args in (["--objective", "effective"], ["--min-fidelity", "0.8"]):
        failed = cli("plan", "--no-verify", str(old), "--out", str(tmp_path / "plan.yaml"), *args)
        assert failed.returncode == 2 and "no fidelity table" in failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "plan.yaml").exists()


# -- the objective -----------------------------------------------------------------------


def brute_force_effective(planner: Planner, caps, min_fidelity: float, weights: str,
                          gains: dict | None = None) -> float:
    """Effective time by enumeration, fidelity composed from the profile's tables (or the
    given ``gains`` by tensor and spec)."""
    problem = planner.problem
    table = planner.profile.fidelity
    gains = gains or {(r.tensor, r.spec): r.gain for r in table.itertuples()}
    if weights == "norm":
        shares = {r.tensor: r.norm_share for r in table.itertuples()}
    else:
        shares = dict(zip(planner.profile.tensors["name"], planner.profile.tensors["numel"]))
    total = sum(shares.values())
    best = math.inf
    for cap in caps:
        for assignment in itertools.product(range(len(planner.searchable)),
                                            repeat=len(problem.tensors)):
            options = [problem.options[o] for o in assignment]
            fidelity = math.sqrt(sum(
                shares[t.name] / total * (gains[(t.name, o.spec)] ** 2 if o.compressed else 1)
                for t, o in zip(problem.tensors, options)))
            if fidelity < min_fidelity - 1e-12:
                continue
            time = problem.simulate(list(assignment), cap).iteration_ms
            best = min(best, time / fidelity)
    return best


EFFECTIVE_INSTANCES = [
    (mlp_shapes(2, 512), (4, 1), "cpu", ["topk:ratio=0.01", "fp16"], [1.0, 25.0]),
    (mlp_shapes(2, 1024)[:3], (8, 2), "cuda", ["randomk:ratio=0.01", "powersgd:rank=4"], [2.0]),
    ([("a", (700, 300)), ("b", (3000,)), ("c", (64, 64, 3, 3))], (2, 1), "cpu",
     ["randomk:ratio=0.05", "signsgd", "qsgd:levels=16"], [0.5]),
]


@pytest.mark.parametrize("weights", ["params", "norm"])
@pytest.mark.parametrize("shapes,cluster,device,specs,caps", EFFECTIVE_INSTANCES)
def test_effective_time_optimum_equals_brute_force(shapes, cluster, device, specs, caps,
                                                   weights):
    world, nodes = cluster
    for bandwidth, min_fidelity in ((0.1, 0.0), (1.0, 0.75), (10.0, 0.9)):
        profile = synthetic_profile(shapes, world_size=world, nodes=nodes, device=device,
                                    specs=specs, bandwidth_gbps=bandwidth, fidelity=True)
        planner = Planner(profile, None, specs, strict=True, objective="effective",
                          min_fidelity=min_fidelity, fidelity_weights=weights)
        result = planner.search(caps=caps)
        assert result.exact, result.algorithm
        expected = brute_force_effective(planner, caps, min_fidelity, weights)
        assert result.value == pytest.approx(expected, rel=1e-9)
        assert result.fidelity >= min_fidelity - 1e-12
        assert result.effective_ms == pytest.approx(result.value, rel=1e-9)


@pytest.mark.parametrize("min_fidelity", [0.5, 0.75, 0.95])
def test_the_minimum_fidelity_is_never_violated(min_fidelity):
    profile = synthetic_profile(resnet50_shapes(), world_size=8, nodes=2, bandwidth_gbps=1.0,
                                fidelity=True)
    for specs in (None, ["randomk:ratio=0.01"], ["topk:ratio=0.01", "signsgd"]):
        result = Planner(profile, None, specs, min_fidelity=min_fidelity).search(min_gain=0)
        assert result.objective.name == "effective"
        assert result.fidelity >= min_fidelity - 1e-12
        fp32 = next(b for b in result.baselines if b.name == "fp32 DDP")
        assert result.value <= fp32.value + 1e-9


def test_the_evaluator_skips_what_it_need_not_simulate():
    """A plan below the minimum fidelity is infinite without a simulation, and a plan
    evaluated before is looked up; both count as evaluations (what a search spends
    and finds does not depend on them), and the values are those of a simulation."""
    profile = synthetic_profile(resnet50_shapes(), world_size=8, nodes=2, bandwidth_gbps=1.0,
                                fidelity=True)
    problem = Planner(profile, None, ["topk:ratio=0.01"]).problem
    topk = next(i for i, o in enumerate(problem.options) if o.spec == "topk:ratio=0.01")
    simulated = []
    original = problem.simulate
    problem.simulate = lambda *args, **kwargs: simulated.append(args) or original(*args, **kwargs)
    lossy, mild = problem.uniform(topk), problem.uniform(0)
    mild[0] = topk
    before = problem.evaluations
    assert problem.evaluate(lossy, 25.0) == math.inf and not simulated
    first = problem.evaluate(mild, 25.0)
    assert first == problem.evaluate(mild, 25.0) and len(simulated) == 1
    assert first == original(mild, 25.0).iteration_ms / problem.fidelity(mild)
    assert problem.evaluations == before + 4  # three evaluations and the check's simulation
    problem.set_fidelity(problem._gain_of, [w[-1] for w in problem._weights],
                         replace(problem.objective, min_fidelity=0.0))
    assert problem.evaluate(lossy, 25.0) < math.inf  # a new objective: nothing looked up


def test_the_time_objective_plans_as_before():
    with_table = synthetic_profile(resnet50_shapes(), world_size=8, nodes=2, fidelity=True)
    without = synthetic_profile(resnet50_shapes(), world_size=8, nodes=2)
    by_time = Planner(with_table, None, None, objective="time").search(algorithm="greedy")
    before = Planner(without).search(algorithm="greedy")
    assert by_time.assignment == before.assignment and by_time.time_ms == before.time_ms
    assert by_time.fidelity is not None  # still reported
    effective = Planner(with_table).search(algorithm="greedy")
    assert effective.fidelity > by_time.fidelity  # the default trades some speed for it
    assert effective.time_ms >= by_time.time_ms - 1e-9


def test_one_compressor_keeps_espresso_s_guarantee():
    profile = synthetic_profile(resnet50_shapes(), world_size=8, nodes=2, bandwidth_gbps=1.0,
                                fidelity=True)
    result = Planner(profile, None, ["topk:ratio=0.01"]).search()
    used = {result.problem.options[o].spec for o in result.assignment}
    assert used <= {"none", "topk:ratio=0.01"}
    everywhere = next(b for b in result.baselines if b.name.startswith("topk"))
    assert result.fidelity >= everywhere.fidelity - 1e-12
    assert any("at least that of topk:ratio=0.01" in note for note in result.notes)
    assert from_spec("topk:ratio=0.01").name == "topk"


def test_parameter_weights_count_every_layer_where_norm_weights_see_the_largest():
    """A lossy compressor on a layer with a small share of the norm but most of the
    parameters: the norm-weighted fidelity barely notices, the parameter-weighted one
    does (Adam moves every parameter alike)."""
    from bytecomp.costs.gains import FidelityModel, compose

    profile = synthetic_profile([("head", (1000,)), ("body", (3000,))], world_size=2,
                                specs=["randomk:ratio=0.01"], fidelity=True)
    table = profile.fidelity
    table.loc[table.tensor == "head", ["norm_share", "gain"]] = [0.99, 1.0]
    table.loc[table.tensor == "body", ["norm_share", "gain"]] = [0.01, 0.1]
    gains = [1.0, 0.1]  # head uncompressed, random-k on the body
    by_norm = FidelityModel(profile, "norm").shares
    by_params = FidelityModel(profile, "params").shares
    assert compose([by_norm["head"], by_norm["body"]], gains) == pytest.approx(
        math.sqrt(0.99 + 0.01 * 0.01))
    assert compose([by_params["head"], by_params["body"]], gains) == pytest.approx(
        math.sqrt(0.25 + 0.75 * 0.01))
    with pytest.raises(BytecompError, match="unknown fidelity weights"):
        FidelityModel(profile, "loss")


# -- calibration by the convergence probe ------------------------------------------------


def test_the_steps_factor_reads_the_curves():
    from bytecomp.training.probe import MAX_FACTOR, steps_factor

    fp32 = [(0, 3.0), (10, 2.0), (20, 1.5), (30, 1.2), (40, 1.0)]
    assert steps_factor(fp32, fp32, 20) == pytest.approx(1.0)
    slower = [(0, 3.0), (10, 2.5), (20, 2.0), (30, 1.75), (40, 1.5)]  # fp32's pace at 1/2
    assert steps_factor(slower, fp32, 20) == pytest.approx(2.0)
    better = [(0, 3.0), (10, 1.9), (20, 1.4), (30, 1.1), (40, 0.9)]
    assert steps_factor(better, fp32, 20) <= 1.0
    stuck = [(0, 3.0), (10, 3.0), (20, 3.1), (30, float("inf")), (40, float("inf"))]
    assert steps_factor(stuck, fp32, 20) == MAX_FACTOR


@pytest.mark.parametrize("weights", ["params", "norm"])
def test_calibrated_gains_compose_to_one_over_the_steps_factor(weights):
    """... where the probe says worse than the gains; where it says better (top-k's 1.1
    against gains composing to about 0.7), the gains stay: the worse of the two counts."""
    from bytecomp.costs.gains import FidelityModel, compose

    specs = ["int8", "powersgd:rank=4", "topk:ratio=0.01", "fp16", "dgc:ratio=0.01"]
    factors = {"int8": 1.05, "powersgd:rank=4": 1.2, "topk:ratio=0.01": 3.0, "fp16": 0.97,
               "dgc:ratio=0.01": 1.1}
    profile = synthetic_profile(mlp_shapes(3, 256), world_size=2, specs=specs, fidelity=True,
                                probe=factors)
    raw = FidelityModel(profile, weights, calibrate=False)
    model = FidelityModel(profile, weights)
    names = list(profile.tensors["name"])
    shares = [model.shares[n] for n in names]
    for spec, factor in factors.items():
        spec = from_spec(spec).spec
        uniform = compose(shares, [model.gain(n, spec) for n in names])
        measured = compose(shares, [raw.gain(n, spec) for n in names])
        assert uniform == pytest.approx(min(1 / max(factor, 1.0), measured), rel=1e-6), spec
        before = [raw.gain(n, spec) for n in names]
        after = [model.gain(n, spec) for n in names]
        # the tensors keep their order: one that loses more still loses more
        assert sorted(range(len(names)), key=before.__getitem__) == \
            sorted(range(len(names)), key=after.__getitem__) or len(set(before)) < len(before)
    assert model.gain(names[0], "dgc:ratio=0.01") == raw.gain(names[0], "dgc:ratio=0.01")
    assert model.gain(names[0], "int8") < raw.gain(names[0], "int8")
    uncalibrated = synthetic_profile(mlp_shapes(3, 256), world_size=2, specs=specs,
                                     fidelity=True)
    assert FidelityModel(uncalibrated, weights).gains == raw.gains


def test_calibrated_both_ways_the_gains_compose_to_the_probe_also_where_it_says_better():
    """An adaptive ladder's calibration (``lower_only=False``): DGC's gains compose to
    about 0.7 but its probe says 1.1x fp32's steps: they are raised to a power below 1."""
    from bytecomp.costs.gains import FidelityModel, compose

    specs = ["topk:ratio=0.01", "dgc:ratio=0.01"]
    factors = {"topk:ratio=0.01": 3.0, "dgc:ratio=0.01": 1.1}
    profile = synthetic_profile(mlp_shapes(3, 256), world_size=2, specs=specs, fidelity=True,
                                probe=factors)
    raw = FidelityModel(profile, calibrate=False)
    model = FidelityModel(profile, lower_only=False)
    names = list(profile.tensors["name"])
    shares = [model.shares[n] for n in names]
    for spec, factor in factors.items():
        spec = from_spec(spec).spec
        assert compose(shares, [model.gain(n, spec) for n in names]) == \
            pytest.approx(1 / factor, rel=1e-6), spec
    assert model.powers["dgc:ratio=0.01"] < 1 < model.powers["topk:ratio=0.01"]
    assert model.gain(names[0], "dgc:ratio=0.01") > raw.gain(names[0], "dgc:ratio=0.01")


def test_the_calibrated_optimum_equals_brute_force():
    from bytecomp.costs.gains import FidelityModel

    specs = ["powersgd:rank=4", "int8"]
    for bandwidth, min_fidelity in ((0.1, 0.0), (1.0, 0.75)):
        profile = synthetic_profile(mlp_shapes(2, 512), world_size=4, device="cpu", specs=specs,
                                    bandwidth_gbps=bandwidth, fidelity=True,
                                    probe={"powersgd:rank=4": 1.2, "int8": 1.1})
        planner = Planner(profile, None, specs, strict=True, objective="effective",
                          min_fidelity=min_fidelity)
        result = planner.search(caps=[1.0, 25.0])
        assert result.exact
        gains = FidelityModel(profile).gains
        expected = brute_force_effective(planner, [1.0, 25.0], min_fidelity, "params", gains)
        assert result.value == pytest.approx(expected, rel=1e-9)
        assert any("calibrated by the profile's convergence probe" in n for n in result.notes)


def test_the_default_margin_is_wider_for_effective_time(cli, monkeypatch, tmp_path):
    """Effective time carries the steps factor's error on top of the iteration's: its
    default --min-gain is 10%, time's 5%."""
    from bytecomp.search import planner as planner_module

    seen = []
    search = planner_module.Planner.search

    def recording(self, options=None, **more):
        seen.append((self.problem.objective.name, options.min_gain))
        return search(self, options, **more)

    monkeypatch.setattr(planner_module.Planner, "search", recording)
    profile = ROOT / "profiles" / "transformer"
    for args, expected in (([], ("effective", 10.0)), (["--objective", "time"], ("time", 5.0)),
                           (["--min-gain", "7"], ("effective", 7.0))):
        done = cli("plan", "--no-verify", profile, "--out", tmp_path / "plan.yaml", *args)
        assert done.returncode == 0, done.stderr
        assert seen[-1][0] == expected[0] and seen[-1][1] == pytest.approx(expected[1])


def test_the_margin_keeps_fp32_ddp_alone():
    """A plan that does not beat fp32 DDP by --min-gain is fp32 DDP; no other baseline is
    kept by the margin (another would make more choice give a worse plan)."""
    from bytecomp.search.baselines import baseline_to_keep as _baseline_to_keep
    from bytecomp.search.result import Baseline
    from bytecomp.search.settings import BaselineKind

    every, kind = BaselineKind.EVERY_TENSOR, BaselineKind.FP32_DDP
    fast = Baseline(every, "powersgd", [1, 1], 25.0, 5.0, 0.84, 6.1)
    safe = Baseline(every, "int8", [2, 2], 25.0, 6.3, 1.0, 6.3)
    fp32 = Baseline(kind, "fp32 DDP", [0, 0], 25.0, 15.0, 1.0, 15.0)
    searchable = {0, 1, 2}
    for fidelity in (0.84, 1.0, None):  # effective time (two fidelities), time
        assert _baseline_to_keep([fp32, fast, safe], searchable, 6.0, 0.10, fidelity) is None
        assert _baseline_to_keep([fp32, fast, safe], searchable, 14.0, 0.10, fidelity) is fp32
        assert _baseline_to_keep([fp32, fast, safe], searchable, 13.4, 0.10, fidelity) is None
        assert _baseline_to_keep([fp32, fast, safe], searchable, 14.0, 0.0, fidelity) is None
    assert _baseline_to_keep([fast, safe], searchable, 6.0, 0.10, 1.0) is None  # no fp32
    assert _baseline_to_keep([fp32], {1, 2}, 14.0, 0.10) is None  # fp32 not searchable


@pytest.mark.parametrize("objective", ["effective", "time"])
@pytest.mark.parametrize("min_gain", [0.0, 5.0, 10.0])
def test_more_compressors_never_give_a_worse_plan(objective, min_gain):
    """Over nested sets of compressors, with the search proven optimal (exact), the plan
    with more choice is never predicted worse, whatever --min-gain keeps."""
    # 4 ranks on 2 nodes at 1 Gbit/s: communication-bound, compressing pays
    profile = synthetic_profile(mlp_shapes(2, 256), world_size=4, nodes=2, backward_ms=4.0,
                                bandwidth_gbps=1.0, fidelity=True)
    cluster = None  # the profiled cluster
    nested = [["topk:ratio=0.01"], ["topk:ratio=0.01", "int8"],
              ["topk:ratio=0.01", "int8", "dgc:ratio=0.01"]]
    values = []
    for specs in nested:
        planner = Planner(profile, cluster, specs, strict=True, objective=objective)
        result = planner.search(algorithm="exact", min_gain=min_gain)
        assert result.exact
        values.append(result.value)
    assert all(more <= fewer + 1e-9 for fewer, more in zip(values, values[1:])), values
