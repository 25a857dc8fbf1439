"""The hostile corpus from Python: checkpoints of examples/train.py mutated field by
field (each refused on ``--resume`` in one line), the library's entry points given what
they do not take, and ``--nproc`` bounded by the machine's cores."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.launch import MAX_RANKS_PER_CORE, check_nproc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from train import TrainConfig, check_config, load_checkpoint, resume  # noqa: E402

MODEL = "mlp:inputs=8,width=16,depth=1"


def _setup(steps: int = 20):
    from bytecomp.profile.workloads import load_workload

    config = TrainConfig(model=MODEL, steps=steps)
    model = load_workload(MODEL, seed=0).model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()  # momentum buffers: an optimizer state with tensors
    return config, model, optimizer


def _checkpoint(model, optimizer, step: int = 10, planned: bool = False) -> dict:
    return {"step": step, "model": copy.deepcopy(model.state_dict()),
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "bytecomp": {"format": 1} if planned else None}


def _first_weight(checkpoint: dict) -> str:
    return next(iter(checkpoint["model"]))


MUTATIONS = {
    "step-string": lambda c: c.update(step="10"),
    "step-bool": lambda c: c.update(step=True),
    "step-negative": lambda c: c.update(step=-5),
    "step-beyond-steps": lambda c: c.update(step=10 ** 9),
    "step-equal-to-steps": lambda c: c.update(step=20),
    "step-float": lambda c: c.update(step=10.0),
    "model-not-a-mapping": lambda c: c.update(model=[1, 2]),
    "model-a-string-tensor": lambda c: c["model"].update({_first_weight(c): "weights"}),
    "model-wrong-shape": lambda c: c["model"].update({_first_weight(c): torch.zeros(3, 3)}),
    "model-missing-tensor": lambda c: c["model"].pop(_first_weight(c)),
    "model-extra-tensor": lambda c: c["model"].update(extra=torch.zeros(1)),
    "model-nan": lambda c: c["model"][_first_weight(c)].fill_(math.nan),
    "model-inf": lambda c: c["model"][_first_weight(c)].fill_(-math.inf),
    "optimizer-empty": lambda c: c.update(optimizer={}),
    "optimizer-no-groups": lambda c: c.update(optimizer={"state": {}, "param_groups": []}),
    "optimizer-string": lambda c: c.update(optimizer="sgd"),
    "optimizer-other-size": lambda c: c["optimizer"]["param_groups"][0].update(params=[0]),
    "plan-state-without-plan": lambda c: c.update(bytecomp={"format": 1}),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_damaged_checkpoint_is_refused_on_resume_in_one_line(mutation):
    config, model, optimizer = _setup()
    checkpoint = _checkpoint(model, optimizer)
    resume(copy.deepcopy(checkpoint), "ckpt.pt", model, optimizer, config, False)  # as saved
    MUTATIONS[mutation](checkpoint)
    with pytest.raises(BytecompError) as caught:
        resume(checkpoint, "ckpt.pt", model, optimizer, config, False)
    assert str(caught.value).startswith("ckpt.pt") and "\n" not in str(caught.value)


def test_a_checkpoint_without_a_plan_is_refused_with_one():
    config, model, optimizer = _setup()
    with pytest.raises(BytecompError, match="saved without a plan; resume it without --plan"):
        resume(_checkpoint(model, optimizer), "ckpt.pt", model, optimizer, config, True)


@pytest.mark.parametrize("drop", ["step", "model", "optimizer", "bytecomp"])
def test_a_checkpoint_missing_a_key_is_not_a_checkpoint_of_the_example(tmp_path, drop):
    _, model, optimizer = _setup()
    checkpoint = _checkpoint(model, optimizer)
    del checkpoint[drop]
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    with pytest.raises(BytecompError, match="is not a checkpoint of examples/train.py"):
        load_checkpoint(str(tmp_path / "ckpt.pt"), torch.device("cpu"))


@pytest.mark.parametrize("field,value", [("steps", 0), ("batch_size", -1), ("lr", 0.0),
                                         ("lr", math.nan), ("momentum", 1.0),
                                         ("label_noise", 2.0), ("timeout", 0.0),
                                         ("checkpoint_every", -1)])
def test_the_examples_options_are_range_checked(field, value):
    with pytest.raises(BytecompError, match=f"--{field.replace('_', '-')} must be"):
        check_config(TrainConfig(**{field: value}))


@pytest.mark.parametrize("value", [5, None, 1.5, b"plan.yaml", ["plan.yaml"], ""])
def test_load_plan_names_what_it_takes(value):
    with pytest.raises(BytecompError, match="load_plan takes the path of a plan file"):
        bytecomp.load_plan(value)


@pytest.mark.parametrize("model", [nn.Linear(2, 2), None, "ddp"], ids=["module", "none", "str"])
def test_apply_plan_names_what_it_takes(model):
    with pytest.raises(BytecompError, match="apply_plan takes the model wrapped in torch.nn."
                                            "parallel.DistributedDataParallel"):
        bytecomp.apply_plan(model, "plan.yaml")


def test_nproc_is_bounded_by_the_cores_and_warned_above_one_per_core(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert check_nproc(None) == [] and check_nproc(1) == [] and check_nproc(2) == []
    assert "on 2 cores" in check_nproc(3)[0]
    assert check_nproc(2 * MAX_RANKS_PER_CORE) != []
    for bad in (0, -1, 2 * MAX_RANKS_PER_CORE + 1, 10 ** 6):
        with pytest.raises(BytecompError, match=f"--nproc must be from 1 to "
                                                f"{2 * MAX_RANKS_PER_CORE}"):
            check_nproc(bad)
