"""``comm_hook``: a plan as the ``(state, hook)`` pair that
``DistributedDataParallel.register_comm_hook`` takes, for code that registers the hook
itself (Lightning's ``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)``) or that
never hands bytecomp the DDP object.

The state starts at the first bucket: it finds the model (the one given, else the DDP
object that holds the bucket's parameters), makes :func:`~bytecomp.apply_plan`'s checks
on every rank, and builds what runs the plan (bytecomp's executor or PyTorch's own hook,
as ``apply_plan`` would); from then on it hands each bucket to it.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Literal

import torch
from torch.nn.parallel import DistributedDataParallel

from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan
from bytecomp.runtime.apply import (
    PYTHON_REDUCER,
    check_settings,
    check_unhooked,
    claim,
    load,
    plan_label,
    prepare,
)
from bytecomp.runtime.executor import Executor
from bytecomp.runtime.native import NativeRun
from bytecomp.runtime.peers import is_transport_error
from bytecomp.runtime.state import Stats


def comm_hook(plan: Plan | str | Path, model=None, fallback: str | None = None,
              host_workers: int | None = None, native: bool = True) -> tuple[PlanHook, object]:
    """``(state, hook)`` running ``plan`` once registered on a DDP model, by
    ``ddp.register_comm_hook(state, hook)`` or by a framework::

        state, hook = bytecomp.comm_hook("plan.yaml")
        strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hook,
                               bucket_cap_mb=state.plan.bucket_cap_mb)

    ``model``: the module whose parameters DDP trains (the LightningModule, the bare
    model, or the DDP object); without it, the first bucket finds the DDP object that
    holds its parameters. The checks of :func:`~bytecomp.apply_plan` (model, world
    size, the same plan on every rank) run at the first bucket, on every rank; a
    mismatch fails the first backward pass, and ``with state:`` turns that into the
    :class:`~bytecomp.errors.BytecompError`. ``fallback``, ``host_workers`` and
    ``native``: as for ``apply_plan``. The plan file is read now.

    """
    check_settings("comm_hook", fallback, host_workers, native)
    if model is not None:
        if not isinstance(model, torch.nn.Module):
            raise BytecompError(f"bytecomp.comm_hook: model must be the module DDP trains (the "
                                f"LightningModule, the bare model or the DDP object) or None, "
                                f"got {type(model).__name__} {model!r}"[:300])
        ddp = model if isinstance(model, DistributedDataParallel) else \
            getattr(model, "_orig_mod", None)  # torch.compile(ddp)
        if isinstance(ddp, DistributedDataParallel):
            check_unhooked(ddp, "comm_hook")
    plan = load(plan)
    state = PlanHook(plan, model, fallback, host_workers, native)
    return state, plan_hook


def plan_hook(state: PlanHook, bucket):  # no annotations: DDP rejects postponed ones
    """The hook of :func:`comm_hook`: the bucket through the plan's runner, built at the
    first bucket."""
    if isinstance(bucket, tuple):  # (grad, param): DDP's python reducer
        raise BytecompError(PYTHON_REDUCER)
    runner = state.runner if state.runner is not None else state.start(bucket)
    return runner.hook(runner, bucket)  # type: ignore[arg-type]  # its own class's hook


def ddp_holding(parameter) -> DistributedDataParallel | None:
    """The DDP object whose module holds ``parameter``, found once, at the first bucket,
    among the objects the garbage collector tracks (a bucket names its parameters, not its
    DDP, and DDP keeps no registry of its objects). By their type alone: ``isinstance``
    would ask each object for its ``__class__``, which a dead weak proxy (torch.compile
    leaves some) answers with ReferenceError and a deprecated torch alias with a
    FutureWarning."""
    for candidate in gc.get_objects():
        if issubclass(type(candidate), DistributedDataParallel) and \
                any(p is parameter for p in candidate.module.parameters()):
            return candidate
    return None


class PlanHook:
    """The hook state of :func:`comm_hook`. Before the first bucket it holds the plan and
    any state loaded for it; after, it answers as what runs the plan
    (:class:`~bytecomp.runtime.Executor` or :class:`~bytecomp.runtime.NativeRun`):
    ``stats``, ``step``, ``state_dict()``, ``close()``... Use it as a context manager
    to close it after training and to get a failed check or a peer's failure as one
    :class:`~bytecomp.errors.BytecompError`."""

    def __init__(self, plan: Plan, model, fallback: str | None, host_workers: int | None,
                 native: bool) -> None:
        self.plan = plan
        self.runner: Executor | NativeRun | None = None
        self._model = model
        self._settings = (fallback, host_workers, native)
        self._loaded: dict | None = None
        self._failed: BytecompError | None = None
        self._idle_stats = Stats()

    def start(self, bucket) -> Executor | NativeRun:
        """Check the plan against the model at the first bucket and build its runner."""
        try:
            module, ddp = self._module(bucket)
            fallback, host_workers, native = self._settings
            runner = prepare(module, self.plan, fallback, host_workers, native, False, ddp,
                              caller="comm_hook")
            if self._loaded is not None:
                runner.load_state_dict(self._loaded)
        except BytecompError as error:
            self._failed = error
            raise
        self._model = None  # no reference to the model: DDP's reducer holds this state
        self.runner = runner
        if ddp is not None:  # any later registration on it is refused, naming this one
            claim(ddp, f"bytecomp.comm_hook({plan_label(self.plan)})")
        return runner

    def _module(self, bucket):
        """The module DDP trains (names and all), and the DDP object where known."""
        first = bucket.parameters()[0]
        model = self._model
        ddp = None
        if model is None:
            ddp = ddp_holding(first)
            if ddp is None:
                raise BytecompError("bytecomp.comm_hook: no DistributedDataParallel object "
                                    "holds the bucket's parameters; pass the model: "
                                    "comm_hook(plan, model)")
        elif isinstance(model, DistributedDataParallel):
            ddp = model
        elif isinstance(getattr(model, "_orig_mod", None), DistributedDataParallel):
            ddp = model._orig_mod  # torch.compile(ddp)
        if ddp is not None:
            model = ddp.module
        if not any(p is first for p in model.parameters()):
            raise BytecompError(f"bytecomp.comm_hook: the model given ({type(model).__name__}) "
                                f"is not the one DDP trains (its parameters differ)")
        return model, ddp

    # -- what the runner answers once started ---------------------------------------------------
    @property
    def stats(self) -> Stats:
        """The runner's statistics (empty before the first step)."""
        return self.runner.stats if self.runner is not None else self._idle_stats

    @property
    def step(self) -> int:
        return self.runner.step if self.runner is not None else 0

    def state_dict(self) -> dict:
        """The runner's :meth:`~bytecomp.runtime.Executor.state_dict` (collective); before
        the first step, the state loaded for it."""
        if self.runner is not None:
            return self.runner.state_dict()
        if self._loaded is not None:
            return self._loaded
        raise BytecompError("bytecomp.comm_hook: no step has run, so there is no state to "
                            "save yet")

    def load_state_dict(self, state: dict) -> None:
        """Restore a saved state: now if the plan runs, else at the first bucket."""
        if self.runner is not None:
            self.runner.load_state_dict(state)
        else:
            self._loaded = state

    def __getattr__(self, name: str):
        # the runner's other figures (level, switches, controller, report_step_ms, ...)
        runner = self.__dict__.get("runner")
        if runner is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} before "
                                 f"the first step")
        return getattr(runner, name)

    def close(self) -> None:
        """Close the runner (see :meth:`~bytecomp.runtime.Executor.close`)."""
        if self.runner is not None:
            self.runner.close()

    def __enter__(self) -> PlanHook:
        return self

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        if self.runner is not None:
            return self.runner.__exit__(kind, error, traceback)
        if self._failed is not None and isinstance(error, RuntimeError) and \
                not isinstance(error, BytecompError) and not is_transport_error(error):
            raise self._failed from None  # DDP's words around a failed check: the check
        return False
