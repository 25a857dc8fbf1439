"""``bytecomp.comm_hook``: a plan (:func:`bytecomp.runtime.hook.comm_hook`) or, with
``autotune=...``, the tuner, as the ``(state, hook)`` pair a framework registers itself
(Lightning's ``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)``).

The state starts at the first bucket, on every rank: it finds the DDP object (the model
given, else the one holding the bucket's parameters), builds the
:class:`~bytecomp.autotuner.tuner.AutoTuner` (its forward passes timed from the next
step on) and from then on hands each bucket to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from bytecomp.autotuner.tuner import AutoTuner
from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan
from bytecomp.runtime.state import Stats


def comm_hook(plan: Plan | str | Path | None = None, model=None, fallback: str | None = None,
              host_workers: int | None = None, native: bool = True,
              autotune: bool | dict | None = None) -> tuple[object, object]:
    """``(state, hook)`` for ``ddp.register_comm_hook(state, hook)`` or a framework's
    strategy: ``plan`` run as :func:`bytecomp.runtime.hook.comm_hook` runs it (its
    arguments: ``model``, ``fallback``, ``host_workers``, ``native``), or, with
    ``autotune`` (True, or a dict of :func:`bytecomp.autotune`'s settings, checked now)
    and no plan, the tuner: it measures, plans and chooses from the first bucket on, and
    then answers as the tuner (``phase``, ``log``, ``stats``, ``state_dict()``)::

        state, hook = bytecomp.comm_hook(autotune={"plan_out": "plan.yaml"})
        strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hook)
    """
    from bytecomp.runtime.hook import comm_hook as plan_comm_hook

    if autotune is None:
        if plan is None:
            raise BytecompError("bytecomp.comm_hook: give a plan (a Plan or a plan file), or "
                                "autotune=True to plan inside the job")
        return plan_comm_hook(plan, model, fallback, host_workers, native)
    return _autotune_hook(plan, model, fallback, native, host_workers, autotune)




class TunerHook:
    """The hook state of ``comm_hook(autotune=...)``. Before the first bucket it holds the
    settings and any state loaded for the tuner; after, it answers as the tuner does
    (``phase``, ``log``, ``stats``, ``state_dict()``, ``close()``...)."""

    def __init__(self, settings: dict, model) -> None:
        self.settings = settings
        self.tuner: AutoTuner | None = None
        self._model = model
        self._loaded: dict | None = None
        self._idle_stats = Stats()

    def start(self, bucket) -> AutoTuner:
        from torch.nn.parallel import DistributedDataParallel

        from bytecomp.autotuner import build_tuner
        from bytecomp.runtime.apply import claim
        from bytecomp.runtime.hook import ddp_holding

        ddp = self._model
        if not isinstance(ddp, DistributedDataParallel):
            ddp = getattr(ddp, "_orig_mod", None)  # torch.compile(ddp)
        if not isinstance(ddp, DistributedDataParallel):  # none, or the module DDP wraps
            ddp = ddp_holding(bucket.parameters()[0])
        if ddp is None:
            raise BytecompError("bytecomp.comm_hook(autotune=...): no "
                                "DistributedDataParallel object holds the bucket's "
                                "parameters; pass the model: comm_hook(model=ddp, "
                                "autotune=...)")
        tuner = build_tuner(ddp, self.settings)
        if self._loaded is not None:
            tuner.load_state_dict(self._loaded)
        self._model = None  # no reference to the model: DDP's reducer holds this state
        self.tuner = tuner
        claim(ddp, "bytecomp.comm_hook(autotune=...)")
        return tuner

    @property
    def stats(self) -> Stats:
        return self.tuner.stats if self.tuner is not None else self._idle_stats

    @property
    def phase(self) -> str:
        return self.tuner.phase if self.tuner is not None else "measure"

    def state_dict(self) -> dict:
        """The tuner's :meth:`~bytecomp.autotuner.tuner.AutoTuner.state_dict` (collective);
        before the first step, the state loaded for it."""
        if self.tuner is not None:
            return self.tuner.state_dict()
        if self._loaded is not None:
            return self._loaded
        raise BytecompError("bytecomp.comm_hook(autotune=...): no step has run, so there is "
                            "no state to save yet")

    def load_state_dict(self, state: dict) -> None:
        """Restore a saved state: now if the tuner runs, else at the first bucket."""
        if self.tuner is not None:
            self.tuner.load_state_dict(state)
        else:
            self._loaded = state

    def __getattr__(self, name: str):
        tuner = self.__dict__.get("tuner")
        if tuner is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} before "
                                 f"the first step")
        return getattr(tuner, name)

    def close(self) -> None:
        if self.tuner is not None:
            self.tuner.close()

    def __enter__(self) -> TunerHook:
        return self

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        if self.tuner is not None:
            return self.tuner.__exit__(kind, error, traceback)
        return False


def tuner_hook(state: TunerHook, bucket):  # no annotations: DDP rejects postponed ones
    """The hook of ``comm_hook(autotune=...)``: the bucket through the tuner, built at the
    first bucket."""
    tuner = state.tuner if state.tuner is not None else state.start(bucket)
    return AutoTuner.hook(tuner, bucket)


def _autotune_hook(plan, model, fallback, native, host_workers, autotune):
    from bytecomp.autotuner import checked_settings

    if plan is not None or fallback is not None or native is not True:
        raise BytecompError("bytecomp.comm_hook: autotune= plans inside the job: give no "
                            "plan, fallback or native with it")
    if autotune is False:
        raise BytecompError("bytecomp.comm_hook: autotune must be True or a dict of "
                            "bytecomp.autotune's settings, got False (leave it out)")
    if autotune is not True and not isinstance(autotune, dict):
        raise BytecompError(f"bytecomp.comm_hook: autotune must be True or a dict of "
                            f"bytecomp.autotune's settings, got "
                            f"{type(autotune).__name__}"[:300])
    given = {} if autotune is True else dict(autotune)
    if host_workers is not None:
        given.setdefault("host_workers", host_workers)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise BytecompError(f"bytecomp.comm_hook: model must be the module DDP trains or "
                            f"None, got {type(model).__name__}"[:300])
    return TunerHook(checked_settings(**given), model), tuner_hook
