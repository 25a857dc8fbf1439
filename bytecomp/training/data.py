"""Real training data that needs no download: text that ships with Python.

The character-level corpus is the source code of a fixed list of the standard
library's own modules, read as bytes (token ids 0-255). Training windows come
from the training modules and validation windows from separate modules, so the
validation loss measures generalization. The text depends on the Python version
a little (the modules change between releases); :func:`corpus_digest` names it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

import torch

from bytecomp.errors import BytecompError

TRAIN_MODULES = (
    "argparse", "textwrap", "difflib", "fractions", "statistics", "string", "shlex", "csv",
    "configparser", "calendar", "heapq", "functools", "dataclasses", "enum", "pprint",
    "ipaddress", "json.decoder", "json.encoder", "random", "tarfile", "email.message",
    "http.cookiejar", "logging",
)
VALIDATION_MODULES = ("inspect", "typing")
VOCAB = 256  # bytes


def _source(module: str) -> bytes:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise BytecompError(f"the text corpus needs the standard library's {module} source")
    return Path(spec.origin).read_bytes()


@functools.cache
def corpus(split: str) -> torch.Tensor:
    """The split's text as a 1-D uint8 tensor (``train`` or ``validation``)."""
    modules = {"train": TRAIN_MODULES, "validation": VALIDATION_MODULES}.get(split)
    if modules is None:
        raise BytecompError(f"unknown split {split!r} (train or validation)")
    text = b"\n".join(_source(module) for module in modules)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def corpus_digest() -> str:
    """sha256 of both splits: which text a run trained and validated on."""
    digest = hashlib.sha256()
    for split in ("train", "validation"):
        digest.update(corpus(split).numpy().tobytes())
    return digest.hexdigest()[:16]


class TextWindows:
    """``make_batch(n)``: ``n`` random windows of ``seq_len + 1`` bytes from a split, as
    (inputs, next-byte targets). Positions come from torch's global generator (so
    ``torch.manual_seed`` governs them, as for every built-in workload) or, with
    ``seed``, from a generator of its own. A ``vocab`` under 256 takes every byte modulo
    the vocabulary (distinct bytes then share a token, but the text stays text: a model
    still learns it); a larger one uses its first 256 tokens."""

    def __init__(self, seq_len: int, split: str = "train", seed: int | None = None,
                 vocab: int = VOCAB) -> None:
        self.text = corpus(split)
        if len(self.text) <= seq_len + 1:
            raise BytecompError(f"seq_len={seq_len} is longer than the {split} text")
        if vocab < 2:
            raise BytecompError(f"a vocabulary of {vocab} token cannot hold text")
        self.seq_len, self.vocab = seq_len, vocab
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def __call__(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.text) - self.seq_len - 1, (n,),
                               generator=self.generator)
        offsets = torch.arange(self.seq_len + 1)
        windows = self.text[starts[:, None] + offsets].long()
        if self.vocab < VOCAB:
            windows = windows % self.vocab
        return windows[:, :-1], windows[:, 1:]


def validation_batches(seq_len: int, batch_size: int, count: int, seed: int = 1234,
                       vocab: int = VOCAB) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of validation batches (the same for every strategy and run)."""
    windows = TextWindows(seq_len, "validation", seed, vocab)
    return [windows(batch_size) for _ in range(count)]


class _DrawnTask:
    """A task generated offline whose examples :meth:`draw` makes from a generator:
    ``make_batch(n)`` draws from torch's global one, :meth:`validation` from one of its
    own (the same batches on every call)."""

    label_noise: float
    classes: int

    def draw(self, n: int, generator: torch.Generator | None = None):
        raise NotImplementedError

    def _noisy(self, labels: torch.Tensor, generator: torch.Generator | None):
        """``labels`` with ``label_noise`` of them replaced by random classes."""
        n = len(labels)
        flip = torch.rand(n, generator=generator) < self.label_noise
        noise = torch.randint(0, self.classes, (n,), generator=generator)
        return torch.where(flip, noise, labels)

    def __call__(self, n: int):
        return self.draw(n)

    def validation(self, batch_size: int, count: int, seed: int = 4321) -> list[tuple]:
        """Fixed held-out batches (the same on every call)."""
        generator = torch.Generator().manual_seed(seed)
        return [self.draw(batch_size, generator) for _ in range(count)]


class TeacherTask(_DrawnTask):
    """A classification task with a learnable signal, generated offline: Gaussian inputs
    labelled by a fixed random teacher network (``tanh(x W1) W2``, argmax), with
    ``label_noise`` of the labels replaced by random classes (so the loss has a floor
    above zero). ``make_batch(n)`` draws from torch's global generator."""

    def __init__(self, inputs: int, classes: int, label_noise: float = 0.1,
                 teacher_seed: int = 1234) -> None:
        teacher = torch.Generator().manual_seed(teacher_seed)
        self.w1 = torch.randn(inputs, 64, generator=teacher) / inputs ** 0.5
        self.w2 = torch.randn(64, classes, generator=teacher) / 8
        self.inputs, self.classes, self.label_noise = inputs, classes, label_noise

    def draw(self, n: int, generator: torch.Generator | None = None):
        """``n`` labelled examples from ``generator`` (default: the global one)."""
        x = torch.randn(n, self.inputs, generator=generator)
        labels = (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)
        return x, self._noisy(labels, generator)


class ExampleBatches:
    """``make_batch(n)``: ``n`` examples drawn at random (torch's global generator) from a
    fixed training set; :meth:`validation` is the held-out set in fixed batches."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor,
                 validation_inputs: torch.Tensor, validation_targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets
        self.validation_inputs, self.validation_targets = validation_inputs, validation_targets

    def __call__(self, n: int):
        chosen = torch.randint(0, len(self.inputs), (n,))
        return self.inputs[chosen], self.targets[chosen]

    def validation(self, batch_size: int, count: int) -> list[tuple]:
        """The whole held-out set, in batches of ``batch_size`` (``count`` is not used:
        every held-out example counts)."""
        return [(self.validation_inputs[i: i + batch_size],
                 self.validation_targets[i: i + batch_size])
                for i in range(0, len(self.validation_inputs), batch_size)]


def digits() -> ExampleBatches:
    """scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes; no
    download): every fifth image held out for validation."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise BytecompError("the digits workload needs scikit-learn: "
                            "pip install 'bytecomp-ddp[digits]'") from None
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    held_out = torch.arange(len(labels)) % 5 == 0
    return ExampleBatches(images[~held_out], labels[~held_out], images[held_out],
                          labels[held_out])


class TopicBags(_DrawnTask):
    """Documents of a synthetic topic model, generated offline: ``make_batch(n)`` gives
    ``n`` documents of ``length`` word ids (inputs ``(n, length)``) and their classes.

    Words follow Zipf's law, as in real text: a word's background frequency falls as
    one over its rank in a ``vocab``-word vocabulary. Each of the ``classes`` has its
    own ``topic_words`` (drawn once, under ``topic_seed``), Zipf-weighted among
    themselves; each word of a document of that class is one of them with probability
    ``topic_share``, else a background word. ``label_noise`` of the labels are then
    replaced by random classes (the loss has a floor above zero). A batch therefore
    touches a few percent of the vocabulary, mostly the frequent words: the rows of an
    embedding over it are mostly untouched by any one batch. Draws come from torch's
    global generator, as every built-in workload's."""

    def __init__(self, vocab: int, classes: int, length: int, topic_words: int = 400,
                 topic_share: float = 0.25, label_noise: float = 0.1,
                 topic_seed: int = 1234) -> None:
        if topic_words > vocab:
            raise BytecompError(f"{topic_words} topic words do not fit a vocabulary of "
                                f"{vocab}")
        topics = torch.Generator().manual_seed(topic_seed)
        self.background = _zipf(vocab)
        self.topic_weights = _zipf(topic_words)
        self.topics = torch.stack([torch.randperm(vocab, generator=topics)[:topic_words]
                                   for _ in range(classes)])
        self.vocab, self.classes, self.length = vocab, classes, length
        self.topic_share, self.label_noise = topic_share, label_noise

    def draw(self, n: int, generator: torch.Generator | None = None):
        """``n`` labelled documents from ``generator`` (default: the global one)."""
        labels = torch.randint(0, self.classes, (n,), generator=generator)
        words = torch.multinomial(self.background, n * self.length, replacement=True,
                                  generator=generator).view(n, self.length)
        topical = torch.multinomial(self.topic_weights, n * self.length, replacement=True,
                                    generator=generator).view(n, self.length)
        topical = self.topics[labels[:, None], topical]
        words = torch.where(torch.rand(n, self.length, generator=generator) < self.topic_share,
                            topical, words)
        return words, self._noisy(labels, generator)


def _zipf(size: int) -> torch.Tensor:
    """Zipf's law over ``size`` ranks: weights proportional to 1 / rank."""
    weights = 1.0 / torch.arange(1, size + 1, dtype=torch.float64)
    return weights / weights.sum()
