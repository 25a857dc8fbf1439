"""The rounds of a one-stage exchange, which the planner's cost model reads as the
executor runs them; torch-free, so that planning imports no torch."""

from __future__ import annotations

from bytecomp.compress.base import Compressor

GATHER = ("allgather",)  # the rounds of an exchange that gathers every rank's payload


def native_rounds(compressor: Compressor) -> tuple[str, ...]:
    """The rounds of a compressor's own one-stage exchange: its rounds where the last is
    an allreduce (the mean travels), else one allgather of its payload."""
    rounds = compressor.collectives_of_rounds()
    return rounds if rounds[-1] == "allreduce" else GATHER
