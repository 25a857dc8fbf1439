"""The user's recipe (optimizer, data, loss) in the profile: optimizer specs, the Recipe
form of a factory, held-out batches where it has no validation, the evidence the plan
says it decided by; and the profile's fit quality: poor sweeps measured again, what
stays poor warned about."""

from __future__ import annotations

import math
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from bytecomp.errors import BytecompError
from bytecomp.profile_store import load_profile
from bytecomp.profiler.quality import merged, quality_meta, remeasure
from bytecomp.recipe import ClippedOptimizer, parse_optimizer
from bytecomp.training.workloads import HELD_OUT_SEED, load_workload

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


# -- optimizer specs -------------------------------------------------------------------------


@pytest.mark.parametrize("text,canonical", [
    ("sgd", "sgd"), ("SGD:momentum=0.9, lr=0.05", "sgd:lr=0.05,momentum=0.9"),
    ("adam:lr=3e-4", "adam:lr=0.0003"), ("adamw:weight_decay=0.1,clip=1", "adamw:weight_decay=0.1,clip=1"),
    ("sgd:nesterov=true,momentum=0.5", "sgd:momentum=0.5,nesterov=true"),
])
def test_optimizer_specs_parse_to_a_canonical_form(text, canonical):
    assert parse_optimizer(text).spec == canonical
    assert parse_optimizer(canonical).spec == canonical


@pytest.mark.parametrize("text,message", [
    ("rmsprop", "unknown optimizer 'rmsprop'; choose from sgd, adam, adamw"),
    ("sgd:lr=0", "lr=0 is out of range"), ("sgd:lr=nan", "out of range"),
    ("sgd:lr=inf", "out of range"), ("sgd:momentum=1", "momentum=1 is out of range [0, 1)"),
    ("adam:beta1=1", "out of range"), ("sgd:lr=-1", "out of range"), ("sgd:lr=1e7", "out of range"),
    ("sgd:rate=1", "unknown parameter 'rate'"), ("sgd:lr", "needs a value"),
    ("sgd:lr=1,lr=2", "given twice"), ("sgd:lr=fast", "not a number"),
    ("sgd:nesterov=maybe", "true or false"), ("sgd:clip=0", "out of range"), ("", "empty"),
])
def test_bad_optimizer_specs_are_one_clear_error(text, message):
    with pytest.raises(BytecompError, match=message.replace("(", r"\(").replace("[", r"\[")
                       .replace(")", r"\)")):
        parse_optimizer(text)


def test_a_spec_builds_its_optimizer_and_clip_clips():
    model = torch.nn.Linear(8, 2)
    sgd = parse_optimizer("sgd:lr=0.5,momentum=0.9,weight_decay=0.01").build(model.parameters())
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9
    clipped = parse_optimizer("adamw:lr=0.1,clip=0.001").build(model.parameters())
    assert isinstance(clipped, ClippedOptimizer)
    assert isinstance(clipped.optimizer, torch.optim.AdamW)
    (model(torch.randn(4, 8)).pow(2).sum() * 1000).backward()
    clipped.step()
    norm = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()
    assert norm <= 0.001 * (1 + 1e-5)


def test_the_profile_command_refuses_a_bad_optimizer_before_any_rank(cli):
    done = cli("profile", "--optimizer", "sgd:lr=0", "--nproc", "2")
    assert done.returncode == 2 and "lr=0 is out of range" in done.stderr


# -- recipes ---------------------------------------------------------------------------------


def test_a_factory_declares_its_optimizer_and_validation():
    workload = load_workload("factories:with_recipe")
    assert workload.optimizer_spec == "sgd:lr=0.1,momentum=0.9" and workload.batch_size == 16
    optimizer = workload.make_optimizer(workload.model.parameters())
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.1
    batches, source = workload.evidence_batches(16)
    assert source == "validation" and len(batches) == 4
    assert load_workload("factories:with_recipe", optimizer="adam").optimizer_spec == "adam"


def test_without_validation_held_out_batches_stand_in():
    """Batches of make_batch under seeds no training step draws, the same every time."""
    workload = load_workload("factories:without_validation")
    assert workload.validation(16) is None
    batches, source = workload.evidence_batches(16, 3)
    again, _ = workload.evidence_batches(16, 3)
    assert source == "held-out training batches" and len(batches) == 3
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    torch.manual_seed(HELD_OUT_SEED)
    first = workload.make_batch(16)
    assert torch.equal(first[0], batches[0][0])
    torch.manual_seed(0)  # a training seed draws other inputs
    assert not torch.equal(workload.make_batch(16)[0], batches[0][0])


def test_the_old_tuple_factories_still_load_with_the_default_recipe():
    workload = load_workload("factories:tiny")
    assert workload.optimizer_spec == "adam:lr=0.001"
    assert workload.evidence_batches(8, 2)[1] == "held-out training batches"


@pytest.mark.parametrize("factory,message", [
    ("factories:wrong_return", "must return a bytecomp.Recipe"),
])
def test_a_bad_recipe_is_one_line(factory, message):
    with pytest.raises(BytecompError, match=message):
        load_workload(factory)


def test_a_recipe_with_a_bad_optimizer_or_validation_is_one_line(monkeypatch):
    from bytecomp import Recipe

    import factories

    model = torch.nn.Linear(16, 4)
    monkeypatch.setattr(factories, "bad_optimizer", lambda: Recipe(
        model, factories._teacher_batch, optimizer="sgd:lr=-2"), raising=False)
    monkeypatch.setattr(factories, "bad_validation", lambda: Recipe(
        model, factories._teacher_batch, validation=5), raising=False)
    with pytest.raises(BytecompError, match="lr=-2 is out of range"):
        load_workload("factories:bad_optimizer")
    with pytest.raises(BytecompError, match="validation must be"):
        load_workload("factories:bad_validation")


@pytest.mark.parametrize("vocab", [16, 100, 300])
def test_every_vocabulary_trains_on_text(vocab):
    """A language model of any vocabulary gets the text (bytes modulo a small vocabulary),
    never uniformly random tokens: its tokens follow each other as text does."""
    workload = load_workload(f"lstm:vocab={vocab},layers=1,width=16,seq_len=32")
    inputs, targets = workload.make_batch(64)
    assert int(inputs.max()) < min(vocab, 256)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    counts = torch.bincount(inputs.reshape(-1), minlength=vocab).float()
    assert counts.max() > 3 * counts.mean()  # text: a few tokens (spaces, e) dominate
    assert workload.validation(4, 2) is not None


def test_the_bag_of_words_workload_touches_few_embedding_rows_and_learns():
    """``bow``: a batch's words are a small share of the vocabulary (so most rows of the
    embedding's gradient are zero), drawn under torch's seed; fixed validation
    documents; its recipe (SGD with momentum) lowers the loss on them."""
    workload = load_workload("bow")
    assert workload.optimizer_spec.startswith("sgd:") and workload.batch_size == 32
    rows = workload.model.embedding.weight.shape[0]
    torch.manual_seed(7)
    first = workload.make_batch(32)
    torch.manual_seed(7)
    assert torch.equal(first[0], workload.make_batch(32)[0])  # the seed governs the data
    touched = [workload.make_batch(32)[0].unique().numel() / rows for _ in range(20)]
    assert max(touched) < 0.10, touched  # a few percent of the 20,000 rows
    words, labels = first
    loss = workload.loss(workload.model(words), labels)
    loss.backward()
    gradient = workload.model.embedding.weight.grad
    nonzero = int((gradient.abs().sum(dim=1) > 0).sum())
    assert nonzero == words.unique().numel()  # exactly the rows of the batch's words
    assert workload.model.fc2.weight.grad.count_nonzero() > 0.5 * workload.model.fc2.weight.numel()
    validation = workload.validation(32, 4)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(validation, workload.validation(32, 4)))

    def held_out() -> float:
        with torch.no_grad():
            return sum(float(workload.loss(workload.model(x), y)) for x, y in validation) / 4
    optimizer = workload.make_optimizer(workload.model.parameters())
    optimizer.zero_grad()
    before = held_out()
    for _ in range(150):
        words, labels = workload.make_batch(32)
        workload.loss(workload.model(words), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert held_out() < 0.9 * before  # it learns: the classes are in the words


# -- fit quality -----------------------------------------------------------------------------


def _sweep(noisy: bool, key=("allreduce", "world", "float32")) -> list[dict]:
    """A linear collective sweep (0.1 ms + 1 ms per MiB); ``noisy``: one size 8x slow."""
    rows = []
    for exponent in range(10, 27, 2):
        time_ms = 0.1 + (1 << exponent) / (1 << 20)
        if noisy and exponent == 20:
            time_ms *= 8
        rows.append({"collective": key[0], "group": key[1], "dtype": key[2],
                     "bytes": 1 << exponent, "ranks": 2, "time_ms": time_ms,
                     "p10_ms": time_ms, "p90_ms": time_ms})
    return rows


def _checked(first, again):
    from bytecomp.profiler.quality import COLLECTIVE_KEY, collective_quality

    asked = []

    def measure(keys):
        asked.append(sorted(keys))
        return [row for row in again() if (row["collective"], row["group"], row["dtype"]) in keys]
    return remeasure(first, collective_quality, measure, COLLECTIVE_KEY, "bytes",
                     ("time_ms",)), asked


def test_a_noisy_sweep_is_measured_again_and_the_median_mends_it():
    good = _sweep(False, ("allgather", "world", "uint8"))
    checked, asked = _checked(_sweep(True) + good, lambda: _sweep(False))
    assert asked == [[("allreduce", "world", "float32")]]  # once, only the poor series
    assert checked.remeasured == ["collective allreduce/world/float32"] and not checked.poor
    mended = {row["bytes"]: row["time_ms"] for row in checked.rows
              if row["collective"] == "allreduce"}
    assert mended[1 << 20] == pytest.approx(1.1)  # the least of 8.8 and 1.1
    assert len(checked.rows) == len(_sweep(True)) + len(good)


def test_a_sweep_that_stays_poor_is_retried_twice_and_reported():
    checked, asked = _checked(_sweep(True), lambda: _sweep(True))
    assert len(asked) == 2 and len(checked.poor) == 1
    meta = quality_meta(checked, checked)
    assert meta["poor"][0]["fit"] == "collective allreduce/world/float32"
    assert meta["poor"][0]["worst_relative_error"] > 0.25 and meta["retries"] == 2


def test_merging_attempts_takes_each_sizes_least_time_and_widest_spread():
    a, b, c = _sweep(True), _sweep(False), _sweep(False)
    b[0].update(p10_ms=0.01, p90_ms=0.5)
    rows = merged([a, b, c], ("collective", "group", "dtype"), "bytes", ("time_ms",))
    by_size = {row["bytes"]: row for row in rows}
    assert by_size[1 << 20]["time_ms"] == pytest.approx(1.1)
    assert by_size[1 << 10]["p10_ms"] == 0.01 and by_size[1 << 10]["p90_ms"] == 0.5


def test_plan_warns_about_a_poor_fit_it_is_priced_with_and_names_its_evidence(cli, tmp_path):
    """A profile whose fp32 allreduce sweep a noise burst spoiled: plan warns (stderr, at
    normal verbosity) naming the fit; the evidence line says raw gains only."""
    import shutil

    import pandas as pd

    root = Path(__file__).resolve().parents[1]
    profile = tmp_path / "profile"
    shutil.copytree(root / "profiles" / "transformer", profile)
    table = pd.read_csv(profile / "collectives.csv")
    spoiled = (table.collective == "allreduce") & (table.group == "world") & \
        (table.dtype == "float32")
    sizes = sorted(table[spoiled].bytes)
    middle = sizes[len(sizes) // 2]
    table.loc[spoiled & (table.bytes == middle), "time_ms"] *= 20
    table.to_csv(profile / "collectives.csv", index=False)
    done = cli("plan", profile, "--out", tmp_path / "plan.yaml")
    assert done.returncode == 0, done.stderr
    assert "evidence: raw gains only" in " ".join(done.stdout.split())
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert any("poor fit" in w and "allreduce/world/float32" in w for w in warnings), \
        done.stderr


# -- the profile's recipe and evidence (2 ranks) ---------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("factory,batches", [("with_recipe", "validation"),
                                             ("without_validation", "held-out training batches")])
def test_a_factorys_recipe_is_profiled_with_a_probe(cli, monkeypatch, tmp_path, factory, batches):
    monkeypatch.syspath_prepend(FIXTURES)
    out = tmp_path / "profile"
    done = cli("profile", "--model", f"factories:{factory}", "--nproc", "2", "--quick", "--out",
               out, "--compressor", "fp16", "--compressor", "topk:ratio=0.1")
    assert done.returncode == 0, done.stderr
    profile = load_profile(out)
    meta = yaml.safe_load((out / "profile.yaml").read_text())
    assert meta["recipe"]["optimizer"] == "sgd:lr=0.1,momentum=0.9"
    assert meta["fidelity"]["optimizer"] == meta["probe"]["optimizer"] == meta["recipe"]["optimizer"]
    assert meta["probe"]["batches"] == batches and meta["probe"]["informative"]
    assert meta["probe"]["fp32_improvement"] > 0.01
    assert set(profile.steps_factors) == {"fp16", "topk:ratio=0.1"}
    assert all(math.isfinite(f) for f in profile.steps_factors.values())
    assert "quality" in meta and meta["quality"]["retries"] == 2
    plan = cli("plan", out, "--out", tmp_path / "plan.yaml", "--model", f"factories:{factory}")
    assert plan.returncode == 0, plan.stderr
    assert f"losses on {batches}) calibrates the gains" in " ".join(plan.stdout.split())


@pytest.mark.multirank
def test_a_probe_that_learns_nothing_is_no_evidence_and_plan_says_so(cli, monkeypatch, tmp_path):
    """Random labels: fp32's loss does not fall, so the probe records no factors, and plan
    warns that it decides on raw gains."""
    monkeypatch.syspath_prepend(FIXTURES)
    out = tmp_path / "profile"
    done = cli("profile", "--model", "factories:tiny", "--nproc", "2", "--quick", "--out", out,
               "--compressor", "topk:ratio=0.1", "--optimizer", "sgd:lr=0.0001")
    assert done.returncode == 0, done.stderr
    meta = yaml.safe_load((out / "profile.yaml").read_text())
    assert meta["probe"]["informative"] is False and meta["probe"]["steps"] == 0
    assert load_profile(out).steps_factors == {}
    plan = cli("plan", out, "--out", tmp_path / "plan.yaml", "--model", "factories:tiny")
    assert "warning: raw gains only: in the convergence probe" in plan.stderr


# -- learning-rate schedules ---------------------------------------------------------------

@pytest.mark.parametrize("text, canonical", [
    ("cosine", "cosine"), ("Cosine:steps=500, warmup=20", "cosine:steps=500,warmup=20"),
    ("step:gamma=0.5,every=10", "step:every=10,gamma=0.5"),
    ("warmup:start=0.01,steps=50", "warmup:steps=50,start=0.01"),
])
def test_scheduler_specs_parse_to_a_canonical_form(text, canonical):
    from bytecomp.recipe import parse_scheduler

    assert parse_scheduler(text).spec == canonical


@pytest.mark.parametrize("text, message", [
    ("", "empty scheduler spec"), ("linear", "unknown scheduler 'linear'; choose from cosine"),
    ("step:gama=0.5", "unknown parameter 'gama' (did you mean 'gamma'?)"),
    ("step:every=0", "every=0 is out of range"), ("cosine:steps=1.5", "not a whole number"),
    ("warmup:start=2", "start=2 is out of range"), ("step:gamma", "gamma needs a value"),
    ("cosine:min_lr=nan", "out of range"), ("step:every=2,every=3", "every given twice"),
])
def test_bad_scheduler_specs_are_one_clear_error(text, message):
    from bytecomp.recipe import parse_scheduler

    with pytest.raises(BytecompError, match=re.escape(message)):
        parse_scheduler(text)


def _rates(spec: str, steps: int, clip: bool = False) -> list[float]:
    model = torch.nn.Linear(2, 2)
    optimizer = parse_optimizer("sgd:lr=0.1" + (",clip=1" if clip else "")).build(
        model.parameters())
    from bytecomp.training.workloads import Workload

    scheduler = Workload("net", model, lambda n: None, scheduler=spec).make_scheduler(optimizer)
    rates = []
    with warnings.catch_warnings():  # no optimizer step: the rates alone (its first step
        warnings.simplefilter("ignore")  # imports torch._dynamo, seconds)
        for _ in range(steps):
            scheduler.step()
            rates.append(optimizer.param_groups[0]["lr"])
    return rates


def test_each_schedule_moves_the_rate_as_it_says():
    assert _rates("step:every=2,gamma=0.5", 6) == pytest.approx(
        [0.1, 0.05, 0.05, 0.025, 0.025, 0.0125])
    assert _rates("warmup:steps=4,start=0.2", 5, clip=True) == pytest.approx(
        [0.04, 0.06, 0.08, 0.1, 0.1])  # through a clipped optimizer too
    cosine = _rates("cosine:steps=4", 4)
    assert cosine[1] == pytest.approx(0.05) and cosine[-1] == pytest.approx(0.0, abs=1e-12)
    warm = _rates("cosine:steps=4,warmup=2,start=0.5", 6)
    assert warm[0] == pytest.approx(0.075) and warm[1] == pytest.approx(0.1)
    assert warm[-1] < warm[2] < 0.1
    from bytecomp.training.workloads import Workload

    assert Workload("net", torch.nn.Linear(2, 2), lambda n: None).make_scheduler(None) is None


def test_the_profile_command_refuses_a_bad_scheduler_before_any_rank(cli):
    done = cli("profile", "--scheduler", "cosine:stepz=3", "--nproc", "2")
    assert done.returncode == 2
    assert "unknown parameter 'stepz' (did you mean 'steps'?)" in done.stderr


def test_a_profile_s_recorded_schedule_is_what_plan_and_bench_train_with():
    from bytecomp.profile_store import Profile

    def profile(recipe):
        loaded = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "cnn")
        return Profile({**loaded.meta, "recipe": recipe}, *[getattr(loaded, name) for name in (
            "tensors", "collectives", "compressors", "copies", "path")])

    assert profile({"scheduler": "cosine:warmup=5"}).recipe_scheduler() == "cosine:warmup=5"
    assert profile({"scheduler": "the factory's (schedule)"}).recipe_scheduler() is None
    assert profile({}).recipe_scheduler() is None


def _probe_with_schedule(rank, world):
    """The convergence probe of a small MLP whose recipe halves the rate every 2 steps:
    every trainee's scheduler, as the probe left it."""
    from bytecomp.training.probe import run_probe

    workload = load_workload("mlp:inputs=16,width=32,depth=2")
    made = []

    def schedule(optimizer):
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        made.append((optimizer, scheduler))
        return scheduler

    workload.scheduler = schedule
    run_probe(workload, torch.device("cpu"), 8, 25.0, ["fp16"], 6, 3, world, 1)
    return [(scheduler.last_epoch, optimizer.param_groups[0]["lr"])
            for optimizer, scheduler in made]


@pytest.mark.multirank
def test_a_recipe_with_a_scheduler_steps_it_in_the_probe():
    """fp32 DDP and fp16 trained 6 steps: each has its own scheduler, stepped after each
    optimizer step, so the rate is 0.001 x 0.5^3 at the end, on every rank."""
    from ranks import run_ranks

    for seen in run_ranks(_probe_with_schedule, 2):
        assert len(seen) == 2 and all(epoch == 6 for epoch, _ in seen)
        assert all(lr == pytest.approx(0.001 * 0.5 ** 3) for _, lr in seen)
