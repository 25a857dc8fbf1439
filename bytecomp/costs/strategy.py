"""What one strategy costs for one group of tensors: the timeline's inputs.

A strategy (an :class:`Option`) is: no compression, or a compressor spec with
where it encodes and decodes (``device``: on the compute stream, ``host``: on
a CPU worker, with copies on GPUs) and a collective scheme. Its cost for a
merged group of ``numel`` elements has three parts:

* ``encode_ms``: on the compute stream (device) or a host worker (host): the
  compression up to the first collective's payload;
* ``channel_ms``: on the communication channel, in FIFO order: every
  collective of the scheme plus the compute the scheme does between them
  (a multi-round compressor's later rounds, such as PowerSGD's orthogonalization
  and ``Q = M^T P`` between its two allreduces: the profile's ``advance_ms``;
  two-shot's re-compression, the 16-bit casts of a hierarchical scheme's
  intra-node stages, the two-level scheme's averaging, inter-node exchange and
  re-compression, for example);
* ``decode_ms``: like encode, except on the FIFO path (several rounds, or a
  scheme of several stages), whose thread decodes a group before it takes the
  next: there the decode is on the channel;
* ``compute_ms``: the part of ``channel_ms`` that computes (the decode above,
  later rounds, re-compression, casts, averaging): on a CPU job it runs on the cores the
  backward pass runs on (:class:`~bytecomp.timeline.iteration.IterationModel`);
* ``collectives``: how many collectives the exchange issues (each waits longer
  while the backward pass computes, on a CPU job);
* the executor's fixed costs of the group's path (:mod:`bytecomp.costs.executor_costs`):
  ``hook_ms`` on the compute stream before the encode, ``tail_ms`` on the channel
  after the collectives, charged when the plan runs through the hook.

Each scheme's exchange is priced by its entry in :mod:`bytecomp.costs.scheme_costs`;
this module gives them the collectives' and the compressors' times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from bytecomp.comm.rounds import GATHER
from bytecomp.comm.schemes import scheme_of
from bytecomp.compress import from_spec
from bytecomp.costs.executor_costs import ExecutorCosts, path_of
from bytecomp.costs.fitted import CommModel, ComputeModel
from bytecomp.costs.scheme_costs import COUNT_BYTES, ExchangeCost, Timing, scheme_cost
from bytecomp.plan_types import NO_COMPRESSION, Option

__all__ = ["COUNT_BYTES", "NO_COMPRESSION", "GroupCost", "Option", "StrategyCosts"]


def cast_specs(specs) -> dict[str, str]:
    """The profiled specs (of ``specs``) that time a plain 16-bit cast, by the dtype they
    cast to (``"float16"``: the casts of a hierarchical scheme's 16-bit stages)."""
    casts = {}
    for spec in sorted(specs):
        dtype = from_spec(spec).cast_dtype
        if dtype is not None:
            casts[dtype] = spec
    return casts


@dataclass(frozen=True)
class GroupCost:
    encode_ms: float
    channel_ms: float
    decode_ms: float
    host: bool = False
    copy_in_ms: float = 0.0
    copy_out_ms: float = 0.0
    wire_bytes: float = 0.0  # bytes this rank sends over all collectives
    intra_ms: float = 0.0  # the part of channel_ms spent in intra-node collectives
    hook_ms: float = 0.0  # the executor's fixed cost on the hook's thread (compute stream)
    tail_ms: float = 0.0  # and on the channel after the collectives (costs/executor_costs.py)
    compute_ms: float = 0.0  # the part of channel_ms that computes (decodes, re-encodes)
    collectives: int = 0  # collectives the exchange issues


@cache
def _compressor(spec: str):
    return from_spec(spec)


class StrategyCosts:
    """Costs of options for groups, from the fitted models of a profile and cluster."""

    def __init__(self, comm: CommModel, compute: ComputeModel, device_type: str,
                 element_size: int = 4, executor: ExecutorCosts | None = None) -> None:
        self.comm = comm
        self.compute = compute
        self.executor = executor or ExecutorCosts()
        self.device_type = device_type
        self.element_size = element_size
        self._cache: dict = {}
        self._gathered: dict = {}
        self._payloads: dict = {}
        self._collectives: dict[tuple, float] = {}
        self.gathers = "d2d" in compute.copies  # the profile measured memory copies
        # fp16/bf16 timings on the device and on the cpu (host groups cast there): the casts
        self.casts = cast_specs({s for s, d in compute.encode if d == device_type})
        self.host_casts = cast_specs({s for s, d in compute.encode if d == "cpu"})

    def ranks(self, group: str) -> int:
        return self.comm.ranks(group)

    # -- collectives ---------------------------------------------------------------
    def collective_ms(self, name: str, group: str, dtype: str, nbytes: float) -> float:
        """The comm model's time, memoized (the search and the bounds ask again and
        again for the same sizes)."""
        key = (name, group, dtype, nbytes)
        time = self._collectives.get(key)
        if time is None:
            time = self._collectives[key] = self.comm.time_ms(name, group, dtype, nbytes)
        return time

    def gather_ms(self, group: str, ranks: int, per_rank: float, fixed: bool,
                  tensors: int) -> float:
        """An allgather of ``per_rank`` bytes from each of ``ranks`` ranks (and of the
        ``tensors`` element counts first, unless the size is ``fixed``)."""
        time = self.collective_ms("allgather", group, "uint8", ranks * per_rank)
        if not fixed:
            time += self.collective_ms("allgather", group, "uint8",
                                       ranks * COUNT_BYTES * tensors)
        return time

    def round_payloads(self, spec: str, numel: float, shapes) -> list[float]:
        """Bytes a rank sends in each round for ``numel`` elements (memoized)."""
        key = (spec, numel, shapes)
        if key not in self._payloads:
            self._payloads[key] = self._round_payloads(spec, numel, shapes)
        return self._payloads[key]

    def _round_payloads(self, spec: str, numel: float, shapes) -> list[float]:
        compressor = _compressor(spec)
        if compressor.measured_payload:  # data-dependent: what the profile measured
            measured = self.compute.measured_payload(spec, self.device_type, numel)
            return [measured]
        return [float(b) for b in compressor.round_payload_bytes(int(numel), self.element_size,
                                                                 list(shapes) if shapes else None)]

    def exchange_collectives(self, spec: str, group: str, rounds: tuple[str, ...]) -> int:
        """How many collectives the one-stage exchange over ``group`` in ``rounds`` issues
        (the compressor's own, or :data:`~bytecomp.comm.rounds.GATHER`)."""
        compressor = _compressor(spec)
        if self.comm.ranks(group) <= 1:
            return 0
        gather = 1 if compressor.fixed_size else 2  # sizes first, unless fixed
        if rounds == GATHER:
            return gather
        return sum(1 if collective == "allreduce" else gather for collective in rounds)

    def exchange_ms(self, spec: str, numel: float, group: str, rounds: tuple[str, ...],
                    shapes=None) -> float:
        """Channel time of the one-stage exchange of ``numel`` elements over ``group`` in
        ``rounds``."""
        compressor = _compressor(spec)
        ranks = self.comm.ranks(group)
        if ranks <= 1:
            return 0.0
        payloads = self.round_payloads(spec, numel, shapes)
        if rounds == GATHER:
            return self.gather_ms(group, ranks, sum(payloads), compressor.fixed_size, 2)
        time = 0.0
        for collective, nbytes in zip(rounds, payloads):
            if collective == "allreduce":
                time += self.collective_ms("allreduce", group, compressor.wire_dtype, nbytes)
            else:
                time += self.gather_ms(group, ranks, nbytes, compressor.fixed_size, 2)
        return time

    # -- a hierarchical scheme's intra-node stages ----------------------------------------
    def intra_collectives_ms(self, numel: float, intra_dtype: str | None) -> float:
        """Reduce-scatter and allgather inside the node, in ``intra_dtype`` (16 bits) or
        the gradients' own."""
        nbytes = numel * (2 if intra_dtype else self.element_size)
        dtype = intra_dtype or "float32"
        return (self.collective_ms("reduce_scatter", "intra", dtype, nbytes)
                + self.collective_ms("allgather", "intra", dtype, nbytes))

    def casts_ms(self, numel: float, intra_dtype: str | None, place: str) -> float:
        """The 16-bit intra-node stages' casts: the tensor to 16 bits and this rank's
        chunk back, then the chunk to 16 bits and the gathered tensor back."""
        if intra_dtype is None or self.comm.ranks("intra") <= 1:
            return 0.0
        table = self.host_casts if place == "host" else self.casts
        spec = table.get(intra_dtype)
        if spec is None:  # the tree prunes these schemes without cast timings
            return 0.0
        device = "cpu" if place == "host" else self.device_type
        chunk = math.ceil(numel / self.comm.ranks("intra"))
        encode, decode = self.compute.encode_ms, self.compute.decode_ms
        return (encode(spec, device, numel) + decode(spec, device, chunk)
                + encode(spec, device, chunk) + decode(spec, device, numel))

    def gathered(self, cost: GroupCost, nbytes: float) -> GroupCost:
        """``cost`` plus gathering scattered members into one tensor before encoding and
        scattering the result back after decoding (device memory copies).

        A host group on a GPU gathers on the device before its copy to the host (so
        the gather goes with the copy in), and its copy back writes each member in
        place (no scatter); everywhere else encode and decode pay both."""
        key = (id(cost), nbytes)
        hit = self._gathered.get(key)
        if hit is not None and hit[0] is cost:
            return hit[1]
        copy = self.compute.copy_ms("d2d", nbytes)
        if copy <= 0:
            out = cost
        else:
            encode, decode, copy_in = cost.encode_ms, cost.decode_ms, cost.copy_in_ms
            if cost.host and self.device_type != "cpu":
                copy_in += copy
            else:
                encode, decode = encode + copy, decode + copy
            # the constructor, not dataclasses.replace (several times slower): a search
            # gathers a new group in most of its evaluations
            out = GroupCost(encode, cost.channel_ms, decode, cost.host, copy_in,
                            cost.copy_out_ms, cost.wire_bytes, cost.intra_ms, cost.hook_ms,
                            cost.tail_ms, cost.compute_ms, cost.collectives)
        self._gathered[key] = (cost, out)  # keeps cost alive, so its id stays its own
        return out

    def cost(self, option: Option, numel: int, shapes: tuple | None = None) -> GroupCost:
        key = (option, numel, shapes)
        cost = self._cache.get(key)
        if cost is None:
            path = path_of(option)
            c = self._cost(option, numel, shapes)
            channel, decode, compute = c.channel_ms, c.decode_ms, c.compute_ms
            if path == "fifo":  # the FIFO thread decodes before it takes the next group
                channel, decode, compute = channel + decode, 0.0, compute + decode
            # the constructor, not dataclasses.replace: this runs thousands of times a search
            cost = self._cache[key] = GroupCost(
                c.encode_ms, channel, decode, c.host, c.copy_in_ms, c.copy_out_ms,
                c.wire_bytes, c.intra_ms, self.executor.hook_ms[path],
                self.executor.tail_ms[path], compute, c.collectives)
        return cost

    def _cost(self, option: Option, numel: int, shapes) -> GroupCost:
        scheme = scheme_of(option.scheme)
        pricing = scheme_cost(option.scheme)
        if not option.compressed:
            part: ExchangeCost = pricing.uncompressed(self, scheme, numel)
            return GroupCost(0.0, part.channel_ms, 0.0, wire_bytes=part.wire_bytes,
                             intra_ms=part.intra_ms, collectives=part.collectives)
        spec = option.spec
        device = "cpu" if option.place == "host" else self.device_type
        compute = self.compute
        timing = Timing(lambda n: compute.encode_ms(spec, device, n),
                        lambda n: compute.decode_ms(spec, device, n),
                        lambda n, payloads: compute.aggregate_ms(spec, device, n, payloads),
                        lambda n: compute.advance_ms(spec, device, n))
        part = pricing.compressed(self, scheme, _compressor(spec), spec, timing, numel, shapes,
                                  option.place)
        host = option.place == "host"
        copies = numel * self.element_size
        return GroupCost(part.encode_ms, part.channel_ms, part.decode_ms, host,
                         compute.copy_ms("d2h", copies) if host else 0.0,
                         compute.copy_ms("h2d", copies) if host else 0.0, part.wire_bytes,
                         part.intra_ms, compute_ms=part.compute_ms,
                         collectives=part.collectives)
