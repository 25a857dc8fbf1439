"""Which path a compressor's encode and decode take: fused Triton kernels or PyTorch ops.

A compressor whose ``kernel`` trait is ``"triton"`` (:class:`~bytecomp.compress.base.
Compressor`) runs :mod:`bytecomp.compress.triton_kernels` on a tensor when

* the tensor is on an NVIDIA GPU of compute capability 8.0 or newer (Ampere, Hopper,
  Blackwell: what Triton supports; not on ROCm, whose arithmetic is not checked);
* ``triton`` imports (CUDA builds of torch ship it; ``pip install bytecomp-ddp[kernels]``);
* the environment variable ``BYTECOMP_KERNELS`` is not ``off`` (``auto``, the default);
* the tensor is a non-empty contiguous float32, float16 or bfloat16 tensor;

and runs the PyTorch ops it always ran otherwise: always on the CPU. The results are the
same either way (docs/kernels.md: bit-identical, or the scales of EF-signSGD and 1-bit
SGD within a relative 1e-5). The profiler times whichever path runs, since it calls the
compressor's own methods as the executor does; the profile records it
(:func:`describe`), and ``bytecomp compressors`` shows it (:func:`path`).

This module imports neither torch nor triton (planning imports the compressors); the
kernels module is imported the first time a CUDA tensor meets a compressor with kernels.
A kernel that fails to compile or launch turns the kernels off for the process with a
warning (:func:`disable`), and the PyTorch path runs from then on.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from bytecomp.errors import BytecompError

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch

TRITON = "triton"
TORCH = "torch"
ENV = "BYTECOMP_KERNELS"
MODES = ("auto", "off")
MIN_CAPABILITY = (8, 0)
MODULE = "bytecomp.compress.triton_kernels"

# Calls of each kernel wrapper that ran, by name: the tests check that a path they
# compare did run the kernels.
LAUNCHES: Counter[str] = Counter()
_loaded: dict[str, ModuleType | None] = {}
_disabled: list[str] = []  # why the kernels were turned off in this process
_testing = {"cpu": False, "strict": False}


def mode() -> str:
    """``BYTECOMP_KERNELS``: ``auto`` (the default: kernels where they can run) or
    ``off`` (the PyTorch path everywhere)."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise BytecompError(f"{ENV}={value!r}: must be one of {', '.join(MODES)}")
    return value


@cache
def triton_installed() -> bool:
    """Whether ``triton`` can be imported (found, not imported: the CLI stays light)."""
    try:
        return importlib.util.find_spec(TRITON) is not None
    except (ImportError, ValueError):  # a None or spec-less entry in sys.modules
        return False


def enabled() -> bool:
    """Kernels may run in this process: triton is there, not switched off, not disabled
    by a failure."""
    return mode() != "off" and not _disabled and triton_installed()


def path(compressor: Any, device_type: str = "cuda") -> str:
    """What a compressor's encode and decode run on a ``device_type`` tensor here:
    ``"triton"`` or ``"torch"`` (a GPU's compute capability aside, which needs torch)."""
    if getattr(compressor, "kernel", None) == TRITON and device_type == "cuda" and enabled():
        return TRITON
    return TORCH


def describe(device: torch.device) -> str:
    """The compressor path on ``device`` for a profile's metadata: ``"triton <version>"``
    where the compressors with kernels run them, else ``"torch"``."""
    if device.type != "cuda" or not enabled() or not _capable(device):
        return TORCH
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{TRITON} {version(TRITON)}"
    except PackageNotFoundError:
        return TRITON


def _capable(device: torch.device) -> bool:
    import torch

    if torch.version.hip is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index) >= MIN_CAPABILITY


@cache
def _capability(index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(index)


def _module() -> ModuleType | None:
    if MODULE not in _loaded:
        try:
            _loaded[MODULE] = importlib.import_module(MODULE)
        except ModuleNotFoundError as error:
            if error.name != TRITON:
                raise
            _loaded[MODULE] = None  # no triton: the PyTorch path, silently
        except Exception as error:  # a broken triton install: say so once
            _loaded[MODULE] = None
            disable(f"import {TRITON}: {type(error).__name__}: {error}")
    return _loaded[MODULE]


def for_tensor(x: torch.Tensor, dtype: torch.dtype | None = None) -> Any:
    """The kernels module if its kernels take ``x`` here (to decode into ``dtype``, where
    given: ``x`` is a payload), else None (the PyTorch path)."""
    if not enabled():
        return None
    if x.device.type == "cuda":
        if not _capable(x.device):
            return None
    elif not (x.device.type == "cpu" and _testing["cpu"]):
        return None
    module = _module()
    if module is None or not module.supports(x, dtype):
        return None
    return module


def fits(residual: torch.Tensor | None, x: torch.Tensor) -> bool:
    """Whether the kernels take ``residual`` beside ``x``: none, or one of x's dtype and
    contiguous (one of another dtype promotes in ``x + residual``: the PyTorch path's)."""
    return residual is None or (residual.dtype == x.dtype and residual.is_contiguous())


def disable(reason: str) -> None:
    """Turn the kernels off for this process, with a warning: the PyTorch path from now."""
    _disabled.append(reason)
    warnings.warn(f"bytecomp: fused compression kernels off ({reason}); the PyTorch path "
                  f"runs instead", RuntimeWarning, stacklevel=3)


def strict() -> bool:
    """A kernel failure raises instead of falling back (:func:`interpreted_on_cpu`)."""
    return _testing["strict"]


@contextmanager
def interpreted_on_cpu() -> Iterator[ModuleType]:
    """Run the kernels on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``),
    strictly (a failure raises): how the tests check them without a GPU. The kernels
    module is (re)loaded interpreted: not for a process that also runs them on a GPU.
    Raises ImportError where triton is not installed."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = sys.modules.get(MODULE)
        module = importlib.reload(module) if module is not None else \
            importlib.import_module(MODULE)
        _loaded[MODULE] = module
        _testing.update(cpu=True, strict=True)
        yield module
    finally:
        _testing.update(cpu=False, strict=False)
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
