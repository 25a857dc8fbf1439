"""Run a compressor's whole protocol on one rank (a group of size one).

Used to time encode and decode, to count the bytes a tensor puts on the wire
over all rounds, and to check error feedback, without any process group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bytecomp.compress.base import SOLO, Compressor, Payload, payload_nbytes


@dataclass
class Encoded:
    """The last round's payload and context, and the bytes sent over all rounds."""

    payload: Payload
    ctx: object
    bytes_sent: int


def encode(compressor: Compressor, x: torch.Tensor, state: dict) -> Encoded:
    """Compress ``x`` through every round as if this rank were alone."""
    payload, ctx = compressor.compress(x, state, SOLO)
    return advance_rounds(compressor, payload, ctx, state)


def advance_rounds(compressor: Compressor, payload: Payload, ctx: object,
                   state: dict) -> Encoded:
    """The rounds after the first (``compress``'s ``payload`` and ``ctx``), as if this
    rank were alone: what a multi-round compressor computes between its collectives."""
    sent = payload_nbytes(payload)
    collectives = compressor.collectives_of_rounds()
    for collective in collectives[:-1]:
        result = payload if collective == "allreduce" else [payload]
        payload, ctx = compressor.advance(result, ctx, state, SOLO)
        sent += payload_nbytes(payload)
    return Encoded(payload, ctx, sent)


def decode(compressor: Compressor, encoded: Encoded) -> torch.Tensor:
    return compressor.decompress(encoded.payload, encoded.ctx)


def roundtrip(compressor: Compressor, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, int]:
    """``(what the compressor transmits of x, bytes sent)`` for a single rank."""
    encoded = encode(compressor, x, state)
    return decode(compressor, encoded), encoded.bytes_sent


def gain(x: torch.Tensor, approx: torch.Tensor) -> float:
    """``sqrt(max(0, 1 - ||approx - x||^2 / ||x||^2))``; 1 for a zero ``x``."""
    reference = x.double()
    norm = float(reference.pow(2).sum())
    if norm == 0.0:
        return 1.0
    error = float((approx.double().reshape(reference.shape) - reference).pow(2).sum())
    return math.sqrt(max(0.0, 1.0 - error / norm))
