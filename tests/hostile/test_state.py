"""The hostile corpus of executor states: a real saved state (a static plan, and an
adaptive one, started at its compressed level, whose level 0 keeps no tensors), mutated at every tensor and
counter it holds (NaN, inf, a norm beyond float32's square root, the wrong shape, dtype
or type), must be refused by ``executor.load_state_dict`` in one line, the same on every
rank; the state as saved loads. Two gloo ranks."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.plan_file import ladder_for_model, plan_for_model
from bytecomp.plan_types import Adaptive, Option

from ranks import run_ranks

pytestmark = pytest.mark.multirank


def _static(name, param):
    return Option("topk:ratio=0.5", "device", "allgather") if name.endswith("weight") else \
        Option("signum", "device", "allgather")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))


def _plan(model, world: int, adaptive: bool):
    if not adaptive:
        return plan_for_model(model, _static, world, bucket_cap_mb=0.001)
    levels = [lambda n, p: Option("fp16", "device", "allreduce"),
              lambda n, p: Option("topk:ratio=0.25", "device", "allgather")]
    return ladder_for_model(model, levels, world, Adaptive("topk", window=2, timing="predicted",
                                                           start=1), bucket_cap_mb=0.001)


def _leaves(value, path=()):
    """(path, value) of every tensor and every salt or step counter in a saved state."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in ("salt", "step") and isinstance(item, int):
                yield (*path, key), item
            else:
                yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))


def _mutations(value) -> dict:
    if not isinstance(value, torch.Tensor):
        return {"string": "many", "negative": -3, "float": 1.5, "tensor": torch.ones(2)}
    found = {"string": "garbage", "list": [1.0, 2.0], "int64": value.long(),
             "shape": value.reshape(-1)[:-1] if value.numel() > 1 else value.new_zeros(3)}
    if value.is_floating_point():
        found.update(nan=value.clone().fill_(float("nan")), inf=value.clone().fill_(float("inf")),
                     float64=value.double(),  # finite, but no residual of a real run:
                     huge=value.clone().fill_(1e38),
                     beyond=value.clone().fill_(2e19 / max(1, value.numel()) ** 0.5))
    return found


def _set(state: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        state = state[key]
    state[path[-1]] = value


def damaged_states(rank: int, world: int, adaptive: bool):
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    executor = bytecomp.apply_plan(ddp, _plan(model, world, adaptive))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        generator = torch.Generator().manual_seed(100 * rank + step)
        ddp(torch.randn(4, 16, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    saved = executor.state_dict()
    executor.load_state_dict(copy.deepcopy(saved))  # as saved: loads
    outcomes = {}
    for path, value in _leaves(saved["ranks"]):
        for name, damage in _mutations(value).items():
            state = copy.deepcopy(saved)
            _set(state["ranks"], path, damage)
            try:
                executor.load_state_dict(state)
                outcomes[f"{path}:{name}"] = "loaded"
            except BytecompError as error:
                outcomes[f"{path}:{name}"] = str(error)
    extra = copy.deepcopy(saved)
    extra["ranks"][0]["no|such|group"] = {"salt": 1, "shapes": [[2]]}
    try:
        executor.load_state_dict(extra)
        outcomes["unknown group"] = "loaded"
    except BytecompError as error:
        outcomes["unknown group"] = str(error)
    executor.close()
    return outcomes


@pytest.mark.parametrize("adaptive", [False, True], ids=["static", "adaptive"])
def test_every_damaged_tensor_of_a_saved_state_is_refused_alike_on_every_rank(adaptive):
    first, second = run_ranks(damaged_states, 2, adaptive)
    assert first == second
    assert len(first) >= 12, sorted(first)  # residuals, momentum, salts and steps were found
    loaded = sorted(case for case, outcome in first.items() if outcome == "loaded")
    assert not loaded, loaded
    for case, outcome in first.items():
        assert outcome.startswith("this executor state is corrupted: ") and \
            "\n" not in outcome, (case, outcome)
