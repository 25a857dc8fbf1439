"""Workloads to profile: built-in models and users' own factories.

A workload spec is one of:

* a built-in name with optional arguments, like compressor specs:
  ``mlp``, ``cnn``, ``transformer:layers=4,width=256,seq_len=128``, ``lstm``,
  ``digits``, ``bow`` (a bag-of-words classifier: a large embedding whose rows a
  batch mostly leaves untouched, beside dense layers), ``resnet18``, ``resnet50``, ``vgg16`` (the last three need torchvision:
  ``pip install 'bytecomp-ddp[vision]'``);
* ``pkg.module:factory``: ``factory()`` returns a :class:`Recipe` (the model, its
  batches and how it trains), or the shorter ``(model, make_batch)`` or
  ``(model, make_batch, loss_fn)``. ``make_batch(batch_size)`` returns
  ``(inputs, targets)`` on the CPU (``inputs`` a tensor or a tuple of tensors);
  bytecomp moves them to the rank's device. Without a loss, the loss is
  cross-entropy for integer targets (outputs flattened to ``(-1, classes)``)
  and mean squared error otherwise. Example::

      # mypkg/models.py
      import torch
      from bytecomp import Recipe

      def factory():
          model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                      torch.nn.Linear(64, 4))
          def make_batch(batch_size):
              return torch.randn(batch_size, 32), torch.randint(0, 4, (batch_size,))
          held_out = torch.Generator().manual_seed(1)
          validation = [(torch.randn(32, 32, generator=held_out),
                         torch.randint(0, 4, (32,), generator=held_out)) for _ in range(4)]
          return Recipe(model, make_batch, optimizer="sgd:lr=0.05,momentum=0.9",
                        validation=validation)

      $ bytecomp profile --model mypkg.models:factory --nproc 2

The recipe's optimizer and data are what bytecomp trains with wherever it trains
(timing, the gradient fidelity, the convergence probe, the finalists): steps to a
loss depend on them. Without validation batches, held-out batches of ``make_batch``
(drawn under seeds training never uses) stand in, and the profile says so.

The built-in models, their recipes and their sizes: :mod:`bytecomp.training.builtin_models`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import bytecomp.training.data as data
from bytecomp.errors import BytecompError
from bytecomp.recipe import (
    DEFAULT_OPTIMIZER,
    Builder,
    Recipe,
    SchedulerBuilder,
    optimizer_builder,
    parse_optimizer,
    parse_scheduler,
)
from bytecomp.specs import split_name
from bytecomp.training.builtin_models import BUILTINS, build_builtin, builtin_args
from bytecomp.training.data import (
    TeacherTask,
    TextWindows,
    TopicBags,
    corpus_digest,
    validation_batches,
)

# held-out batches of make_batch: seeds no training step draws (those are a few million at
# most; torch's CPU generator takes the seed's low 32 bits)
HELD_OUT_SEED = 2**31 - 1_000_000


@dataclass
class Workload:
    """A model, a batch maker, a loss and an optimizer: what training it needs."""

    name: str
    model: nn.Module
    make_batch: Callable[[int], tuple]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    batch_size: int = 32
    args: dict = field(default_factory=dict)
    source: str | None = None  # a factory's module file: an input no output may replace
    optimizer: str | Builder = DEFAULT_OPTIMIZER  # a spec, or the factory's own builder
    validation_fn: list | Callable[[int], list] | None = None  # the factory's own batches
    scheduler: str | SchedulerBuilder | None = None  # a spec, the factory's own, or none

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(output, target)
        return default_loss(output, target)

    def make_optimizer(self, parameters) -> torch.optim.Optimizer:
        """The recipe's optimizer over ``parameters``."""
        if isinstance(self.optimizer, str):
            return optimizer_builder(self.optimizer)(parameters)
        return self.optimizer(parameters)

    def make_scheduler(self, optimizer):
        """The recipe's learning-rate scheduler over ``optimizer`` (None: a constant
        rate), stepped after every optimizer step where bytecomp trains the recipe."""
        if self.scheduler is None:
            return None
        if isinstance(self.scheduler, str):
            return parse_scheduler(self.scheduler).build(optimizer)
        made = self.scheduler(optimizer)
        if not callable(getattr(made, "step", None)):
            raise BytecompError(f"model {self.name}: the recipe's scheduler must return a "
                                f"learning-rate scheduler (with step()), got "
                                f"{type(made).__name__}")
        return made

    @property
    def scheduler_spec(self) -> str | None:
        """The learning-rate schedule, as a profile records it (None: none)."""
        if self.scheduler is None or isinstance(self.scheduler, str):
            return self.scheduler
        return f"the factory's ({getattr(self.scheduler, '__qualname__', 'a function')})"

    @property
    def optimizer_spec(self) -> str:
        """The optimizer, as a profile records it."""
        if isinstance(self.optimizer, str):
            return self.optimizer
        return f"the factory's ({getattr(self.optimizer, '__qualname__', 'a function')})"

    def validation(self, batch_size: int, count: int = 8) -> list[tuple] | None:
        """Fixed validation batches (the same on every call): the factory's own, or a
        built-in workload's real held-out data; None where there are none (generated
        inputs: see :meth:`evidence_batches`)."""
        if self.validation_fn is not None:
            batches = self.validation_fn(batch_size) if callable(self.validation_fn) \
                else self.validation_fn
            return _checked_batches(batches, self.name)
        if isinstance(self.make_batch, TextWindows):
            return validation_batches(self.make_batch.seq_len, batch_size, count,
                                      vocab=self.make_batch.vocab)
        if isinstance(self.make_batch, (TeacherTask, TopicBags, data.ExampleBatches)):
            return self.make_batch.validation(batch_size, count)
        return None

    def evidence_batches(self, batch_size: int, count: int = 8) -> tuple[list[tuple], str]:
        """The batches convergence evidence is measured on, and what they are: the
        validation batches, else held-out batches of ``make_batch`` (drawn under seeds
        that no training step uses, so the same on every call)."""
        validation = self.validation(batch_size, count)
        if validation is not None:
            return validation, "validation"
        state = torch.get_rng_state()
        try:
            held_out = []
            for index in range(count):
                torch.manual_seed(HELD_OUT_SEED + index)
                held_out.append(self.make_batch(batch_size))
        finally:
            torch.set_rng_state(state)
        return held_out, "held-out training batches"


def _checked_batches(batches, name: str) -> list[tuple]:
    if not isinstance(batches, (list, tuple)) or not batches or not all(
            isinstance(b, (list, tuple)) and len(b) == 2 for b in batches):
        raise BytecompError(f"model {name}: validation must give a non-empty list of "
                            f"(inputs, targets) batches")
    return list(batches)


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.dtype in (torch.int64, torch.int32):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.mse_loss(output, target)


def _from_factory(spec: str) -> Workload:
    from bytecomp.model_spec import search_current_directory

    module_name, _, attribute = spec.partition(":")
    search_current_directory()  # as `python -m bytecomp` and a script beside it find it
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if not f"{module_name}.".startswith(f"{error.name}."):  # an import of its own failed
            raise BytecompError(f"cannot import model factory module {module_name!r}: "
                                f"ModuleNotFoundError: {error}"[:500]) from None
        raise BytecompError(f"cannot import model factory module {module_name!r}: "
                            f"ModuleNotFoundError: {error} (bytecomp looks on the Python "
                            f"path, then in the current directory: run from the directory "
                            f"that holds {module_name.split('.')[0]}, or put that directory "
                            f"on PYTHONPATH)"[:500]) from None
    except (KeyboardInterrupt, GeneratorExit):  # ^C still interrupts
        raise
    except BaseException as error:  # noqa: BLE001  # a user's BaseException too: one line
        raise _user_failure(error, f"importing model factory module {module_name!r}",
                            f"cannot import model factory module {module_name!r}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise BytecompError(f"{module_name!r} has no callable {attribute!r}")
    try:
        made = factory()
    except (KeyboardInterrupt, GeneratorExit):  # ^C still interrupts
        raise
    except BaseException as error:  # noqa: BLE001  # a user's BaseException too: one line
        raise _user_failure(error, f"model factory {spec}", f"model factory {spec} failed",
                            " instead of returning (model, make_batch)") from None
    if isinstance(made, tuple) and len(made) in (2, 3):
        made = Recipe(made[0], made[1], made[2] if len(made) == 3 else None)
    if not isinstance(made, Recipe) or not isinstance(made.model, nn.Module) or \
            not callable(made.make_batch):
        raise BytecompError(f"model factory {spec} must return a bytecomp.Recipe, "
                            f"(model, make_batch) or (model, make_batch, loss_fn)")
    return _workload(spec, made, {}, getattr(module, "__file__", None))


def _user_failure(error: BaseException, subject: str, failed: str,
                  instead: str = "") -> BytecompError:
    """The one line for the user's code (``subject``) raising ``error``: a ``sys.exit``
    as that (exit code 0 would end bytecomp "successfully", with nothing), anything
    else as ``failed``, its type and message on one line, within 500 characters."""
    if isinstance(error, SystemExit):
        return BytecompError(f"{subject} called sys.exit({error.code!r}){instead}")
    return BytecompError(f"{failed}: {type(error).__name__}: "
                         f"{' '.join(str(error).split())}"[:500])


def _workload(name: str, recipe: Recipe, args: dict, source: str | None = None) -> Workload:
    """A recipe as a workload, its optimizer spec and batch size checked."""
    optimizer = recipe.optimizer if recipe.optimizer is not None else DEFAULT_OPTIMIZER
    if isinstance(optimizer, str):
        optimizer = parse_optimizer(optimizer).spec  # one line for a bad spec
    elif not callable(optimizer):
        raise BytecompError(f"model {name}: optimizer must be a spec or a function of the "
                            f"parameters")
    if recipe.validation is not None and not (callable(recipe.validation) or
                                              isinstance(recipe.validation, (list, tuple))):
        raise BytecompError(f"model {name}: validation must be a list of batches or a "
                            f"function of the batch size")
    batch_size = recipe.batch_size if recipe.batch_size is not None else 32
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BytecompError(f"model {name}: batch_size must be a positive integer")
    scheduler = recipe.scheduler
    if isinstance(scheduler, str):
        scheduler = parse_scheduler(scheduler).spec  # one line for a bad spec
    elif scheduler is not None and not callable(scheduler):
        raise BytecompError(f"model {name}: scheduler must be a spec or a function of the "
                            f"optimizer")
    return Workload(name, recipe.model, recipe.make_batch, recipe.loss, batch_size, args, source,
                    optimizer, recipe.validation, scheduler)


def load_workload(spec: str, seed: int = 0, optimizer: str | None = None,
                  scheduler: str | None = None) -> Workload:
    """Build the workload named by ``spec`` (see the module docstring); ``optimizer`` and
    ``scheduler``: specs that replace the recipe's (``bytecomp profile --optimizer``,
    ``--scheduler``)."""
    name, rest = split_name(spec, fold=False)
    torch.manual_seed(seed)
    if name in BUILTINS:
        args = builtin_args(name, rest)
        workload = _workload(name, build_builtin(name, args), args)
    elif rest and re.fullmatch(r"[A-Za-z_][\w.]*", name) and rest.isidentifier():
        workload = _from_factory(spec.strip())
    else:
        raise BytecompError(f"unknown model {spec!r}; choose from {', '.join(BUILTINS)} "
                            f"or give pkg.module:factory")
    if optimizer is not None:
        workload.optimizer = parse_optimizer(optimizer).spec
    if scheduler is not None:
        workload.scheduler = parse_scheduler(scheduler).spec
    return workload


def data_source(workload: Workload) -> str:
    """What the workload trains on, for a profile's record."""
    if isinstance(workload.make_batch, TextWindows):
        return f"text: the standard library's source as bytes (corpus {corpus_digest()})"
    if isinstance(workload.make_batch, data.ExampleBatches):
        return "scikit-learn's bundled handwritten digits, every fifth image held out"
    if isinstance(workload.make_batch, TopicBags):
        return "generated: documents of a topic model, Zipf-distributed words, 10% label noise"
    if isinstance(workload.make_batch, TeacherTask):
        return "generated: Gaussian inputs labelled by a fixed random teacher, 10% label noise"
    return "generated" if workload.name in BUILTINS else "the factory's make_batch"


def parameter_count(model: nn.Module) -> int:
    """The elements of the parameters that train (what DDP exchanges and a plan plans;
    frozen ones are neither)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def safe_name(spec: str) -> str:
    """A directory name for a workload spec: ``pkg.mod:factory`` -> ``pkg.mod-factory``."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", spec).strip("-") or "model"


def describe(model: nn.Module) -> str:
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = len(list(model.parameters())) - len(trained)
    return f"{parameter_count(model) / 1e6:.2f}M parameters in {len(trained)} tensors" + \
        (f", {frozen} frozen (not planned)" if frozen else "")


def to_device(batch, device):
    """A batch of the workload's (inputs, target) on ``device``: the inputs a tuple."""
    inputs, target = batch
    if isinstance(inputs, (tuple, list)):
        inputs = tuple(t.to(device) for t in inputs)
    else:
        inputs = (inputs.to(device),)
    return inputs, target.to(device)
