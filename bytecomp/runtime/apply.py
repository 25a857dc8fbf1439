"""``apply_plan``: check a plan against the model and the job on every rank, then run it
as one of PyTorch's own hooks (:mod:`bytecomp.runtime.native`) or through bytecomp's
executor (:mod:`bytecomp.runtime.executor`)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bytecomp.errors import BytecompError
from bytecomp.plan_file import MAX_HOST_WORKERS, load_plan
from bytecomp.plan_types import Plan
from bytecomp.runtime.checks import agree, check_bucket_cap, local_problem, match_parameters
from bytecomp.runtime.executor import Executor, device_of
from bytecomp.runtime.groups import build_groups
from bytecomp.runtime.native import NativeRun, bucket_hook, one_bucket, powersgd_rank


def apply_plan(ddp_model, plan: Plan | str | Path, fallback: str | None = None,
               host_workers: int | None = None, native: bool = True,
               measure_gain: bool = False) -> Executor | NativeRun:
    """Register a communication hook on ``ddp_model`` that executes ``plan``.

    Every rank must call it with the same plan, before the first backward pass.
    It checks, on every rank, that the plan matches the model (fingerprint) and
    the job (world size) and that all ranks hold the same plan (their digests
    agree); any mismatch raises the same :class:`~bytecomp.errors.BytecompError`
    on every rank. A parameter the plan does not name is an error unless
    ``fallback="fp32"``. Host-placed groups run on ``host_workers`` threads per rank
    (default: the plan's ``host_workers``, a node's cores shared by its ranks where the
    cluster config gave them, else 2).

    A static plan that allreduces every gradient in fp32 is what DDP does by itself,
    one that allreduces every gradient in fp16 is PyTorch's ``fp16_compress_hook``,
    and, where DDP keeps every gradient in one bucket (:func:`one_bucket`), a plan of
    PowerSGD rank r (error feedback and warm start on) on the matrices PyTorch's
    ``powerSGD_hook`` compresses at rank r and fp32 on the rest is that hook: with
    ``native=True`` no hook, or PyTorch's, is registered for it and a
    :class:`~bytecomp.runtime.native.NativeRun` is returned (it counts steps and bytes,
    and keeps the PowerSGD hook's state in its ``state_dict``); ``native=False`` runs it
    through bytecomp's :class:`Executor` like any other plan. An adaptive plan keeps
    the executor's hook, which hands the buckets of such a level to PyTorch's hook.
    With ``measure_gain=True`` the compressors with error feedback measure what they
    keep of each step's gradient (two norms per group), for
    :meth:`Executor.last_gain` (the convergence probe records it).

    >>> ddp = DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb)
    >>> executor = bytecomp.apply_plan(ddp, "plan.yaml")
    >>> ...train...
    >>> torch.save({"model": ddp.state_dict(), "bytecomp": executor.state_dict()}, path)
    """
    check_settings("apply_plan", fallback, host_workers, native, measure_gain)
    ddp = ddp_of(ddp_model)
    check_unhooked(ddp, "apply_plan")
    plan = load(plan)
    runner = prepare(ddp.module, plan, fallback, host_workers, native, measure_gain, ddp)
    runner.register(ddp)
    claim(ddp, f"bytecomp.apply_plan({plan_label(plan)})")
    return runner


def check_settings(caller: str, fallback, host_workers, native, measure_gain=False) -> None:
    """``apply_plan``'s (and ``comm_hook``'s) settings, by type and range, in one line."""
    if fallback not in (None, "fp32"):
        raise BytecompError(f"bytecomp.{caller}: fallback must be None or 'fp32', got "
                            f"{fallback!r}"[:300])
    if host_workers is not None and (isinstance(host_workers, bool) or
                                     not isinstance(host_workers, int) or
                                     not 1 <= host_workers <= MAX_HOST_WORKERS):
        raise BytecompError(f"bytecomp.{caller}: host_workers must be None (the plan's) or an "
                            f"integer from 1 to {MAX_HOST_WORKERS:,} (threads per rank), got "
                            f"{type(host_workers).__name__} {host_workers!r}"[:300])
    for name, value in (("native", native), ("measure_gain", measure_gain)):
        if not isinstance(value, bool):
            raise BytecompError(f"bytecomp.{caller}: {name} must be True or False, got "
                                f"{type(value).__name__} {value!r}"[:300])


# -- one registration per DDP model ---------------------------------------------------------
# DDP takes one communication hook per model (a second registration is torch's RuntimeError
# deep inside the reducer). What runs a plan marks the DDP object with what registered it and
# shadows its register_comm_hook, so a second plan, or another hook, is refused in one line
# naming the first registration.
REGISTERED = "_bytecomp_registered_by"


def plan_label(plan: Plan) -> str:
    return str(plan.path) if plan.path is not None else "a Plan object"


def registered_by(ddp) -> str | None:
    """What registered a communication hook on ``ddp`` (bytecomp's ``apply_plan`` or
    ``comm_hook``, or any other hook by its name), or None."""
    mark = ddp.__dict__.get(REGISTERED)
    if mark is not None:
        return mark
    hooks = getattr(ddp, "_comm_hooks", None) or []
    if hooks:
        hook, state = hooks[0]
        plan = getattr(state, "plan", None)
        if isinstance(plan, Plan) and getattr(hook, "__name__", "") == "plan_hook":
            return f"bytecomp.comm_hook({plan_label(plan)})"
        return f"register_comm_hook(state, {getattr(hook, '__qualname__', repr(hook))})"
    try:  # a built-in hook (register_builtin_comm_hook) is only in DDP's logging data
        name = ddp._get_ddp_logging_data().get("comm_hook")
    except (AttributeError, RuntimeError):
        name = None
    return f"a built-in hook ({name})" if name else None


def check_unhooked(ddp, caller: str) -> None:
    """One line where ``ddp`` already has a communication hook (DDP takes one)."""
    first = registered_by(ddp)
    if first is not None:
        raise BytecompError(f"bytecomp.{caller}: this DistributedDataParallel model already "
                            f"has a communication hook, registered by {first}; DDP takes one "
                            f"per model (to run another plan, wrap the module in a new "
                            f"DistributedDataParallel)")


def claim(ddp, what: str) -> None:
    """Mark ``ddp`` as running a plan registered by ``what``, and refuse any later
    registration on it in one line. (No reference to the runner: DDP's reducer holds it.)"""
    def refuse(*args, **kwargs):
        raise BytecompError(f"this DistributedDataParallel model already runs a plan, "
                            f"registered by {what}; DDP takes one communication hook per "
                            f"model (leave out one of the two registrations)")

    ddp.__dict__[REGISTERED] = what
    ddp.__dict__["register_comm_hook"] = refuse
    ddp.__dict__["_register_builtin_comm_hook"] = refuse


def load(plan: Plan | str | Path) -> Plan:
    return plan if isinstance(plan, Plan) else load_plan(plan)


def ddp_of(model) -> DistributedDataParallel:
    """The DDP object of ``model`` (itself, or what ``torch.compile`` compiled); anything
    else gets one line saying what bytecomp supports and why."""
    ddp = model
    if not isinstance(ddp, DistributedDataParallel):
        ddp = getattr(model, "_orig_mod", None)  # torch.compile(ddp) before apply_plan
    if not isinstance(ddp, DistributedDataParallel):
        raise BytecompError(not_ddp(model))
    if getattr(ddp, "_use_python_reducer", False):
        raise BytecompError(PYTHON_REDUCER)
    return ddp


# DDP built under torch._dynamo.config.optimize_ddp = "python_reducer" hands its hooks one
# (gradient, parameter) pair at a time inside the compiled backward, never a bucket.
PYTHON_REDUCER = ("bytecomp's plans run on DDP's buckets, but this DDP was built with "
                  "torch._dynamo.config.optimize_ddp='python_reducer' (compiled autograd), "
                  "which calls hooks per parameter: keep the default optimize_ddp with "
                  "torch.compile")


def not_ddp(model) -> str:
    """Why ``model`` cannot run a plan, in one line."""
    kind = type(model).__name__
    supported = ("apply_plan takes the model wrapped in torch.nn.parallel."
                 "DistributedDataParallel (bytecomp runs plans in DDP only: directly, through "
                 "Lightning's DDPStrategy or Accelerate)")
    if _is_fsdp(model):
        return (f"{supported}; got {kind}: FSDP reduce-scatters sharded gradients, to which "
                f"per-tensor compression plans do not apply")
    if isinstance(model, torch.nn.Module):
        return (f"{supported}; got {kind}, a module not wrapped in DDP: wrap it, "
                f"DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb), or use "
                f"bytecomp.comm_hook(plan) where a framework wraps it")
    return f"{supported}; got {kind}"


def _is_fsdp(model) -> bool:
    import torch.distributed.fsdp as fsdp

    # FSDPModule: what fully_shard (FSDP2, torch >= 2.6) makes a module
    kinds = tuple(getattr(fsdp, name) for name in ("FullyShardedDataParallel", "FSDPModule")
                  if hasattr(fsdp, name))
    return isinstance(model, kinds)


def prepare(model, plan: Plan, fallback: str | None, host_workers: int | None, native: bool,
             measure_gain: bool, ddp=None, caller: str = "apply_plan") -> Executor | NativeRun:
    """Check ``plan`` against ``model`` (the module DDP wraps) and the job on every rank,
    and build what runs it (not yet registered). ``caller``: the function the user
    called, which the errors name (``apply_plan``, ``comm_hook``)."""
    check_settings(caller, fallback, host_workers, native, measure_gain)
    if not dist.is_initialized():
        raise BytecompError("bytecomp needs torch.distributed initialized "
                            "(dist.init_process_group)")
    params, mismatch = match_parameters(plan, model)
    agree(plan, local_problem(plan, model, params, fallback, mismatch), caller)
    ladder = [build_groups(plan.level(i), params, fallback, f"L{i}:")
              for i in range(len(plan.levels))] if plan.levels else \
        [build_groups(plan, params, fallback)]
    if ddp is not None:
        check_bucket_cap(ddp, plan)
    if native and not measure_gain and plan.adaptive is None:
        hook = bucket_hook(ladder[0])
        rank = powersgd_rank(ladder[0], params) if hook is None and \
            one_bucket(params.values(), plan.bucket_cap_mb) else None
        if hook is not None or rank is not None:
            return NativeRun(plan, params, device_of(params), hook, rank)
    return Executor(plan, params, ladder, host_workers, measure_gain)
