"""Workloads to profile: built-in models and users' own factories.

A workload spec is one of:

* a built-in name with optional arguments, like compressor specs:
  ``mlp``, ``cnn``, ``transformer:layers=4,width=256,seq_len=128``, ``lstm``,
  ``resnet18``, ``resnet50``, ``vgg16`` (the last three need torchvision:
  ``pip install 'bytecomp[vision]'``);
* ``pkg.module:factory``: ``factory()`` returns ``(model, make_batch)`` or
  ``(model, make_batch, loss_fn)``. ``make_batch(batch_size)`` returns
  ``(inputs, targets)`` on the CPU (``inputs`` a tensor or a tuple of tensors);
  bytecomp moves them to the rank's device. Without ``loss_fn`` the loss is
  cross-entropy for integer targets (outputs flattened to ``(-1, classes)``)
  and mean squared error otherwise. Example::

      # mypkg/models.py
      def factory():
          model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                      torch.nn.Linear(64, 4))
          def make_batch(batch_size):
              return torch.randn(batch_size, 32), torch.randint(0, 4, (batch_size,))
          return model, make_batch

      $ bytecomp profile --model mypkg.models:factory --nproc 2
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import bytecomp.profile.data as data
from bytecomp.errors import BytecompError
from bytecomp.profile.data import (
    VOCAB,
    TeacherTask,
    TextWindows,
    corpus_digest,
    validation_batches,
)


@dataclass
class Workload:
    """A model, a batch maker and a loss: what one training iteration needs."""

    name: str
    model: nn.Module
    make_batch: Callable[[int], tuple]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    batch_size: int = 32
    args: dict = field(default_factory=dict)
    source: str | None = None  # a factory's module file: an input no output may replace

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(output, target)
        return default_loss(output, target)

    def validation(self, batch_size: int, count: int = 8) -> list[tuple] | None:
        """Fixed held-out batches (the same on every call), or None where the workload
        has no real data to validate on (generated inputs)."""
        if isinstance(self.make_batch, TextWindows):
            return validation_batches(self.make_batch.seq_len, batch_size, count)
        if isinstance(self.make_batch, (TeacherTask, data.ExampleBatches)):
            return self.make_batch.validation(batch_size, count)
        return None


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.dtype in (torch.int64, torch.int32):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.mse_loss(output, target)


# -- built-in models -------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, inputs: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        sizes = [inputs] + [width] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.head = nn.Linear(sizes[-1], classes)

    def forward(self, x):
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.head(x)


class ConvNet(nn.Module):
    """A small VGG-style convnet for 32x32 RGB images."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        channels = [3, width, 2 * width, 4 * width, 8 * width]
        blocks = []
        for a, b in zip(channels, channels[1:]):
            blocks += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*blocks)
        self.fc1 = nn.Linear(channels[-1] * 4, 16 * width)
        self.fc2 = nn.Linear(16 * width, classes)

    def forward(self, x):
        x = self.features(x).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


class DigitsNet(nn.Module):
    """A small convnet for 8x8 grey images (scikit-learn's digits)."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 16, 4 * width)
        self.fc2 = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


class GPT(nn.Module):
    """A GPT-style decoder: token + position embeddings, pre-norm causal
    self-attention blocks (torch.nn.TransformerEncoderLayer with a causal mask),
    final norm and a language-model head."""

    mask: torch.Tensor  # the causal mask, a non-persistent buffer

    def __init__(self, vocab: int, width: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, tokens):
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        x = self.blocks(x, mask=self.mask[:length, :length], is_causal=True)
        return self.head(self.norm(x))


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, layers, batch_first=True)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens):
        output, _ = self.lstm(self.embedding(tokens))
        return self.decoder(output)


def _mlp(inputs=512, width=1024, depth=4, classes=10):
    return MLP(inputs, width, depth, classes), TeacherTask(inputs, classes), 64


def _cnn(width=32, classes=10):
    def batch(n):
        return torch.randn(n, 3, 32, 32), torch.randint(0, classes, (n,))
    return ConvNet(width, classes), batch, 32


def _digits(width=16, classes=10):
    return DigitsNet(width, classes), data.digits(), 32


def _transformer(layers=4, width=256, heads=4, seq_len=128, vocab=8192):
    if width % heads:
        raise BytecompError(f"transformer: width={width} must be a multiple of heads={heads}")

    return GPT(vocab, width, layers, heads, seq_len), _token_batches(vocab, seq_len), 8


def _lstm(layers=2, width=512, seq_len=64, vocab=10000):
    return LSTMLanguageModel(vocab, width, layers), _token_batches(vocab, seq_len), 16


def _token_batches(vocab: int, seq_len: int) -> Callable:
    """Language-model batches: windows of real text (the standard library's source as
    bytes, :mod:`bytecomp.profile.data`) where the vocabulary holds every byte, else
    uniformly random tokens."""
    if vocab >= VOCAB:
        return TextWindows(seq_len)

    def batch(n):
        tokens = torch.randint(0, vocab, (n, seq_len + 1))
        return tokens[:, :-1], tokens[:, 1:]
    return batch


def _vision(name):
    def build(classes=1000, image=224):
        try:
            import torchvision
        except Exception:
            raise BytecompError(f"{name} needs torchvision: pip install 'bytecomp[vision]' "
                                f"(torch==2.14.1 torchvision==0.29.1 on CPU-only machines)") from None
        model = getattr(torchvision.models, name)(num_classes=classes)

        def batch(n):
            return torch.randn(n, 3, image, image), torch.randint(0, classes, (n,))
        return model, batch, 32
    return build


BUILTINS: dict[str, Callable] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "transformer": _transformer,
    "lstm": _lstm,
    "digits": _digits,
    "resnet18": _vision("resnet18"),
    "resnet50": _vision("resnet50"),
    "vgg16": _vision("vgg16"),
}


def _builtin_args(name: str, text: str) -> dict:
    import inspect

    allowed = inspect.signature(BUILTINS[name]).parameters
    args = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = (s.strip() for s in item.partition("="))
        if key not in allowed:
            raise BytecompError(f"model {name}: unknown argument {key!r}; valid: "
                                f"{', '.join(allowed)}")
        try:
            args[key] = int(value)
        except ValueError:
            raise BytecompError(f"model {name}: {key}={value!r} is not an integer") from None
        if args[key] < 1:
            raise BytecompError(f"model {name}: {key} must be at least 1")
    return args


def _from_factory(spec: str) -> Workload:
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except SystemExit as error:
        raise BytecompError(f"importing model factory module {module_name!r} called "
                            f"sys.exit({error.code!r})") from None
    except Exception as error:
        raise BytecompError(f"cannot import model factory module {module_name!r}: "
                            f"{type(error).__name__}: {error}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise BytecompError(f"{module_name!r} has no callable {attribute!r}")
    try:
        made = factory()
    except SystemExit as error:  # exit code 0 would end bytecomp "successfully", with nothing
        raise BytecompError(f"model factory {spec} called sys.exit({error.code!r}) instead of "
                            f"returning (model, make_batch)") from None
    except Exception as error:
        raise BytecompError(f"model factory {spec} failed: {type(error).__name__}: {error}") from None
    if not isinstance(made, tuple) or len(made) not in (2, 3) or \
            not isinstance(made[0], nn.Module) or not callable(made[1]):
        raise BytecompError(f"model factory {spec} must return (model, make_batch) or "
                            f"(model, make_batch, loss_fn)")
    return Workload(spec, made[0], made[1], made[2] if len(made) == 3 else None,
                    source=getattr(module, "__file__", None))


def load_workload(spec: str, seed: int = 0) -> Workload:
    """Build the workload named by ``spec`` (see the module docstring)."""
    name, _, rest = spec.strip().partition(":")
    torch.manual_seed(seed)
    if name in BUILTINS:
        args = _builtin_args(name, rest)
        model, batch, batch_size = BUILTINS[name](**args)
        return Workload(name, model, batch, None, batch_size, args)
    if rest and re.fullmatch(r"[A-Za-z_][\w.]*", name) and rest.isidentifier():
        return _from_factory(spec.strip())
    raise BytecompError(f"unknown model {spec!r}; choose from {', '.join(BUILTINS)} "
                        f"or give pkg.module:factory")


def data_source(workload: Workload) -> str:
    """What the workload trains on, for a profile's record."""
    if isinstance(workload.make_batch, TextWindows):
        return f"text: the standard library's source as bytes (corpus {corpus_digest()})"
    if isinstance(workload.make_batch, data.ExampleBatches):
        return "scikit-learn's bundled handwritten digits, every fifth image held out"
    if isinstance(workload.make_batch, TeacherTask):
        return "generated: Gaussian inputs labelled by a fixed random teacher, 10% label noise"
    return "generated" if workload.name in BUILTINS else "the factory's make_batch"


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def safe_name(spec: str) -> str:
    """A directory name for a workload spec: ``pkg.mod:factory`` -> ``pkg.mod-factory``."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", spec).strip("-") or "model"


def describe(model: nn.Module) -> str:
    return f"{parameter_count(model) / 1e6:.2f}M parameters in " \
           f"{len(list(model.parameters()))} tensors"


