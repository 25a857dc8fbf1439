"""The pipeline from Python (bytecomp.profile/plan/simulate/bench): the same plan file as
the command line, the options declared once, bad input one BytecompError, the CLI a thin
layer over it, and docs/api.md's examples as written."""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import typer.main
import yaml

import bytecomp
from bytecomp.cli import app
from bytecomp.errors import BytecompError
from bytecomp.option_fields import cli_name
from bytecomp.options import BenchOptions, PlanOptions, ProfileOptions, SimulateOptions

ROOT = Path(__file__).resolve().parents[1]
TRANSFORMER = ROOT / "profiles" / "transformer"
COMMANDS = {"profile": ProfileOptions, "plan": PlanOptions, "simulate": SimulateOptions,
            "bench": BenchOptions}


def comparable(path: Path) -> dict:
    """A plan file without what differs between two identical runs: when it was made and
    how long the search took on the clock."""
    document = yaml.safe_load(path.read_text())
    document.pop("created")
    document["search"].pop("time_ms")
    return document


def test_the_cli_and_the_library_write_the_same_plan_file(tmp_path, cli):
    from bytecomp.cli import _plain

    done = cli("plan", TRANSFORMER, "--cluster", "gbe1", "--no-verify", "--out",
               tmp_path / "cli.yaml", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = bytecomp.plan(TRANSFORMER, cluster="gbe1", verify=False, out=tmp_path / "api.yaml")
    assert comparable(tmp_path / "cli.yaml") == comparable(tmp_path / "api.yaml")
    assert result.written == tmp_path / "api.yaml"
    # the table and the plan line the command prints are the library's
    shown, made = json.loads(done.stdout), _plain(result.to_dict())
    assert shown["strategies"] == made["strategies"]
    assert shown["composition"] == made["composition"] == result.composition
    assert shown["strategies"] == _plain(result.strategies.to_dict(orient="records"))
    assert list(result.tensors["name"]) == [entry.name for entry in result.plan.entries]
    assert result.finalists is None and result.verification is None


def test_an_adaptive_plan_is_the_same_from_both(tmp_path, cli):
    from test_adaptive import ladder_profile

    from bytecomp.profiler import save_profile

    folder = save_profile(ladder_profile(["fp16", "topk:ratio=0.1", "topk:ratio=0.01"]),
                          tmp_path / "profile")
    done = cli("plan", folder, "--no-verify", "--adaptive", "topk", "--window", 4,
               "--out", tmp_path / "cli.yaml")
    assert done.returncode == 0, done.stderr
    result = bytecomp.plan(folder, verify=False, adaptive="topk", window=4,
                           out=str(tmp_path / "api.yaml"))
    assert comparable(tmp_path / "cli.yaml") == comparable(tmp_path / "api.yaml")
    assert list(result.strategies["level"]) == list(range(len(result.plan.levels)))


def test_a_profile_read_once_plans_for_many_clusters_without_a_file(tmp_path):
    profile = bytecomp.load_profile(TRANSFORMER)
    by_file = bytecomp.plan(TRANSFORMER, cluster="gbe1", verify=False, out=None)
    for cluster in ("gbe1", "v100-pcie-25g"):
        result = bytecomp.plan(profile, cluster=cluster, verify=False, out=None)
        assert result.written is None
        assert result.plan.world_size == (8 if cluster == "gbe1" else 64)
    by_object = bytecomp.plan(profile, cluster="gbe1", verify=False, out=None)
    assert by_object.plan.digest() == by_file.plan.digest()
    assert not list(tmp_path.iterdir())


def test_simulate_from_python_is_the_command_s_json(tmp_path, cli):
    plan = tmp_path / "plan.yaml"
    bytecomp.plan(TRANSFORMER, cluster="gbe1", verify=False, out=plan)
    done = cli("simulate", TRANSFORMER, plan, "--cluster", "gbe1", "--format", "json")
    assert done.returncode == 0, done.stderr
    simulation = bytecomp.simulate(TRANSFORMER, plan, cluster="gbe1")
    assert json.loads(done.stdout) == json.loads(json.dumps(
        {**simulation.to_dict(), "plan": str(plan)}))
    assert simulation.table["ms"].iloc[0] == simulation.iteration_ms
    assert simulation.timeline.events  # the simulator's own record, for charts


@pytest.mark.parametrize("call, message", [
    (lambda: bytecomp.plan(TRANSFORMER, verify=False, min_gains=5), "has no option 'min_gains'"),
    (lambda: bytecomp.plan(TRANSFORMER, verify_budjet=30),
     "no option 'verify_budjet' (did you mean 'verify_budget'?)"),
    (lambda: bytecomp.plan(TRANSFORMER, verify=False, min_gain=150), "--min-gain is a percentage"),
    (lambda: bytecomp.plan(TRANSFORMER, verify=False, algorithm="fast"), "--algorithm must be"),
    (lambda: bytecomp.plan(TRANSFORMER, verify=False, window=3), "--window"),
    (lambda: bytecomp.plan(TRANSFORMER, verify=False, verify_budget=10), "--no-verify"),
    (lambda: bytecomp.plan(TRANSFORMER, verify_budget=math.nan), "--verify-budget"),
    (lambda: bytecomp.plan(TRANSFORMER, verify=False, cluster=" "), "--cluster is empty"),
    (lambda: bytecomp.plan("no/such/profile", verify=False), "no/such/profile"),
    (lambda: bytecomp.simulate(TRANSFORMER, "no-such-plan.yaml"), "no-such-plan.yaml"),
    (lambda: bytecomp.bench(TRANSFORMER, "plan.yaml", to_loss=math.inf), "--to-loss"),
    (lambda: bytecomp.bench(TRANSFORMER, "plan.yaml", iterations=0), "--iterations"),
    (lambda: bytecomp.bench(TRANSFORMER, "plan.yaml", reference_seed=1), "--train-steps"),
    (lambda: bytecomp.bench(TRANSFORMER, "plan.yaml", train_steps=10, reference_seed=0),
     "--reference-seed must be"),
    (lambda: bytecomp.profile("mlp", device="tpu"), "--device must be"),
    (lambda: bytecomp.profile("mlp", calibrate_only=True), "--model"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_bad_input_is_one_bytecomp_error_before_any_work(tmp_path, monkeypatch, call, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BytecompError) as raised:
        call()
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_declared_once_for_the_command_and_the_library(command):
    """The command's options are the dataclass's fields, with the same defaults (a
    repeatable option's empty tuple is the command line's None), and the help is the
    field's."""
    options = COMMANDS[command]
    click_command = typer.main.get_command(app).commands[command]
    params = {param.name: param for param in click_command.params}
    for field in dataclasses.fields(options):
        if not field.metadata["cli"]:
            assert field.name not in params
            continue
        param = params[field.name]
        assert param.default == (None if field.default == () else field.default), field.name
        assert param.help == field.metadata["help"]
        assert cli_name(options, field.name) in param.opts
    # what the command line has beyond the fields: its arguments and its printing
    extra = set(params) - {field.name for field in dataclasses.fields(options)}
    assert extra <= {"profile", "plan_file", "verbose", "output_format"}, extra


def command_bodies() -> dict[str, int]:
    """Lines of each command's function in bytecomp/cli.py (docstring and decorator
    excluded)."""
    tree = ast.parse((ROOT / "bytecomp" / "cli.py").read_text())
    lengths = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in (*COMMANDS, "compressors",
                                                                 "emulate"):
            first = node.body[1] if ast.get_docstring(node) else node.body[0]
            lengths[node.name] = node.end_lineno - first.lineno + 1
    return lengths


def test_the_command_line_is_a_thin_layer():
    """Each command parses, calls the library and prints: at most 40 lines, and no
    command reaches into the search, the profiler or the bench runner itself."""
    lengths = command_bodies()
    assert set(lengths) == {*COMMANDS, "compressors", "emulate"}
    assert max(lengths.values()) <= 40, lengths
    source = (ROOT / "bytecomp" / "cli.py").read_text()
    for internal in ("Planner(", "run_profile(", "run_bench(", "verify(", "to_plan(",
                     "load_profile(", "simulate_plan("):
        assert internal not in source, f"bytecomp/cli.py calls {internal}: pipeline logic " \
                                       f"belongs in the library"


def api_examples() -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## The pipeline from Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_api_page_s_planning_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/api.md's first example, from a copy of the repository's profiles."""
    import shutil

    shutil.copytree(ROOT / "profiles" / "transformer", tmp_path / "profiles" / "transformer")
    monkeypatch.chdir(tmp_path)
    exec(compile(api_examples()[0], "docs/api.md", "exec"), {})
    shown = capsys.readouterr().out
    assert "head.weight" in shown and "bytecomp plan" in shown and "ms an iteration" in shown
    assert bytecomp.load_plan(tmp_path / "plan.yaml").world_size == 8


@pytest.mark.slow
def test_the_api_page_s_planning_example_runs_as_a_script(tmp_path):
    """The same example saved as a file and run by a new interpreter."""
    import shutil

    from test_doc_blocks import run_script

    shutil.copytree(ROOT / "profiles" / "transformer", tmp_path / "profiles" / "transformer")
    done = run_script(api_examples()[0], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ms an iteration" in done.stdout
    assert bytecomp.load_plan(tmp_path / "plan.yaml").world_size == 8


@pytest.mark.multirank
def test_the_api_page_s_profiling_example_runs_as_written(tmp_path):
    """docs/api.md's second example, saved as a script and run as a user runs it: a quick
    profile on 2 spawned ranks (which run the script again: its main guard), then a plan."""
    from test_doc_blocks import run_script

    done = run_script(api_examples()[1], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert bytecomp.load_plan(tmp_path / "mlp-plan.yaml").world_size == 2
    assert (tmp_path / "profiles" / "mlp-quick" / "profile.yaml").exists()
    assert "x " in done.stdout
