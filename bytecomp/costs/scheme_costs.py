"""What each collective scheme costs: the pricings the schemes of
:mod:`bytecomp.comm.schemes` name (each scheme's :attr:`~bytecomp.comm.schemes.Scheme.pricing`:
one registry holds a scheme's exchange and its pricing).

A pricing turns a merged group of ``numel`` elements into an :class:`ExchangeCost`
(see :mod:`bytecomp.costs.strategy` for what each part means), from the collective
and compression times that :class:`~bytecomp.costs.strategy.StrategyCosts` gives
(the :class:`Pricing` protocol). A new scheme names its own in its ``pricing``.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from typing import ClassVar, NamedTuple, Protocol

from bytecomp.comm.rounds import native_rounds
from bytecomp.comm.schemes import SCHEMES, Scheme
from bytecomp.compress import Compressor

COUNT_BYTES = 8  # one int64 element count per payload tensor, for variable sizes


class ExchangeCost(NamedTuple):
    """A compressed group's exchange: encode and decode (on the compute stream or a host
    worker), the channel's time, the bytes this rank sends, the part of the channel in
    intra-node collectives, the part that computes, and the collectives issued."""

    encode_ms: float
    channel_ms: float
    decode_ms: float
    wire_bytes: float
    intra_ms: float = 0.0
    compute_ms: float = 0.0
    collectives: int = 0


class Timing(NamedTuple):
    """One compressor's profiled times where the group encodes (device or host)."""

    encode: Callable[[float], float]  # up to the first collective's payload
    decode: Callable[[float], float]
    aggregate: Callable[[float, int], float]  # decode and average this many payloads
    advance: Callable[[float], float]  # a multi-round encode's part between collectives


class Pricing(Protocol):
    """What a scheme's pricing asks of the strategy costs."""

    element_size: int

    def ranks(self, group: str) -> int: ...

    def collective_ms(self, name: str, group: str, dtype: str, nbytes: float) -> float: ...

    def gather_ms(self, group: str, ranks: int, per_rank: float, fixed: bool,
                  tensors: int) -> float: ...

    def round_payloads(self, spec: str, numel: float, shapes) -> list[float]: ...

    def exchange_ms(self, spec: str, numel: float, group: str, rounds: tuple[str, ...],
                    shapes=None) -> float: ...

    def exchange_collectives(self, spec: str, group: str, rounds: tuple[str, ...]) -> int: ...

    def intra_collectives_ms(self, numel: float, intra_dtype: str | None) -> float: ...

    def casts_ms(self, numel: float, intra_dtype: str | None, place: str) -> float: ...


class SchemeCost:
    """How the model prices a scheme: a compressed group's exchange and, where the scheme
    takes uncompressed tensors, an uncompressed one. ``scheme`` is the registered
    scheme priced (one pricing may serve several, reading their traits).
    ``collectives``: the collectives its prices use (whose fits a plan on it relies on)."""

    collectives: ClassVar[tuple[str, ...]] = ()

    def compressed(self, costs: Pricing, scheme: Scheme, compressor: Compressor, spec: str,
                   timing: Timing, numel: float, shapes, place: str) -> ExchangeCost:
        raise NotImplementedError

    def uncompressed(self, costs: Pricing, scheme: Scheme, numel: float) -> ExchangeCost:
        raise NotImplementedError(f"{scheme.name} takes no uncompressed tensors")

    def collectives_used(self, scheme: Scheme, compressor: Compressor | None) -> tuple[str, ...]:
        """The collectives a group on ``scheme`` with ``compressor`` (None: uncompressed)
        is priced with."""
        return self.collectives


def scheme_cost(name: str) -> SchemeCost:
    """The pricing of the registered scheme ``name`` (its ``pricing``; ``ValueError``
    where there is no such scheme or it names none)."""
    scheme = SCHEMES.get(name)
    if scheme is None or not scheme.pricing:
        raise ValueError(f"no cost model for the collective scheme {name!r} (declare one: "
                         f"its Scheme's pricing, a bytecomp.costs.scheme_costs.SchemeCost)")
    return _pricing(scheme.pricing)


@functools.cache
def _pricing(declared: str | type) -> SchemeCost:
    """An instance of the pricing class ``declared`` (or of the class at its import path
    ``"package.module:Class"``), one per class."""
    if isinstance(declared, str):
        module, _, attribute = declared.partition(":")
        return getattr(importlib.import_module(module), attribute)()
    return declared()


# -- the built-in schemes' costs -------------------------------------------------------------


class OneStageCost(SchemeCost):
    """The scheme's rounds over the whole job (the compressor's own, or an allgather)."""

    collectives = ("allreduce", "allgather")

    def collectives_used(self, scheme, compressor):
        return ("allreduce",) if compressor is None else scheme.flat_rounds(compressor)

    def compressed(self, costs, scheme, compressor, spec, timing, numel, shapes, place):
        rounds = scheme.flat_rounds(compressor)
        compute = timing.advance(numel)
        return ExchangeCost(
            timing.encode(numel) - compute,
            costs.exchange_ms(spec, numel, "world", rounds, shapes) + compute,
            timing.aggregate(numel, costs.ranks("world")) if rounds[-1] == "allgather"
            else timing.decode(numel),
            sum(costs.round_payloads(spec, numel, shapes)),
            compute_ms=compute,
            collectives=costs.exchange_collectives(spec, "world", rounds))

    def uncompressed(self, costs, scheme, numel):
        nbytes = numel * costs.element_size
        return ExchangeCost(0.0, costs.collective_ms("allreduce", "world", "float32", nbytes),
                            0.0, nbytes, collectives=1)


class TwoShotCost(SchemeCost):
    """Every chunk encoded; on the channel an alltoall, the average of this rank's chunk,
    its re-encode and an allgather; every gathered chunk decoded."""

    collectives = ("alltoall", "allgather")

    def compressed(self, costs, scheme, compressor, spec, timing, numel, shapes, place):
        world = costs.ranks("world")
        chunk = math.ceil(numel / world)
        payload = sum(costs.round_payloads(spec, chunk, None))
        compute = timing.aggregate(chunk, world) + timing.encode(chunk)
        channel = (costs.collective_ms("alltoall", "world", "uint8", world * payload)
                   + compute + costs.gather_ms("world", world, payload, True, 0))
        if not compressor.fixed_size:  # the element counts' collectives
            counts = world * COUNT_BYTES * 2
            channel += (costs.collective_ms("alltoall", "world", "uint8", counts)
                        + costs.collective_ms("allgather", "world", "uint8", counts))
        return ExchangeCost(world * timing.encode(chunk), channel, world * timing.decode(chunk),
                            2 * world * payload, compute_ms=compute,
                            collectives=2 + (0 if compressor.fixed_size else 2))


class HierarchicalCost(SchemeCost):
    """Intra-node reduce-scatter and allgather (in the scheme's ``intra_dtype``, with their
    casts on the channel), around the compressor's own exchange of this rank's chunk
    between the nodes."""

    collectives = ("reduce_scatter", "allgather", "allreduce")

    def compressed(self, costs, scheme, compressor, spec, timing, numel, shapes, place):
        per_node, nodes = costs.ranks("intra"), costs.ranks("inter")
        chunk = math.ceil(numel / per_node)
        rounds = native_rounds(compressor)
        intra = costs.intra_collectives_ms(numel, scheme.intra_dtype)
        between = timing.advance(chunk)
        compute = costs.casts_ms(numel, scheme.intra_dtype, place) + between
        stage_bytes = 2 if scheme.intra_dtype else costs.element_size
        return ExchangeCost(
            timing.encode(chunk) - between,
            intra + compute + costs.exchange_ms(spec, chunk, "inter", rounds),
            timing.aggregate(chunk, nodes) if rounds[-1] == "allgather" else timing.decode(chunk),
            2 * numel * stage_bytes + sum(costs.round_payloads(spec, chunk, None)),
            intra, compute,
            (2 if per_node > 1 else 0) + costs.exchange_collectives(spec, "inter", rounds))

    def uncompressed(self, costs, scheme, numel):
        per_node = costs.ranks("intra")
        intra = costs.intra_collectives_ms(numel, scheme.intra_dtype)
        channel = (intra + costs.casts_ms(numel, scheme.intra_dtype, "device")
                   + costs.collective_ms("allreduce", "inter", "float32",
                                         numel * costs.element_size / per_node))
        count = (2 if per_node > 1 else 0) + (costs.ranks("inter") > 1)
        return ExchangeCost(0.0, channel, 0.0, numel * costs.element_size, intra,
                            collectives=count)


class TwoLevelCost(SchemeCost):
    """Every chunk encoded; on the channel an intra-node alltoall of the payloads, their
    average, the inter-node exchange of this rank's chunk (its encode, collectives and
    decodes), its re-encode and an intra-node allgather; every gathered chunk decoded."""

    collectives = ("alltoall", "allgather", "allreduce")

    def compressed(self, costs, scheme, compressor, spec, timing, numel, shapes, place):
        per_node, nodes = costs.ranks("intra"), costs.ranks("inter")
        chunk = math.ceil(numel / per_node)
        payload = sum(costs.round_payloads(spec, chunk, None))
        intra = (costs.collective_ms("alltoall", "intra", "uint8", per_node * payload)
                 + costs.gather_ms("intra", per_node, payload, True, 0))
        if not compressor.fixed_size:
            counts = per_node * COUNT_BYTES * 2
            intra += (costs.collective_ms("alltoall", "intra", "uint8", counts)
                      + costs.collective_ms("allgather", "intra", "uint8", counts))
        compute = timing.aggregate(chunk, per_node) + timing.encode(chunk)
        count = (2 + (0 if compressor.fixed_size else 2)) if per_node > 1 else 0
        wire = (per_node + 1) * payload
        inter = 0.0
        if nodes > 1:
            rounds = native_rounds(compressor)
            compute += timing.encode(chunk) + (timing.aggregate(chunk, nodes)
                                               if rounds[-1] == "allgather"
                                               else timing.decode(chunk))
            inter = costs.exchange_ms(spec, chunk, "inter", rounds)
            count += costs.exchange_collectives(spec, "inter", rounds)
            wire += payload
        return ExchangeCost(per_node * timing.encode(chunk), intra + compute + inter,
                            per_node * timing.decode(chunk), wire, intra, compute, count)
