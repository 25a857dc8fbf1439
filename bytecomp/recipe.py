"""A training recipe (:class:`Recipe`: how a model trains, as a workload factory
declares it) and its optimizer as a spec: ``sgd:lr=0.05,momentum=0.9``.

This module imports torch alone, so that a factory's module, which a training
script may import too, stays light.

A workload trains with its recipe's optimizer everywhere bytecomp trains it
(iteration timing, the gradient-fidelity steps, the convergence probe, the
finalists): steps to a loss depend on it, so planning with another optimizer
plans for another job. A factory can build any optimizer itself (a function of the
parameters); ``bytecomp profile --optimizer SPEC`` names one of these:

* ``sgd``: ``lr`` (default 0.01), ``momentum`` (0), ``weight_decay`` (0),
  ``nesterov`` (false);
* ``adam`` and ``adamw``: ``lr`` (0.001), ``beta1`` (0.9), ``beta2`` (0.999),
  ``weight_decay`` (0; 0.01 for adamw), ``eps`` (1e-8);

each with ``clip`` (default none): the gradients' total norm is clipped to it before
every step (``torch.nn.utils.clip_grad_norm_``). Every value is range-checked; a
bad spec is one line naming the choices.

A recipe may also schedule the learning rate (``Recipe(scheduler=...)``): a function of
the optimizer returning a ``torch.optim.lr_scheduler`` scheduler, or a spec
(``bytecomp profile --scheduler SPEC``), stepped once after every optimizer step
wherever bytecomp trains the recipe over many steps (the convergence probe, the
finalists, ``bench --train-steps``):

* ``cosine``: ``steps`` (default 1000) of cosine decay to ``min_lr`` (0);
* ``step``: the rate times ``gamma`` (0.1) every ``every`` steps (100);
* ``warmup``: a linear warm-up from ``start`` (0.1) x the rate to the rate over
  ``steps`` (100), then constant;

``cosine`` and ``step`` also take ``warmup`` (0: none), steps of that linear warm-up
first, and ``start``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from bytecomp.errors import BytecompError
from bytecomp.specs import parse_spec

# name -> {parameter: (default, low, high, low_open)}; values are floats unless bool
_POSITIVE = (0.0, math.inf, True)
_FRACTION = (0.0, 1.0, False)
_ADAM = {"lr": (1e-3, *_POSITIVE), "beta1": (0.9, 0.0, 1.0, False),
         "beta2": (0.999, 0.0, 1.0, False), "weight_decay": (0.0, 0.0, math.inf, False),
         "eps": (1e-8, *_POSITIVE)}
OPTIMIZERS: dict[str, dict[str, tuple]] = {
    "sgd": {"lr": (0.01, *_POSITIVE), "momentum": (0.0, *_FRACTION),
            "weight_decay": (0.0, 0.0, math.inf, False), "nesterov": (False,)},
    "adam": _ADAM,
    "adamw": {**_ADAM, "weight_decay": (0.01, 0.0, math.inf, False)},
}
MAX_VALUE = 1e6  # no learning rate, decay or clip norm beyond this is a recipe
DEFAULT_OPTIMIZER = "adam:lr=0.001"  # a recipe's when it names none
Builder = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerBuilder = Callable[[torch.optim.Optimizer], object]
# name -> {parameter: (default, low, high)}: whole numbers where the default is an int
_WARMUP = {"warmup": (0, 0, 10**7), "start": (0.1, 1e-6, 1.0)}
SCHEDULERS: dict[str, dict[str, tuple]] = {
    "cosine": {"steps": (1000, 1, 10**7), "min_lr": (0.0, 0.0, MAX_VALUE), **_WARMUP},
    "step": {"every": (100, 1, 10**7), "gamma": (0.1, 1e-6, 1.0), **_WARMUP},
    "warmup": {"steps": (100, 1, 10**7), "start": (0.1, 1e-6, 1.0)},
}


@dataclass
class Recipe:
    """How a model trains, as a workload factory declares it.

    * ``model``, ``make_batch(batch_size) -> (inputs, targets)``;
    * ``loss(output, target)`` (default: cross-entropy for integer targets, else mean
      squared error);
    * ``optimizer``: a spec (``"sgd:lr=0.05,momentum=0.9,clip=1"``,
      below) or a function of the parameters returning a
      ``torch.optim.Optimizer`` (default ``adam:lr=0.001``);
    * ``validation``: fixed validation batches, a list or a function of the batch size
      (default: held-out batches of ``make_batch``);
    * ``batch_size`` per rank (default 32);
    * ``scheduler``: a spec (``"cosine:steps=1000,warmup=50"``; ``cosine``, ``step`` or
      ``warmup``, as ``bytecomp profile --scheduler`` takes them) or a function of the
      optimizer returning a ``torch.optim.lr_scheduler`` scheduler, stepped after every
      optimizer step (default: none, a constant rate)."""

    model: nn.Module
    make_batch: Callable[[int], tuple]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    optimizer: str | Builder | None = None
    validation: list | Callable[[int], list] | None = None
    batch_size: int | None = None
    scheduler: str | SchedulerBuilder | None = None


class ClippedOptimizer:
    """An optimizer whose ``step`` first clips the gradients' total norm to ``max_norm``
    (every other attribute is the wrapped optimizer's)."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        self.optimizer = optimizer
        self.max_norm = max_norm

    def step(self, closure=None):
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]
                      if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(parameters, self.max_norm)
        return self.optimizer.step(closure)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


@dataclass(frozen=True)
class OptimizerSpec:
    """A parsed optimizer spec (see the module docstring)."""

    name: str
    values: tuple[tuple[str, float | bool], ...]
    clip: float | None = None

    @property
    def spec(self) -> str:
        """Canonical: every value the spec set, in the table's order."""
        parts = [f"{key}={_shown(value)}" for key, value in self.values]
        if self.clip is not None:
            parts.append(f"clip={_shown(self.clip)}")
        return self.name + (":" + ",".join(parts) if parts else "")

    def build(self, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        settings = {**{key: default[0] for key, default in OPTIMIZERS[self.name].items()},
                    **dict(self.values)}
        parameters = list(parameters)
        if self.name == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(
                parameters, lr=settings["lr"], momentum=settings["momentum"],
                weight_decay=settings["weight_decay"], nesterov=bool(settings["nesterov"]))
        else:
            kind = torch.optim.Adam if self.name == "adam" else torch.optim.AdamW
            optimizer = kind(parameters, lr=settings["lr"],
                             betas=(settings["beta1"], settings["beta2"]),
                             weight_decay=settings["weight_decay"], eps=settings["eps"])
        if self.clip is not None:
            return ClippedOptimizer(optimizer, self.clip)  # type: ignore[return-value]
        return optimizer


def _shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}"


def parse_optimizer(text: str) -> OptimizerSpec:
    """``sgd:lr=0.05,momentum=0.9`` -> an :class:`OptimizerSpec`, every value checked."""
    name, table, items = parse_spec(text, "optimizer", OPTIMIZERS)
    values: dict[str, float | bool] = {}
    clip = None
    for key, equals, raw in items:
        if key != "clip" and key not in table:
            raise BytecompError(f"optimizer {name}: unknown parameter {key!r}; valid: "
                                f"{', '.join([*table, 'clip'])}")
        if not equals or not raw:
            raise BytecompError(f"optimizer {name}: {key} needs a value ({key}=...)")
        if key in values or (key == "clip" and clip is not None):
            raise BytecompError(f"optimizer {name}: {key} given twice")
        if key != "clip" and isinstance(table[key][0], bool):
            if raw.lower() not in ("true", "false"):
                raise BytecompError(f"optimizer {name}: {key} must be true or false")
            values[key] = raw.lower() == "true"
            continue
        try:
            number = float(raw)
        except ValueError:
            raise BytecompError(f"optimizer {name}: {key}={raw!r} is not a number") from None
        low, high, low_open = (0.0, math.inf, True) if key == "clip" else table[key][1:]
        inside = (number > low if low_open else number >= low) and \
            (number < high if high == 1.0 else number <= min(high, MAX_VALUE))
        if not math.isfinite(number) or not inside:
            shown = f"{'(' if low_open else '['}{low:g}, {'1)' if high == 1.0 else f'{MAX_VALUE:g}]'}"
            raise BytecompError(f"optimizer {name}: {key}={raw} is out of range {shown}")
        if key == "clip":
            clip = number
        else:
            values[key] = number
    ordered = tuple((key, values[key]) for key in table if key in values)
    return OptimizerSpec(name, ordered, clip)


def optimizer_builder(spec: str) -> Builder:
    """The builder of a spec: ``parameters -> optimizer``."""
    return parse_optimizer(spec).build


@dataclass(frozen=True)
class SchedulerSpec:
    """A parsed learning-rate schedule spec (see the module docstring)."""

    name: str
    values: tuple[tuple[str, float], ...]

    @property
    def spec(self) -> str:
        """Canonical: every value the spec set, in the table's order."""
        parts = [f"{key}={_shown(value)}" for key, value in self.values]
        return self.name + (":" + ",".join(parts) if parts else "")

    def build(self, optimizer) -> object:
        """The scheduler over ``optimizer`` (a :class:`ClippedOptimizer`'s own optimizer:
        torch's schedulers take a ``torch.optim.Optimizer``)."""
        from torch.optim import lr_scheduler

        settings = {key: default[0] for key, default in SCHEDULERS[self.name].items()}
        settings.update(self.values)
        inner = optimizer.optimizer if isinstance(optimizer, ClippedOptimizer) else optimizer
        warmup, start = int(settings.get("warmup", 0)), settings["start"]
        if self.name == "warmup":
            return lr_scheduler.LinearLR(inner, start_factor=start, end_factor=1.0,
                                         total_iters=int(settings["steps"]))
        main = lr_scheduler.CosineAnnealingLR(inner, T_max=int(settings["steps"]),
                                              eta_min=settings["min_lr"]) \
            if self.name == "cosine" else \
            lr_scheduler.StepLR(inner, step_size=int(settings["every"]), gamma=settings["gamma"])
        if not warmup:
            return main
        first = lr_scheduler.LinearLR(inner, start_factor=start, end_factor=1.0,
                                      total_iters=warmup)
        return lr_scheduler.SequentialLR(inner, [first, main], milestones=[warmup])


def parse_scheduler(text: str) -> SchedulerSpec:
    """``cosine:steps=1000,warmup=50`` -> a :class:`SchedulerSpec`, every value checked."""
    name, table, items = parse_spec(text, "scheduler", SCHEDULERS)
    values: dict[str, float] = {}
    for key, equals, raw in items:
        if key not in table:
            import difflib

            close = difflib.get_close_matches(key, list(table), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BytecompError(f"scheduler {name}: unknown parameter {key!r}{hint}; valid: "
                                f"{', '.join(table)}")
        if not equals or not raw:
            raise BytecompError(f"scheduler {name}: {key} needs a value ({key}=...)")
        if key in values:
            raise BytecompError(f"scheduler {name}: {key} given twice")
        default, low, high = table[key]
        try:
            number = int(raw) if isinstance(default, int) else float(raw)
        except ValueError:
            kind = "a whole number" if isinstance(default, int) else "a number"
            raise BytecompError(f"scheduler {name}: {key}={raw!r} is not {kind}") from None
        if not (math.isfinite(number) and low <= number <= high):
            raise BytecompError(f"scheduler {name}: {key}={raw} is out of range "
                                f"[{low:g}, {high:g}]")
        values[key] = number
    return SchedulerSpec(name, tuple((key, values[key]) for key in table if key in values))
