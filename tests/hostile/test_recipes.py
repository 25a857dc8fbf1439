"""Class 4 of the hostile corpus: bad recipes refused at the door. ``bytecomp profile``
checks the model, optimizer and batches in the parent (bytecomp/profiler/door.py), so
each of these is one line within seconds and no rank is spawned, no profile written;
a frozen layer is left out of the profile and the plan instead.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from refusal import one_line_error

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")

REFUSED = {
    "all_frozen": "no parameter trains",
    "zero_size": "parameter empty has no elements",
    "complex_parameter": "parameter phase is complex64",
    "nan_batches": "a training batch holds NaN or infinite values",
    "inf_targets": "a training batch holds NaN or infinite values",
    "nan_loss": "the loss of a training batch is nan",
    "nan_learning_rate": "its optimizer's lr is nan",
    "nesterov_without_momentum": "cannot be built: ValueError: Nesterov momentum requires",
    "nan_validation": "validation batch 0 holds NaN or infinite values",
    "wrong_shape_validation": "validation batch 0 does not run through the model",
    "not_an_optimizer": "returned str, not a torch.optim.Optimizer",
}


@pytest.mark.parametrize("factory", sorted(REFUSED))
def test_a_bad_recipe_is_refused_before_any_rank(cli, monkeypatch, tmp_path, factory):
    monkeypatch.syspath_prepend(FIXTURES)
    out = tmp_path / "profile"
    done = cli("profile", "--model", f"factories:{factory}", "--nproc", "2", "--quick",
               "--out", out)
    one_line_error(done, REFUSED[factory])
    assert not out.exists()


def test_a_clipped_optimizer_spec_passes_the_door(monkeypatch):
    """clip=... wraps the optimizer (ClippedOptimizer): a recipe, not an error."""
    from bytecomp.profiler.door import check_recipe
    from bytecomp.training.workloads import load_workload

    monkeypatch.syspath_prepend(FIXTURES)
    check_recipe(load_workload("factories:frozen_layer", optimizer="sgd:lr=0.1,clip=1"), 8)


def test_an_optimizer_option_is_checked_the_same_way(cli, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(FIXTURES)
    done = cli("profile", "--model", "factories:frozen_layer", "--optimizer",
               "sgd:lr=0.1,nesterov=true", "--out", tmp_path / "p")
    assert done.returncode == 2 and "Nesterov momentum requires" in done.stderr


@pytest.mark.multirank
def test_a_frozen_layer_is_left_out_of_the_profile_and_the_plan(cli, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(FIXTURES)
    out = tmp_path / "profile"
    done = cli("profile", "--model", "factories:frozen_layer", "--nproc", "2", "--quick",
               "--out", out, "--compressor", "fp16", "--probe-steps", "0")
    assert done.returncode == 0, done.stderr
    meta = yaml.safe_load((out / "profile.yaml").read_text())
    assert meta["model"]["tensors"] == 2 and meta["model"]["parameters"] == 16 * 3 + 3
    done = cli("plan", out, "--out", tmp_path / "plan.yaml", "--no-verify")
    assert done.returncode == 0, done.stderr
    assert math.isfinite(yaml.safe_load((tmp_path / "plan.yaml").read_text())
                         ["predicted_ms"]["plan"])


@pytest.mark.multirank
@pytest.mark.parametrize("factory,message,options", [
    ("nan_on_the_ranks", "every compressor's measured gain is 0", []),
    ("diverges", "fp32 DDP's validation loss is not finite", ["--fidelity-iterations", "0"]),
])
def test_a_run_that_measures_nothing_says_so_and_fails(cli, monkeypatch, tmp_path, factory,
                                                        message, options):
    monkeypatch.syspath_prepend(FIXTURES)
    out = tmp_path / "profile"
    done = cli("profile", "--model", f"factories:{factory}", "--nproc", "2", "--quick",
               "--out", out, "--compressor", "fp16", "--compressor", "topk:ratio=0.1",
               *options)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
