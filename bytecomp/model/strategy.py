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
* the executor's fixed costs of the group's path (:mod:`bytecomp.model.overheads`):
  ``hook_ms`` on the compute stream before the encode, ``tail_ms`` on the channel
  after the collectives, charged when the plan runs through the hook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from bytecomp.comm.schemes import HIERARCHICAL, native_scheme
from bytecomp.compress import from_spec
from bytecomp.model.costs import CommModel, ComputeModel, wire_dtype
from bytecomp.model.overheads import ExecutorCosts, path_of
from bytecomp.plan import NO_COMPRESSION, Option

__all__ = ["COUNT_BYTES", "NO_COMPRESSION", "GroupCost", "Option", "StrategyCosts"]

COUNT_BYTES = 8  # one int64 element count per payload tensor, for variable sizes
CASTS = {"hierarchical-fp16": "fp16", "hierarchical-bf16": "bf16"}  # the cast's compressor


def cast_specs(specs) -> dict[str, str]:
    """The profiled specs (of ``specs``) that time the 16-bit casts, by compressor name."""
    return {from_spec(spec).name: spec for spec in sorted(specs)
            if from_spec(spec).name in CASTS.values()}


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
    tail_ms: float = 0.0  # and on the channel after the collectives (model/overheads.py)
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

    # -- collectives ---------------------------------------------------------------
    def _collective(self, name: str, group: str, dtype: str, nbytes: float) -> float:
        """The comm model's time, memoized (the search and the bounds ask again and
        again for the same sizes)."""
        key = (name, group, dtype, nbytes)
        time = self._collectives.get(key)
        if time is None:
            time = self._collectives[key] = self.comm.time_ms(name, group, dtype, nbytes)
        return time

    def _gather(self, group: str, ranks: int, per_rank: float, fixed: bool, tensors: int) -> float:
        time = self._collective("allgather", group, "uint8", ranks * per_rank)
        if not fixed:
            time += self._collective("allgather", group, "uint8", ranks * COUNT_BYTES * tensors)
        return time

    def _payload(self, spec: str, numel: float, shapes) -> list[float]:
        key = (spec, numel, shapes)
        if key not in self._payloads:
            self._payloads[key] = self._round_payloads(spec, numel, shapes)
        return self._payloads[key]

    def _round_payloads(self, spec: str, numel: float, shapes) -> list[float]:
        compressor = _compressor(spec)
        if compressor.name == "threshold":  # data-dependent: what the profile measured
            measured = self.compute.measured_payload(spec, self.device_type, numel)
            return [measured]
        return [float(b) for b in compressor.round_payload_bytes(int(numel), self.element_size,
                                                                 list(shapes) if shapes else None)]

    def exchange_collectives(self, spec: str, group: str, scheme: str) -> int:
        """How many collectives the one-stage exchange over ``group`` issues."""
        compressor = _compressor(spec)
        if self.comm.ranks(group) <= 1:
            return 0
        gather = 1 if compressor.fixed_size else 2  # sizes first, unless fixed
        if scheme == "allgather":
            return gather
        return sum(1 if collective == "allreduce" else gather
                   for collective in compressor.collectives_of_rounds())

    def exchange_ms(self, spec: str, numel: float, group: str, scheme: str, shapes=None) -> float:
        """Channel time of the one-stage exchange of ``numel`` elements over ``group``."""
        compressor = _compressor(spec)
        ranks = self.comm.ranks(group)
        if ranks <= 1:
            return 0.0
        rounds = self._payload(spec, numel, shapes)
        if scheme == "allgather":
            return self._gather(group, ranks, sum(rounds), compressor.fixed_size, 2)
        time = 0.0
        for collective, nbytes in zip(compressor.collectives_of_rounds(), rounds):
            if collective == "allreduce":
                time += self._collective("allreduce", group, wire_dtype(spec), nbytes)
            else:
                time += self._gather(group, ranks, nbytes, compressor.fixed_size, 2)
        return time

    # -- whole strategies ------------------------------------------------------------
    def uncompressed_ms(self, collective: str, numel: float) -> float:
        nbytes = numel * self.element_size
        if collective in HIERARCHICAL:
            per_node = self.comm.ranks("intra")
            return (self.intra_node_ms(numel, collective, "device")
                    + self._collective("allreduce", "inter", "float32", nbytes / per_node))
        return self._collective("allreduce", "world", "float32", nbytes)

    def intra_node_ms(self, numel: float, scheme: str = "hierarchical",
                      place: str = "device") -> float:
        """A hierarchical scheme's intra-node stages: reduce-scatter and allgather, in
        16 bits with their casts (on the channel) for ``hierarchical-fp16``/``-bf16``."""
        return self.intra_collectives_ms(numel, scheme) + self.casts_ms(numel, scheme, place)

    def intra_collectives_ms(self, numel: float, scheme: str) -> float:
        sixteen = scheme in CASTS
        nbytes = numel * (2 if sixteen else self.element_size)
        dtype = "float16" if sixteen else "float32"
        return (self._collective("reduce_scatter", "intra", dtype, nbytes)
                + self._collective("allgather", "intra", dtype, nbytes))

    def casts_ms(self, numel: float, scheme: str, place: str) -> float:
        """The 16-bit intra-node stages' casts: the tensor to 16 bits and this rank's
        chunk back, then the chunk to 16 bits and the gathered tensor back."""
        if scheme not in CASTS or self.comm.ranks("intra") <= 1:
            return 0.0
        table = self.host_casts if place == "host" else self.casts
        spec = table.get(CASTS[scheme])
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
        if not option.compressed:
            channel = self.uncompressed_ms(option.collective, numel)
            intra = self.intra_collectives_ms(numel, option.collective) \
                if option.collective in HIERARCHICAL else 0.0
            count = 1 if option.collective not in HIERARCHICAL else \
                (2 if self.comm.ranks("intra") > 1 else 0) + (self.comm.ranks("inter") > 1)
            return GroupCost(0.0, channel, 0.0, wire_bytes=numel * self.element_size,
                             intra_ms=intra, collectives=count)
        spec = option.spec
        device = "cpu" if option.place == "host" else self.device_type
        compressor = _compressor(spec)

        def encode(n):
            return self.compute.encode_ms(spec, device, n)

        def decode(n):
            return self.compute.decode_ms(spec, device, n)

        def aggregate(n, payloads):  # decode and average every rank's payload
            return self.compute.aggregate_ms(spec, device, n, payloads)

        def advance(n):  # a multi-round encode's part between its collectives: channel work
            return self.compute.advance_ms(spec, device, n)

        world = self.comm.ranks("world")
        scheme = option.collective
        intra = compute = 0.0
        variable = 0 if compressor.fixed_size else 2  # the element counts' collectives
        if scheme in ("allreduce", "allgather"):
            compute = advance(numel)
            encode_ms = encode(numel) - compute
            channel = self.exchange_ms(spec, numel, "world", scheme, shapes) + compute
            count = self.exchange_collectives(spec, "world", scheme)
            gathers = scheme == "allgather" or compressor.collectives_of_rounds()[-1] == "allgather"
            decode_ms = aggregate(numel, world) if gathers else decode(numel)
            wire = sum(self._payload(spec, numel, shapes))
        elif scheme == "twoshot":
            chunk = math.ceil(numel / world)
            payload = sum(self._payload(spec, chunk, None))
            encode_ms = world * encode(chunk)
            compute = aggregate(chunk, world) + encode(chunk)
            channel = (self._collective("alltoall", "world", "uint8", world * payload)
                       + compute + self._gather("world", world, payload, True, 0))
            count = 2 + variable
            if not compressor.fixed_size:
                counts = world * COUNT_BYTES * 2
                channel += (self._collective("alltoall", "world", "uint8", counts)
                            + self._collective("allgather", "world", "uint8", counts))
            decode_ms = world * decode(chunk)
            wire = 2 * world * payload
        elif scheme == "twolevel":
            encode_ms, channel, decode_ms, wire, intra, compute, count = self._two_level(
                spec, numel, encode, decode, aggregate)
        else:  # the hierarchical schemes
            per_node = self.comm.ranks("intra")
            nodes = self.comm.ranks("inter")
            chunk = math.ceil(numel / per_node)
            native = native_scheme(compressor)
            intra = self.intra_collectives_ms(numel, scheme)
            between = advance(chunk)
            compute = self.casts_ms(numel, scheme, option.place) + between
            channel = intra + compute + self.exchange_ms(spec, chunk, "inter", native)
            count = (2 if per_node > 1 else 0) + self.exchange_collectives(spec, "inter", native)
            encode_ms = encode(chunk) - between
            decode_ms = aggregate(chunk, nodes) if native == "allgather" else decode(chunk)
            wire = 2 * numel * (2 if scheme in CASTS else self.element_size) \
                + sum(self._payload(spec, chunk, None))
        host = option.place == "host"
        copies = numel * self.element_size
        return GroupCost(encode_ms, channel, decode_ms, host,
                         self.compute.copy_ms("d2h", copies) if host else 0.0,
                         self.compute.copy_ms("h2d", copies) if host else 0.0, wire, intra,
                         compute_ms=compute, collectives=count)

    def _two_level(self, spec: str, numel: float, encode, decode, aggregate):
        """(encode, channel, decode, wire bytes, intra-node channel, the channel's compute,
        collectives) of the two-level scheme: every chunk encoded; on the channel an
        intra-node alltoall of the payloads, their average, the inter-node exchange of
        this rank's chunk (its encode, collectives and decodes), its re-encode and an
        intra-node allgather; every gathered chunk decoded."""
        compressor = _compressor(spec)
        per_node, nodes = self.comm.ranks("intra"), self.comm.ranks("inter")
        chunk = math.ceil(numel / per_node)
        payload = sum(self._payload(spec, chunk, None))
        intra = (self._collective("alltoall", "intra", "uint8", per_node * payload)
                 + self._gather("intra", per_node, payload, True, 0))
        if not compressor.fixed_size:
            counts = per_node * COUNT_BYTES * 2
            intra += (self._collective("alltoall", "intra", "uint8", counts)
                      + self._collective("allgather", "intra", "uint8", counts))
        compute = aggregate(chunk, per_node) + encode(chunk)
        count = (2 + (0 if compressor.fixed_size else 2)) if per_node > 1 else 0
        wire = (per_node + 1) * payload
        if nodes > 1:
            native = native_scheme(compressor)
            compute += encode(chunk) + (aggregate(chunk, nodes) if native == "allgather"
                                        else decode(chunk))
            inter = self.exchange_ms(spec, chunk, "inter", native)
            count += self.exchange_collectives(spec, "inter", native)
            wire += payload
        else:
            inter = 0.0
        channel = intra + compute + inter
        return (per_node * encode(chunk), channel, per_node * decode(chunk), wire, intra,
                compute, count)
