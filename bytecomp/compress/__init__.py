"""Compressors, error feedback and the spec registry.

>>> from bytecomp.compress import from_spec
>>> c = from_spec("topk:ratio=0.01")
>>> payload, ctx = c.compress(gradient, state={})
>>> approx = c.decompress(payload, ctx)
"""

from bytecomp.compress.base import SOLO, Compressor, Meta, Param, Payload, Peers, payload_nbytes
from bytecomp.compress.feedback import ErrorFeedback
from bytecomp.compress.registry import (
    COMPRESSORS,
    LADDERS,
    canonical,
    default_specs,
    from_spec,
    ladder_place,
    ladder_specs,
    parameters_of,
)

__all__ = [
    "COMPRESSORS",
    "LADDERS",
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
    "ladder_place",
    "ladder_specs",
    "parameters_of",
    "payload_nbytes",
]
