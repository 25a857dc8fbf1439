"""Compressors, error feedback and the spec registry.

>>> from bytecomp.compress import from_spec
>>> c = from_spec("topk:ratio=0.01")
>>> payload, ctx = c.compress(gradient, state={})
>>> approx = c.decompress(payload, ctx)

Importing this package registers the built-in compressors (each module registers
its own with :func:`register`).
"""

# The built-in compressors register in this order, the order they are listed in.
# isort: off
from bytecomp.compress import quantize, sparse, sign, lowrank, exdyna  # noqa: F401
# isort: on
from typing import TYPE_CHECKING, Any

from bytecomp.compress.base import SOLO, Compressor, Meta, Param, Peers, payload_nbytes
from bytecomp.compress.feedback import ErrorFeedback
from bytecomp.compress.registry import (
    COMPRESSORS,
    canonical,
    default_specs,
    from_spec,
    ladder_families,
    ladder_place,
    ladder_specs,
    parameters_of,
    register,
)

if TYPE_CHECKING:
    from bytecomp.compress.base import Payload

__all__ = [
    "COMPRESSORS",
    "SOLO",
    "Compressor",
    "ErrorFeedback",
    "Meta",
    "Param",
    "Payload",
    "Peers",
    "canonical",
    "default_specs",
    "from_spec",
    "ladder_families",
    "ladder_place",
    "ladder_specs",
    "parameters_of",
    "payload_nbytes",
    "register",
]


def __getattr__(name: str) -> Any:
    if name == "Payload":  # list[torch.Tensor]: it needs torch, imported when asked
        from bytecomp.compress import base

        return base.Payload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
