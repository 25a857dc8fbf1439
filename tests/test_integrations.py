"""bytecomp where people train: wrapped and compiled models, comm_hook, models that are
not DDP, per-interval statistics, and the recipes of examples/recipes (Lightning,
Accelerate, torch.compile in both orders, torch.distributed.checkpoint, gradient
accumulation) run under torchrun on 2 gloo ranks."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.naming import normalize
from bytecomp.plan_file import plan_for_model
from bytecomp.plan_types import Option, fingerprint
from bytecomp.runtime.apply import not_ddp
from bytecomp.runtime.checks import match_parameters
from bytecomp.runtime.state import Stats

from ranks import free_port, run_ranks

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
TOPK = Option("topk:ratio=0.05", "device", "allgather")


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


class Holder(nn.Module):
    """A LightningModule-like outer module keeping the network as an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.net = net()

    def forward(self, x):
        return self.net(x)


def topk_plan(model: nn.Module, world: int = 2):
    return plan_for_model(model, lambda n, p: TOPK if p.dim() == 2 else Option(), world)


# -- names -----------------------------------------------------------------------------------

@pytest.mark.parametrize("names, expected", [
    (["0.weight", "2.bias"], ["0.weight", "2.bias"]),
    (["0.weight", "0.bias"], ["weight", "bias"]),
    (["module.0.weight", "module.2.bias"], ["0.weight", "2.bias"]),
    (["_orig_mod.0.weight", "_orig_mod.2.bias"], ["0.weight", "2.bias"]),
    (["module._orig_mod.net.0.weight", "module._orig_mod.net.2.bias"], ["0.weight", "2.bias"]),
    (["net.0.weight", "net.2.bias"], ["0.weight", "2.bias"]),
    (["enc._checkpoint_wrapped_module.w", "dec.w"], ["enc.w", "dec.w"]),
    (["fc.weight", "fc.bias"], ["weight", "bias"]),
    (["weight"], ["weight"]),
    (["module.x", "x"], ["module.x", "x"]),  # would collide: unchanged
])
def test_names_lose_wrapper_prefixes_and_shared_components(names, expected):
    assert list(normalize(names).names.values()) == expected


def test_a_wrapped_or_compiled_model_has_the_bare_models_fingerprint():
    bare = fingerprint(net())
    assert fingerprint(Holder()) == bare
    assert fingerprint(torch.compile(net())) == bare
    assert fingerprint(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))) != bare


def test_a_plan_for_the_bare_model_matches_the_wrapped_one_by_its_names():
    plan = topk_plan(net())
    params, problem = match_parameters(plan, Holder())
    assert problem is None and sorted(params) == sorted(e.name for e in plan.entries)


def test_a_mismatch_names_the_first_differing_parameter_and_the_prefixes_tried():
    plan = topk_plan(net())
    other = Holder()
    other.net.add_module("3", nn.Linear(4, 4))
    _, problem = match_parameters(plan, other)
    assert problem is not None
    assert "'net.3.weight' (normalized '3.weight') is not in the plan" in problem
    assert "prefixes tried: model 'net.'" in problem


# -- what is not DDP, and comm_hook's arguments ---------------------------------------------

def test_a_bare_module_is_refused_with_what_is_supported():
    message = not_ddp(net())
    assert "got Sequential, a module not wrapped in DDP" in message
    assert "bytecomp.comm_hook" in message and "\n" not in message


def test_comm_hook_reads_the_plan_and_checks_its_arguments(tmp_path):
    path = topk_plan(net()).save(tmp_path / "plan.yaml")
    state, hook = bytecomp.comm_hook(path)
    assert state.plan.compressors == ["topk:ratio=0.05"] and callable(hook)
    assert state.stats.summary()["steps"] == 0
    with pytest.raises(BytecompError, match="no step has run"):
        state.state_dict()
    with pytest.raises(BytecompError, match="fallback must be None or 'fp32'"):
        bytecomp.comm_hook(path, fallback="fp16")


# -- statistics ----------------------------------------------------------------------------

def test_stats_give_the_interval_since_the_last_read_beside_the_totals():
    stats = Stats()
    for step in range(4):
        stats.add(sent_bytes=10 * (step + 1), fp32_bytes=100, steps=1)
    assert stats.interval()["sent_bytes_per_step"] == 25.0
    stats.add(sent_bytes=50, fp32_bytes=100, steps=1)
    assert stats.interval()["steps"] == 1 and stats.interval()["steps"] == 0  # read: reset
    stats.add(sent_bytes=70, fp32_bytes=100, steps=1)
    interval = stats.interval()
    assert interval["steps"] == 1 and interval["sent_bytes_per_step"] == 70.0
    assert stats.summary()["steps"] == 6
    assert stats.summary()["sent_bytes_per_step"] == pytest.approx(220 / 6)


def test_stats_log_every_n_steps_to_a_callable_or_a_summary_writer():
    logged: list = []
    stats = Stats()
    stats.log_every(2, lambda figures, step: logged.append((step, figures["sent_bytes_per_step"])))
    for step in range(5):
        stats.add(sent_bytes=10 * (step + 1), fp32_bytes=100, steps=1)
    assert logged == [(2, 15.0), (4, 35.0)]

    class Writer:  # the one method of torch.utils.tensorboard.SummaryWriter it uses
        def __init__(self) -> None:
            self.scalars: list = []

        def add_scalar(self, tag, value, step) -> None:
            self.scalars.append((tag, value, step))

    writer = Writer()
    stats.log_every(1, writer)
    stats.add(sent_bytes=60, fp32_bytes=100, steps=1)
    # steps 5 and 6 since the last log at step 4: (50 + 60) / 2 bytes per step
    assert ("bytecomp/sent_bytes_per_step", 55.0, 6) in writer.scalars
    for bad in (0, -1, 1.5, True):
        with pytest.raises(BytecompError, match="whole number of steps"):
            stats.log_every(bad, writer)
    with pytest.raises(BytecompError, match="SummaryWriter or a callable"):
        stats.log_every(1, "tensorboard")


def test_stats_log_to_tensorboard_when_installed(tmp_path):
    tensorboard = pytest.importorskip("torch.utils.tensorboard", reason="tensorboard not installed")
    writer = tensorboard.SummaryWriter(tmp_path)
    stats = Stats()
    stats.log_every(1, writer)
    stats.add(sent_bytes=10, fp32_bytes=100, steps=1)
    writer.close()
    assert list(tmp_path.glob("events.out.tfevents.*"))


# -- on real ranks -------------------------------------------------------------------------

def _train(ddp, steps: int = 3) -> None:
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(steps):
        ddp(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def _runs(rank, world, case):
    plan = topk_plan(net(), world)
    if case == "comm_hook":  # no model given: found from the bucket's parameters
        ddp = DistributedDataParallel(Holder())
        state, hook = bytecomp.comm_hook(plan)
        ddp.register_comm_hook(state, hook)
    elif case == "comm_hook_model":
        holder = Holder()
        ddp = DistributedDataParallel(holder)
        state, hook = bytecomp.comm_hook(plan, holder)
        ddp.register_comm_hook(state, hook)
    elif case == "compiled_inside":
        ddp = DistributedDataParallel(torch.compile(net()))
        state = bytecomp.apply_plan(ddp, plan)
    else:  # "compiled_outside": apply_plan takes the compiled DDP too
        ddp = torch.compile(DistributedDataParallel(net()))
        state = bytecomp.apply_plan(ddp, plan)
    with state:
        _train(ddp)
    return state.stats.summary()


@pytest.mark.multirank
@pytest.mark.parametrize("case", ["comm_hook", "comm_hook_model", "compiled_inside",
                                  "compiled_outside"])
def test_plans_run_on_wrapped_compiled_and_hook_registered_models(case):
    for summary in run_ranks(_runs, 2, case):
        assert summary["steps"] == 3 and 0 < summary["bytes_vs_fp32"] < 0.5


def _refusals(rank, world):
    from torch.distributed.fsdp import fully_shard

    plan = topk_plan(net(), world)
    found = {}
    sharded = net()
    fully_shard(sharded)
    try:
        bytecomp.apply_plan(sharded, plan)
    except BytecompError as error:
        found["fsdp2"] = str(error)
    other = Holder()
    other.net.add_module("3", nn.Linear(4, 4))
    ddp = DistributedDataParallel(other)
    state, hook = bytecomp.comm_hook(plan)
    ddp.register_comm_hook(state, hook)
    try:
        with state:
            _train(ddp, 1)
    except BytecompError as error:
        found["comm_hook"] = str(error)
    return found


@pytest.mark.multirank
def test_fsdp_and_a_mismatch_at_the_first_bucket_get_one_line_each():
    for found in run_ranks(_refusals, 2):
        assert "got FSDPSequential: FSDP reduce-scatters sharded gradients" in found["fsdp2"]
        assert "'net.3.weight' (normalized '3.weight') is not in the plan" in found["comm_hook"]
        # the function the user called, not the one it calls
        assert found["comm_hook"].startswith("bytecomp.comm_hook: rank ")
        assert "apply_plan" not in found["comm_hook"]


# -- the recipes ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def recipe_plan(tmp_path_factory):
    sys.path.insert(0, str(RECIPES))
    try:
        import common
    finally:
        sys.path.remove(str(RECIPES))
    plan = plan_for_model(common.model(), lambda n, p: TOPK if p.dim() == 2 else Option(), 2)
    return plan.save(tmp_path_factory.mktemp("recipes") / "plan.yaml")


def recipe(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(RECIPES / script), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def reported(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith('{"recipe"')]
    assert len(lines) == 1, result.stdout[-3000:]
    return json.loads(lines[0])


STEPS = "40"


@pytest.mark.multirank
@pytest.mark.parametrize("script, args", [
    ("lightning_ddp.py", ()), ("accelerate_ddp.py", ()),
    ("compile_ddp.py", ("--order", "compile-then-ddp")),
    ("compile_ddp.py", ("--order", "ddp-then-compile")),
    ("grad_accumulation.py", ("--micro", "4")),
], ids=["lightning", "accelerate", "compile-then-ddp", "ddp-then-compile", "accumulation"])
def test_recipes_train_with_the_plan_as_plain_ddp_code_does(script, args, recipe_plan, tmp_path):
    result = reported(recipe(script, "--plan", str(recipe_plan), "--steps", STEPS, *args))
    assert result["steps"] == int(STEPS) and result["runs_as"] == "Executor"
    assert result["bytes_vs_fp32"] < 0.2  # top-k 5% on the matrices: the plan ran
    # the same model, data and plan as the plain loop of the DCP recipe: the same losses
    plain = reported(recipe("dcp_checkpoint.py", "--plan", str(recipe_plan), "--steps", STEPS,
                            "--checkpoint", str(tmp_path / "unused")))
    assert result["first_loss"] == pytest.approx(plain["first_loss"], rel=1e-5)
    assert result["last_loss"] == pytest.approx(plain["last_loss"], rel=1e-4)
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.multirank
@pytest.mark.slow
def test_lightning_tunes_inside_the_job_through_comm_hook(tmp_path):
    """The Lightning recipe with --autotune: DDPStrategy registers comm_hook(autotune=...)
    and Lightning trains through the tuner (measuring, then planning beside it)."""
    out = tmp_path / "autotune-plan.yaml"
    result = reported(recipe("lightning_ddp.py", "--autotune", str(out), "--steps", "200"))
    # the tuner ran every step (where it got to in 200 steps depends on the machine's load)
    assert result["runs_as"] == "TunerHook" and result["steps"] > 0
    assert result["phase"] in ("measure", "plan", "trial", "watch", "fp32")
    assert result["last_loss"] < result["first_loss"]
    if out.exists():  # planned within the run: the plan it saved loads
        assert bytecomp.load_plan(out).search["autotune"]["reason"]


@pytest.mark.multirank
def test_dcp_checkpoint_resumes_where_the_run_left_off(recipe_plan, tmp_path):
    checkpoint = str(tmp_path / "ckpt")
    whole = reported(recipe("dcp_checkpoint.py", "--plan", str(recipe_plan), "--steps", STEPS,
                            "--checkpoint", checkpoint, "--save-at", "20"))
    resumed = reported(recipe("dcp_checkpoint.py", "--plan", str(recipe_plan), "--steps", STEPS,
                              "--checkpoint", checkpoint, "--resume"))
    assert resumed["steps"] == 20
    # residuals, momentum and weights restored: the same trajectory to the last bit
    assert resumed["last_loss"] == whole["last_loss"]


@pytest.mark.multirank
def test_compiled_autograd_is_refused_in_one_line(recipe_plan):
    result = recipe("compile_ddp.py", "--plan", str(recipe_plan), "--order", "compiled-autograd")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: rank")]
    # torchrun stops the other rank as soon as one fails: one or two such lines
    assert errors and all("optimize_ddp='python_reducer'" in e for e in errors)
    assert "bytecomp/runtime" not in result.stderr  # no traceback through bytecomp


def test_the_readmes_cluster_config_describes_eight_ranks_on_four_machines():
    from bytecomp.costs.clusters import load_cluster

    cluster = load_cluster(str(ROOT / "examples" / "my-cluster.yaml"))
    assert (cluster.nodes, cluster.ranks_per_node, cluster.world_size) == (4, 2, 8)
    assert "examples/my-cluster.yaml" in (ROOT / "README.md").read_text()


def test_every_install_line_names_the_distribution_bytecomp_ddp():
    import re
    from importlib.metadata import distribution

    installed = distribution("bytecomp-ddp")  # the checkout, installed under its name
    assert [(e.name, e.value) for e in installed.entry_points
            if e.group == "console_scripts"] == [("bytecomp", "bytecomp.cli:main")]
    assert 'name = "bytecomp-ddp"' in (ROOT / "pyproject.toml").read_text()
    # PyPI's "bytecomp" is another project: no install line may fetch it
    wrong = re.compile(r"pip install\s+['\"]?bytecomp(?![-\w])")
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "bytecomp").rglob("*.py"),
             *(ROOT / "notebooks").glob("*.ipynb")]
    found = [f"{path.name}: {line.strip()}" for path in texts
             for line in path.read_text().splitlines()
             if wrong.search(line) and "fetches another" not in line
             and "history" not in path.name]
    assert not found, found


def test_a_plan_naming_some_tensors_under_one_prefix_matches_them_as_named():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = net(), nn.Linear(4, 2)

    model = Two()
    plan = plan_for_model(model, lambda n, p: TOPK if p.dim() == 2 else Option(), 2)
    plan.entries = [e for e in plan.entries if e.name.startswith("body.")]  # head: fallback
    params, problem = match_parameters(plan, model)
    assert {e.name for e in plan.entries} <= set(params)
    assert "'head.weight' is not in the plan" in problem  # without fallback='fp32'


def test_times_not_measured_read_as_none_not_as_zero():
    """A plan run by PyTorch's own hook counts bytes but does not time its exchanges: its
    summary says None for the times, not 0.0 (free)."""
    from bytecomp.runtime.state import Stats

    stats = Stats(timed=False)
    stats.add(steps=2, sent_bytes=10, fp32_bytes=20)
    summary = stats.summary()
    assert summary["bytes_vs_fp32"] == 0.5
    assert all(summary[f"{name}_ms_per_step"] is None
               for name in ("encode", "communicate", "decode", "hook"))
    logged = []
    stats.log_every(1, lambda figures, step: logged.append(figures))
    stats.add(steps=1)
    assert logged and logged[0]["encode_ms_per_step"] is None
    assert Stats().summary()["encode_ms_per_step"] == 0.0


@pytest.mark.multirank
def test_the_command_sequence_of_the_integrations_page_runs_as_written(tmp_path):
    """docs/integrations.md's commands, from profile to a recipe under torchrun with the
    plan the CLI made (the install line aside: the package is installed here)."""
    text = (ROOT / "docs" / "integrations.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("pip ")]
    assert [c.split()[0] for c in commands] == ["bytecomp", "bytecomp", "torchrun"]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                 f"{os.environ.get('PATH', '')}"}
    for command in commands:
        done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert reported(done)["steps"] > 0  # the recipe trained with the CLI's plan
