"""Class 1 of the hostile corpus: a profile directory names code. ``model.spec`` in
profile.yaml is data: ``plan`` (which trains the finalists), ``bench`` and ``simulate``
build a model from it only when it is a built-in or the user names the same spec with
``--model``. Each spec below would do harm if imported or called (abort, crash, hang,
fork, a console on stdin, a module whose import runs code); none may run.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from refusal import one_line_error

from bytecomp.model_spec import BUILTIN_MODELS, allowed_model
from bytecomp.training.builtin_models import BUILTINS

ROOT = Path(__file__).resolve().parents[2]
PLANNED = ROOT / "benchmarks" / "results" / "emulated" / "cnn-2x1-1gbit"  # a profile and plan
HARMFUL = ["os:abort", "faulthandler:_sigsegv", "signal:pause", "os:fork", "code:interact",
           "sideeffect_module:factory"]
SIDE_EFFECT = "sideeffect_module"


@pytest.fixture
def named(tmp_path, monkeypatch):
    """A profile and plan whose profile.yaml names ``spec``, and a module on the path whose
    import would write a marker file."""
    module_dir = tmp_path / "modules"
    module_dir.mkdir()
    marker = tmp_path / "imported"
    (module_dir / f"{SIDE_EFFECT}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "def factory():\n    raise SystemExit('the factory ran')\n")
    monkeypatch.syspath_prepend(str(module_dir))
    monkeypatch.delitem(sys.modules, SIDE_EFFECT, raising=False)

    def make(spec: str) -> tuple[Path, Path, Path]:
        folder = tmp_path / spec.replace(":", "-")
        shutil.copytree(PLANNED / "profile", folder / "profile")
        shutil.copy(PLANNED / "plan.yaml", folder / "plan.yaml")
        meta_file = folder / "profile" / "profile.yaml"
        meta = yaml.safe_load(meta_file.read_text())
        meta["model"]["spec"] = spec
        meta_file.write_text(yaml.safe_dump(meta, sort_keys=False))
        return folder / "profile", folder / "plan.yaml", marker
    return make


def _nothing_ran(marker: Path) -> None:
    assert not marker.exists()
    assert SIDE_EFFECT not in sys.modules


@pytest.mark.parametrize("spec", HARMFUL)
def test_plan_does_not_run_a_spec_only_the_profile_names(cli, named, tmp_path, spec):
    profile, _, marker = named(spec)
    done = cli("plan", profile, "--out", tmp_path / "plan.yaml", "--compressor", "fp16",
               "--algorithm", "greedy")
    one_line_error(done, "which is code bytecomp does not run because a file names it",
                          f"pass --model {spec}", "--no-verify")
    _nothing_ran(marker)
    assert not (tmp_path / "plan.yaml").exists()


@pytest.mark.parametrize("spec", HARMFUL)
def test_bench_does_not_run_a_spec_only_the_profile_names(cli, named, tmp_path, spec):
    profile, plan, marker = named(spec)
    done = cli("bench", profile, "--plan", plan, "--out", tmp_path / "bench", "--nproc", "2")
    one_line_error(done, "which is code bytecomp does not run because a file names it",
                          f"pass --model {spec}")
    _nothing_ran(marker)
    assert not (tmp_path / "bench").exists()


def test_simulate_and_plan_without_training_import_no_module_a_profile_names(cli, named,
                                                                             tmp_path):
    profile, plan, marker = named(f"{SIDE_EFFECT}:factory")
    assert cli("simulate", profile, plan).returncode == 0
    done = cli("plan", profile, "--out", tmp_path / "plan.yaml", "--no-verify")
    assert done.returncode == 0, done.stderr
    _nothing_ran(marker)


def test_naming_the_spec_on_the_command_line_allows_it(cli, named, tmp_path):
    """The user's own --model is what allows a factory: then it is imported (here it is not
    the model profiled, which the fingerprint check then says)."""
    spec = f"{SIDE_EFFECT}:factory"
    profile, _, marker = named(spec)
    done = cli("plan", profile, "--out", tmp_path / "plan.yaml", "--model", spec)
    assert done.returncode == 2
    assert marker.exists()  # imported because the user named it


def test_a_model_other_than_the_profiles_is_refused(cli, named, tmp_path):
    profile, _, marker = named(f"{SIDE_EFFECT}:factory")
    one_line_error(cli("plan", profile, "--out", tmp_path / "plan.yaml", "--model",
                              "other_module:factory"),
                          "--model other_module:factory is not the model")
    _nothing_ran(marker)


def test_model_has_no_effect_where_nothing_is_trained(cli, tmp_path):
    profile = PLANNED / "profile"
    one_line_error(cli("plan", profile, "--out", tmp_path / "p.yaml", "--no-verify",
                              "--model", "cnn"), "--model has no effect with --no-verify")
    one_line_error(cli("plan", profile, "--out", tmp_path / "p.yaml", "--adaptive",
                              "topk", "--model", "cnn"), "--model has no effect with --adaptive")


def test_the_rule():
    assert allowed_model("transformer:layers=2", None, "p", "skip") == "transformer:layers=2"
    assert allowed_model(" pkg.mod:make ", "pkg.mod:make", "p", "skip") == "pkg.mod:make"
    for spec in ("pkg.mod:make", "os:system", "", 5, None):
        with pytest.raises(Exception, match="p"):
            allowed_model(spec, None, "p", "skip")
    assert tuple(BUILTINS) == BUILTIN_MODELS  # the light list matches the workloads


@pytest.mark.parametrize("spec, expected", [
    ("my model (built in a notebook)", "neither a built-in nor a pkg.module:factory"),
    ("nowhere_package.models:factory", "whose module nowhere_package.models is not importable"),
])
def test_a_spec_that_cannot_be_built_here_suggests_no_verify_not_model(spec, expected):
    """``--model SPEC`` is suggested only for a spec that could be built here; otherwise
    the line says why not, and what to do without the model."""
    from bytecomp.errors import BytecompError

    with pytest.raises(BytecompError) as raised:
        allowed_model(spec, None, "profiles/x", "plan with --no-verify")
    message = str(raised.value)
    assert expected in message and "plan with --no-verify" in message
    if " " in spec:
        assert "--model" not in message
