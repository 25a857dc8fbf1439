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

from ranks import run_ranks

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from train import TrainConfig, check_config, load_checkpoint, resume  # noqa: E402

MODEL = "mlp:inputs=8,width=16,depth=1"


def _setup(steps: int = 20):
    from bytecomp.training.workloads import load_workload

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


# -- library misuse: settings, and one registration per DDP model --------------------------

def _small_plan(world: int = 1, spec: str = "topk:ratio=0.5"):
    from bytecomp.plan_file import plan_for_model
    from bytecomp.plan_types import Option

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    option = Option(spec, "device", "allgather") if spec != "none" else Option()
    return model, plan_for_model(model, lambda n, p: option, world)


@pytest.mark.parametrize("settings,message", [
    ({"host_workers": -1}, r"host_workers must be None \(the plan's\) or an integer from 1 to"),
    ({"host_workers": 0}, "host_workers must be None"),
    ({"host_workers": 10 ** 6}, "host_workers must be None"),
    ({"host_workers": "2"}, "host_workers must be None .* got str '2'"),
    ({"host_workers": True}, "host_workers must be None"),
    ({"host_workers": 2.0}, "host_workers must be None"),
    ({"native": "no"}, "native must be True or False, got str 'no'"),
    ({"native": 0}, "native must be True or False"),
    ({"fallback": "fp16"}, "fallback must be None or 'fp32'"),
], ids=["workers-negative", "workers-zero", "workers-a-million", "workers-string",
        "workers-bool", "workers-float", "native-string", "native-int", "fallback-fp16"])
def test_apply_plan_and_comm_hook_check_their_settings_at_the_call(settings, message):
    model, plan = _small_plan()
    for call in (lambda: bytecomp.apply_plan(nn.Linear(2, 2), plan, **settings),
                 lambda: bytecomp.comm_hook(plan, **settings)):
        with pytest.raises(BytecompError, match=message) as caught:
            call()
        assert "\n" not in str(caught.value)
    with pytest.raises(BytecompError, match="measure_gain must be True or False"):
        bytecomp.apply_plan(nn.Linear(2, 2), plan, measure_gain="yes")


@pytest.mark.parametrize("model", [5, "model", [nn.Linear(2, 2)]], ids=["int", "str", "list"])
def test_comm_hook_refuses_a_model_that_is_no_module_at_the_call(model):
    _, plan = _small_plan()
    with pytest.raises(BytecompError, match="comm_hook: model must be the module DDP trains"):
        bytecomp.comm_hook(plan, model=model)


def _registrations(rank: int, world: int) -> dict:
    """Every way of registering a second hook on one DDP model, and what it said."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    found: dict[str, str] = {}

    def attempt(case: str, call) -> None:
        try:
            call()
            found[case] = "accepted"
        except BytecompError as error:
            found[case] = str(error)
        except Exception as error:  # noqa: BLE001  # what it must not be: torch's error
            found[case] = f"{type(error).__name__}: {error}"

    model, plan = _small_plan(world)
    ddp = DistributedDataParallel(model)
    bytecomp.apply_plan(ddp, plan).close()
    attempt("apply_plan twice", lambda: bytecomp.apply_plan(ddp, plan))
    attempt("apply_plan then register comm_hook",
            lambda: ddp.register_comm_hook(*bytecomp.comm_hook(plan)))
    attempt("apply_plan then comm_hook(plan, ddp)", lambda: bytecomp.comm_hook(plan, ddp))
    model, fp32 = _small_plan(world, "none")  # fp32: DDP's own allreduce, no hook registered
    ddp = DistributedDataParallel(model)
    bytecomp.apply_plan(ddp, fp32)
    attempt("an fp32 plan twice", lambda: bytecomp.apply_plan(ddp, fp32))
    attempt("an fp32 plan then fp16_compress_hook",
            lambda: ddp.register_comm_hook(None, default_hooks.fp16_compress_hook))
    model, plan = _small_plan(world)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    attempt("fp16_compress_hook then apply_plan", lambda: bytecomp.apply_plan(ddp, plan))
    model, plan = _small_plan(world)
    ddp = DistributedDataParallel(model)
    state, hook = bytecomp.comm_hook(plan)
    ddp.register_comm_hook(state, hook)
    attempt("comm_hook then apply_plan", lambda: bytecomp.apply_plan(ddp, plan))
    with state:
        ddp(torch.randn(4, 8)).sum().backward()
    attempt("comm_hook, a step, then register again",
            lambda: ddp.register_comm_hook(*bytecomp.comm_hook(plan)))
    state.close()
    return found


@pytest.mark.multirank
def test_a_second_registration_on_one_ddp_model_names_the_first():
    expected = {
        "apply_plan twice": "bytecomp.apply_plan(a Plan object)",
        "apply_plan then register comm_hook": "bytecomp.apply_plan(a Plan object)",
        "apply_plan then comm_hook(plan, ddp)": "bytecomp.apply_plan(a Plan object)",
        "an fp32 plan twice": "bytecomp.apply_plan(a Plan object)",
        "an fp32 plan then fp16_compress_hook": "bytecomp.apply_plan(a Plan object)",
        "fp16_compress_hook then apply_plan": "register_comm_hook(state, fp16_compress_hook)",
        "comm_hook then apply_plan": "bytecomp.comm_hook(a Plan object)",
        "comm_hook, a step, then register again": "bytecomp.comm_hook(a Plan object)",
    }
    for found in run_ranks(_registrations, 2):
        assert set(found) == set(expected)
        for case, first in expected.items():
            assert f"registered by {first}" in found[case] and "\n" not in found[case], \
                (case, found[case])


def _unplanned(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    found = {}
    model, plan = _small_plan(world)
    extra = nn.Sequential(*model, nn.Linear(2, 2))  # a parameter the plan does not know
    try:
        bytecomp.apply_plan(DistributedDataParallel(extra), plan)
    except BytecompError as error:
        found["extra"] = str(error)
    moved = nn.Sequential(model[0], model[1], nn.Identity(), model[2])  # and '2.*' are gone
    try:
        bytecomp.apply_plan(DistributedDataParallel(moved), plan)
    except BytecompError as error:
        found["moved"] = str(error)
    return found


@pytest.mark.multirank
def test_a_parameter_the_plan_does_not_know_names_the_fp32_fallback():
    for found in run_ranks(_unplanned, 2):
        assert "'3.weight' is not in the plan" in found["extra"]
        assert 'pass fallback="fp32"' in found["extra"]
        assert "'3.weight' is not in the plan" in found["moved"]
        assert 'a plan for another model? fallback="fp32"' in found["moved"]


def _heap_with_weak_proxies(rank: int, world: int) -> tuple[int, list[str]]:
    """comm_hook without a model, with a dead weak proxy and a deprecated torch alias in
    the heap (what torch.compile leaves), finds the DDP object quietly."""
    import gc
    import warnings
    import weakref

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    class Gone:
        pass

    thing = Gone()
    dead = [weakref.proxy(thing)]  # a list: the proxy is in gc.get_objects()'s reach
    del thing
    assert any(type(o) is weakref.ProxyType for o in gc.get_objects()) and dead
    assert dist.reduce_op is not None  # the deprecated alias (a FutureWarning on __class__)
    model, plan = _small_plan(world)
    ddp = DistributedDataParallel(model)
    state, hook = bytecomp.comm_hook(plan)
    ddp.register_comm_hook(state, hook)
    with warnings.catch_warnings(record=True) as caught, state:
        warnings.simplefilter("always")
        for _ in range(2):
            ddp(torch.randn(4, 8)).sum().backward()
    state.close()
    return state.step, [str(w.message) for w in caught]


@pytest.mark.multirank
def test_comm_hook_finds_its_ddp_with_dead_weak_proxies_in_the_heap_and_no_warning():
    for steps, warned in run_ranks(_heap_with_weak_proxies, 2):
        assert steps == 2 and warned == [], warned


def test_a_factory_raising_a_base_exception_is_one_line_and_ctrl_c_still_interrupts(monkeypatch):
    from bytecomp.training.workloads import load_workload

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fixtures"))
    with pytest.raises(BytecompError) as caught:
        load_workload("factories:raises_base_exception")
    assert str(caught.value) == ("model factory factories:raises_base_exception failed: Boom: "
                                 "a BaseException subclass over two lines")
    with pytest.raises(KeyboardInterrupt):
        load_workload("factories:interrupts")
