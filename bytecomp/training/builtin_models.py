"""The built-in workloads: their models, their recipes, and their sizes from their arguments.

A built-in spec is a name with optional integer arguments, like a compressor spec
(``transformer:layers=4,width=256``): :data:`BUILTINS` names each one's recipe builder,
:data:`SIZES` its parameters and buffers from its arguments, so that a model too large is
refused before anything is built (:func:`check_builtin_size`). Loading any workload, a
built-in or a user's factory: :func:`bytecomp.training.workloads.load_workload`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import bytecomp.training.data as data
from bytecomp.errors import BytecompError
from bytecomp.recipe import DEFAULT_OPTIMIZER, Recipe
from bytecomp.specs import split_items, split_name
from bytecomp.training.data import TeacherTask, TextWindows, TopicBags

MAX_ARGUMENT = 1 << 20  # a built-in's argument (a width, a depth, a vocabulary, ...)
# a built-in model's parameters and buffers: 4 GiB in float32, 16 GiB a rank with the
# gradients and Adam's two moments (counted from the arguments before anything is built)
MAX_MODEL_ELEMENTS = 1 << 30


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


class BagOfWords(nn.Module):
    """A bag-of-words text classifier: the mean of the document's word embeddings
    (``nn.EmbeddingBag``), then two hidden layers. A batch's gradient of the embedding
    is zero outside the rows of the words it holds: dense in DDP's allreduce, sparse in
    content."""

    def __init__(self, vocab: int, width: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab, width, mode="mean")
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, words):
        x = F.relu(self.fc1(self.embedding(words)))
        return self.head(F.relu(self.fc2(x)))


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, layers, batch_first=True)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens):
        output, _ = self.lstm(self.embedding(tokens))
        return self.decoder(output)


# The built-in workloads are recipes too: Adam at 1e-3 (what bytecomp's convergence runs
# have trained with), their own data.


def _mlp(inputs=512, width=1024, depth=4, classes=10):
    return Recipe(MLP(inputs, width, depth, classes), TeacherTask(inputs, classes),
                  optimizer=DEFAULT_OPTIMIZER, batch_size=64)


def _cnn(width=32, classes=10):
    def batch(n):
        return torch.randn(n, 3, 32, 32), torch.randint(0, classes, (n,))
    return Recipe(ConvNet(width, classes), batch, optimizer=DEFAULT_OPTIMIZER, batch_size=32)


def _digits(width=16, classes=10):
    return Recipe(DigitsNet(width, classes), data.digits(), optimizer=DEFAULT_OPTIMIZER,
                  batch_size=32)


def _transformer(layers=4, width=256, heads=4, seq_len=128, vocab=8192):
    if width % heads:
        raise BytecompError(f"transformer: width={width} must be a multiple of heads={heads}")
    return Recipe(GPT(vocab, width, layers, heads, seq_len), TextWindows(seq_len, vocab=vocab),
                  optimizer=DEFAULT_OPTIMIZER, batch_size=8)


def _lstm(layers=2, width=512, seq_len=64, vocab=10000):
    return Recipe(LSTMLanguageModel(vocab, width, layers), TextWindows(seq_len, vocab=vocab),
                  optimizer=DEFAULT_OPTIMIZER, batch_size=16)


def _bow(vocab=20000, width=32, hidden=256, classes=20, length=64):
    # SGD with momentum, as such classifiers train; a rate at which it still falls
    # smoothly (fp32 DDP's loss flattens within 600-900 steps at batch 32)
    return Recipe(BagOfWords(vocab, width, hidden, classes),
                  TopicBags(vocab, classes, length, topic_words=min(400, vocab)),
                  optimizer="sgd:lr=0.1,momentum=0.9", batch_size=32)


def _vision(name):
    def build(classes=1000, image=224):
        try:
            import torchvision
        except Exception:
            raise BytecompError(f"{name} needs torchvision: pip install 'bytecomp-ddp[vision]' "
                                f"(torch==2.14.1 torchvision==0.29.1 on CPU-only machines)") from None
        model = getattr(torchvision.models, name)(num_classes=classes)

        def batch(n):
            return torch.randn(n, 3, image, image), torch.randint(0, classes, (n,))
        return Recipe(model, batch, optimizer=DEFAULT_OPTIMIZER, batch_size=32)
    return build


BUILTINS: dict[str, Callable] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "transformer": _transformer,
    "lstm": _lstm,
    "digits": _digits,
    "bow": _bow,
    "resnet18": _vision("resnet18"),
    "resnet50": _vision("resnet50"),
    "vgg16": _vision("vgg16"),
}


def _linear(a: int, b: int) -> int:
    return a * b + b


def _mlp_size(inputs, width, depth, classes):
    sizes = [inputs] + [width] * depth
    return sum(_linear(a, b) for a, b in zip(sizes, sizes[1:])) + _linear(sizes[-1], classes)


def _cnn_size(width, classes):
    channels = [3, width, 2 * width, 4 * width, 8 * width]
    blocks = sum(9 * a * b + b + 4 * b + 1 for a, b in zip(channels, channels[1:]))  # + BN
    return blocks + _linear(32 * width, 16 * width) + _linear(16 * width, classes)


def _transformer_size(layers, width, heads, seq_len, vocab):
    block = _linear(width, 3 * width) + _linear(width, width) + _linear(width, 4 * width) \
        + _linear(4 * width, width) + 4 * width  # attention, feed-forward, two norms
    return (vocab + seq_len) * width + layers * block + 2 * width + width * vocab \
        + seq_len * seq_len  # the causal mask


# Each built-in's parameters and buffers from its arguments (all given, defaults filled
# in), before anything is built; tests/hostile/test_api_types.py checks them against the
# models. The torchvision ones: their parameters at 1,000 classes, less the classifier's.
SIZES: dict[str, Callable[..., int]] = {
    "mlp": _mlp_size,
    "cnn": _cnn_size,
    "transformer": _transformer_size,
    "lstm": lambda layers, width, seq_len, vocab: vocab * width + layers * (
        8 * width * width + 8 * width) + _linear(width, vocab),
    "digits": lambda width, classes: 9 * width + width + 18 * width * width + 2 * width
    + _linear(32 * width, 4 * width) + _linear(4 * width, classes),
    "bow": lambda vocab, width, hidden, classes, length: vocab * width + _linear(width, hidden)
    + _linear(hidden, hidden) + _linear(hidden, classes),
    "resnet18": lambda classes, image: 11_176_512 + _linear(512, classes),
    "resnet50": lambda classes, image: 23_508_032 + _linear(2048, classes),
    "vgg16": lambda classes, image: 134_260_544 + _linear(4096, classes),
}


def model_elements(name: str, args: dict) -> int:
    """The parameters and buffers of built-in ``name``'s model with ``args`` (the rest at
    their defaults), from the arguments alone: nothing is built."""
    bound = inspect.signature(BUILTINS[name]).bind(**args)
    bound.apply_defaults()
    return SIZES[name](**bound.arguments)


def _check_size(name: str, args: dict) -> None:
    elements = model_elements(name, args)
    if elements > MAX_MODEL_ELEMENTS:
        given = ",".join(f"{key}={value}" for key, value in args.items())
        raise BytecompError(f"model {name}:{given} has {elements:,} parameters and buffers, "
                            f"more than the {MAX_MODEL_ELEMENTS:,} a built-in may have "
                            f"(4 GiB in float32): give smaller arguments")


def check_builtin_size(spec: str) -> None:
    """Where ``spec`` names a built-in: its arguments parse and its model is within
    :data:`MAX_MODEL_ELEMENTS`, from the arguments alone (nothing is built), else one
    line; any other spec passes (it is checked where it is built)."""
    name, rest = split_name(spec, fold=False)
    if name in BUILTINS:
        _check_size(name, builtin_args(name, rest))


def build_builtin(name: str, args: dict) -> Recipe:
    _check_size(name, args)
    try:
        return BUILTINS[name](**args)
    except RuntimeError as error:  # the allocator's, where the memory is less than the cap
        if "alloc" not in str(error).lower():
            raise
        raise BytecompError(f"model {name}: not enough memory to build it ("
                            f"{' '.join(str(error).split())[:200]})") from None


def builtin_args(name: str, text: str) -> dict:
    allowed = inspect.signature(BUILTINS[name]).parameters
    args = {}
    for key, _, value in split_items(text, f"model {name}", text.strip(), noun="argument"):
        if key not in allowed:
            raise BytecompError(f"model {name}: unknown argument {key!r}; valid: "
                                f"{', '.join(allowed)}")
        try:
            args[key] = int(value)
        except ValueError:
            raise BytecompError(f"model {name}: {key}={value!r} is not an integer") from None
        if not 1 <= args[key] <= MAX_ARGUMENT:
            shown = value if len(value) <= 30 else value[:27] + "..."
            raise BytecompError(f"model {name}: {key} must be from 1 to {MAX_ARGUMENT:,}, got "
                                f"{shown}")
    return args
