"""Recipes checked at the door: what ``bytecomp profile`` checks in the parent, before
any rank is spawned, so a recipe that cannot give a useful profile is one line in
seconds, not a rank's error minutes in, nor a profile that every ``plan`` then refuses.

* Parameters: at least one trains; none of those is empty; each is float32, float16
  or bfloat16 (what the compressors encode). Frozen parameters (``requires_grad``
  off) are not exchanged by DDP, so they are left out of the profile and the plan.
* Optimizer: built once here on the model, as every rank will; every number in its
  parameter groups finite, the learning rate positive.
* One training batch and one training step: the batch's tensors finite, the loss a
  finite number, the gradients finite.
* Validation (or held-out) batches: finite, and the first runs through the model and
  the loss to a finite loss.

The step runs on a copy of the model (the ranks build their own), on the CPU.
"""

from __future__ import annotations

import copy
import math
import numbers

import torch

from bytecomp.errors import BytecompError
from bytecomp.training.workloads import to_device

PLANNED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_recipe(workload, batch_size: int) -> None:
    """Refuse ``workload`` in one line where it cannot give a useful profile (see the
    module docstring)."""
    name = workload.name
    _check_parameters(workload.model, name)
    model = copy.deepcopy(workload.model)
    _check_optimizer(workload, model, name)
    _check_step(workload, model, batch_size, name)
    _check_evidence(workload, model, batch_size, name)


def _check_parameters(model: torch.nn.Module, name: str) -> None:
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trained:
        raise BytecompError(f"model {name}: no parameter trains (every one has "
                            f"requires_grad=False): there is no gradient to exchange")
    for parameter_name, parameter in trained:
        if parameter.numel() == 0:
            raise BytecompError(f"model {name}: parameter {parameter_name} has no elements "
                                f"(shape {tuple(parameter.shape)}); remove it or freeze it")
        if parameter.dtype not in PLANNED_DTYPES:
            raise BytecompError(f"model {name}: parameter {parameter_name} is "
                                f"{str(parameter.dtype).removeprefix('torch.')}; bytecomp "
                                f"plans float32, float16 and bfloat16 gradients (freeze it, "
                                f"or keep it in one of those)")


def _numbers(value, key: str):
    """Every number in a parameter group's value, with where it is."""
    if isinstance(value, bool):
        return
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        yield key, float(value)
    elif isinstance(value, numbers.Real):
        yield key, float(value)
    elif isinstance(value, (tuple, list)) and len(value) <= 8:
        for index, item in enumerate(value):
            yield from _numbers(item, f"{key}[{index}]")


def _check_optimizer(workload, model: torch.nn.Module, name: str) -> None:
    trained = [p for p in model.parameters() if p.requires_grad]
    try:
        optimizer = workload.make_optimizer(trained)
    except BytecompError:
        raise
    except Exception as error:  # torch's own refusal: nesterov without momentum, ...
        raise BytecompError(f"model {name}: its optimizer ({workload.optimizer_spec}) cannot "
                            f"be built: {type(error).__name__}: "
                            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}"
                            ) from None
    # a torch optimizer, or one that wraps one as bytecomp's clip=... does (ClippedOptimizer)
    if not (callable(getattr(optimizer, "step", None)) and
            callable(getattr(optimizer, "zero_grad", None)) and
            isinstance(getattr(optimizer, "param_groups", None), list)):
        raise BytecompError(f"model {name}: its optimizer function returned "
                            f"{type(optimizer).__name__}, not a torch.optim.Optimizer")
    for index, group in enumerate(optimizer.param_groups):
        for key, value in group.items():
            if key == "params":
                continue
            for where, number in _numbers(value, key):
                if not math.isfinite(number):
                    raise BytecompError(f"model {name}: its optimizer's {where} is {number} "
                                        f"(parameter group {index}): not a finite number")
        lr = group.get("lr")
        if lr is not None and not isinstance(lr, bool) and float(lr) <= 0:
            raise BytecompError(f"model {name}: its optimizer's learning rate is {float(lr):g} "
                                f"(parameter group {index}); it must be positive")
    try:  # the schedule too: built here, it fails before any rank starts
        workload.make_scheduler(optimizer)
    except BytecompError:
        raise
    except Exception as error:  # noqa: BLE001  # a user's function: one line
        raise BytecompError(f"model {name}: its scheduler ({workload.scheduler_spec}) cannot "
                            f"be built: {type(error).__name__}: "
                            f"{' '.join(str(error).split())[:200]}") from None


def _tensors(batch):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)


def _check_batch(batch, what: str, name: str) -> tuple:
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        raise BytecompError(f"model {name}: {what} must be (inputs, targets), got "
                            f"{type(batch).__name__}")
    for tensor in _tensors(batch):
        if (tensor.is_floating_point() or tensor.is_complex()) and \
                not bool(torch.isfinite(tensor).all()):
            raise BytecompError(f"model {name}: {what} holds NaN or infinite values")
    return tuple(batch)


def _loss(workload, model, batch, what: str, name: str) -> torch.Tensor:
    inputs, target = to_device(batch, torch.device("cpu"))
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    try:
        loss = workload.loss(model(*inputs), target)
    except Exception as error:
        text = str(error).strip().splitlines()
        raise BytecompError(f"model {name}: {what} does not run through the model and its "
                            f"loss: {type(error).__name__}: {text[0] if text else ''}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise BytecompError(f"model {name}: the loss of {what} is not one number")
    if not math.isfinite(float(loss.detach())):
        raise BytecompError(f"model {name}: the loss of {what} is {float(loss.detach())}: "
                            f"training on it cannot measure anything")
    return loss


def _check_step(workload, model: torch.nn.Module, batch_size: int, name: str) -> None:
    state = torch.get_rng_state()
    try:
        torch.manual_seed(0)
        batch = _check_batch(workload.make_batch(batch_size), "a training batch", name)
    except BytecompError:
        raise
    except Exception as error:
        raise BytecompError(f"model {name}: make_batch({batch_size}) failed: "
                            f"{type(error).__name__}: {error}") from None
    finally:
        torch.set_rng_state(state)
    model.train()
    loss = _loss(workload, model, batch, "a training batch", name)
    loss.backward()
    for parameter_name, parameter in model.named_parameters():
        if parameter.grad is not None and not bool(torch.isfinite(parameter.grad).all()):
            raise BytecompError(f"model {name}: the gradient of {parameter_name} holds NaN or "
                                f"infinite values after one step")


@torch.no_grad()
def _check_evidence(workload, model: torch.nn.Module, batch_size: int, name: str) -> None:
    try:
        batches, what = workload.evidence_batches(batch_size)
    except BytecompError:
        raise
    except Exception as error:
        raise BytecompError(f"model {name}: its validation batches failed: "
                            f"{type(error).__name__}: {error}") from None
    checked = [_check_batch(batch, f"{what} batch {index}", name)
               for index, batch in enumerate(batches)]
    model.eval()  # the first through the model: a batch of the wrong shape fails there
    _loss(workload, model, checked[0], f"{what} batch 0", name)
