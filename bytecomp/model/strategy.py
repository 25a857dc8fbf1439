"""What one strategy costs for one group of tensors: the timeline's inputs.

A strategy (an :class:`Option`) is: no compression, or a compressor spec with
where it encodes and decodes (``device``: on the compute stream, ``host``: on
a CPU worker, with copies on GPUs) and a collective scheme. Its cost for a
merged group of ``numel`` elements has three parts:

* ``encode_ms``: on the compute stream (device) or a host worker (host);
* ``channel_ms``: on the communication channel, in FIFO order: every
  collective of the scheme plus the compute the scheme does between them
  (two-shot's re-compression, for example);
* ``decode_ms``: like encode;
* the executor's fixed costs of the group's path (:mod:`bytecomp.model.overheads`):
  ``hook_ms`` on the compute stream before the encode, ``tail_ms`` on the channel
  after the collectives, charged when the plan runs through the hook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

from bytecomp.compress import from_spec
from bytecomp.model.costs import CommModel, ComputeModel, wire_dtype
from bytecomp.model.overheads import ExecutorCosts, path_of
from bytecomp.plan import NO_COMPRESSION, Option

__all__ = ["COUNT_BYTES", "NO_COMPRESSION", "GroupCost", "Option", "StrategyCosts"]

COUNT_BYTES = 8  # one int64 element count per payload tensor, for variable sizes


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
        self.gathers = "d2d" in compute.copies  # the profile measured memory copies

    # -- collectives ---------------------------------------------------------------
    def _collective(self, name: str, group: str, dtype: str, nbytes: float) -> float:
        return self.comm.time_ms(name, group, dtype, nbytes)

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
        if collective == "hierarchical":
            per_node = self.comm.ranks("intra")
            return (self.intra_node_ms(nbytes)
                    + self._collective("allreduce", "inter", "float32", nbytes / per_node))
        return self._collective("allreduce", "world", "float32", nbytes)

    def intra_node_ms(self, nbytes: float) -> float:
        """The hierarchical scheme's intra-node steps: reduce-scatter and allgather."""
        return (self._collective("reduce_scatter", "intra", "float32", nbytes)
                + self._collective("allgather", "intra", "float32", nbytes))

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
        elif cost.host and self.device_type != "cpu":
            out = replace(cost, copy_in_ms=cost.copy_in_ms + copy)
        else:
            out = replace(cost, encode_ms=cost.encode_ms + copy, decode_ms=cost.decode_ms + copy)
        self._gathered[key] = (cost, out)  # keeps cost alive, so its id stays its own
        return out

    def cost(self, option: Option, numel: int, shapes: tuple | None = None) -> GroupCost:
        key = (option, numel, shapes)
        cost = self._cache.get(key)
        if cost is None:
            path = path_of(option)
            cost = self._cache[key] = replace(self._cost(option, numel, shapes),
                                              hook_ms=self.executor.hook_ms[path],
                                              tail_ms=self.executor.tail_ms[path])
        return cost

    def _cost(self, option: Option, numel: int, shapes) -> GroupCost:
        if not option.compressed:
            channel = self.uncompressed_ms(option.collective, numel)
            intra = self.intra_node_ms(numel * self.element_size) \
                if option.collective == "hierarchical" else 0.0
            return GroupCost(0.0, channel, 0.0, wire_bytes=numel * self.element_size,
                             intra_ms=intra)
        spec = option.spec
        device = "cpu" if option.place == "host" else self.device_type
        compressor = _compressor(spec)

        def encode(n):
            return self.compute.encode_ms(spec, device, n)

        def decode(n):
            return self.compute.decode_ms(spec, device, n)

        world = self.comm.ranks("world")
        scheme = option.collective
        intra = 0.0
        if scheme in ("allreduce", "allgather"):
            encode_ms = encode(numel)
            channel = self.exchange_ms(spec, numel, "world", scheme, shapes)
            gathers = scheme == "allgather" or compressor.collectives_of_rounds()[-1] == "allgather"
            decode_ms = decode(numel) * (world if gathers else 1)
            wire = sum(self._payload(spec, numel, shapes))
        elif scheme == "twoshot":
            chunk = math.ceil(numel / world)
            payload = sum(self._payload(spec, chunk, None))
            encode_ms = world * encode(chunk)
            channel = (self._collective("alltoall", "world", "uint8", world * payload)
                       + world * decode(chunk) + encode(chunk)
                       + self._gather("world", world, payload, True, 0))
            if not compressor.fixed_size:
                counts = world * COUNT_BYTES * 2
                channel += (self._collective("alltoall", "world", "uint8", counts)
                            + self._collective("allgather", "world", "uint8", counts))
            decode_ms = world * decode(chunk)
            wire = 2 * world * payload
        else:  # hierarchical
            per_node = self.comm.ranks("intra")
            nodes = self.comm.ranks("inter")
            chunk = math.ceil(numel / per_node)
            native = "allreduce" if compressor.collectives_of_rounds()[-1] == "allreduce" \
                else "allgather"
            nbytes = numel * self.element_size
            intra = self.intra_node_ms(nbytes)
            channel = intra + self.exchange_ms(spec, chunk, "inter", native)
            encode_ms = encode(chunk)
            decode_ms = decode(chunk) * (nodes if native == "allgather" else 1)
            wire = 2 * nbytes + sum(self._payload(spec, chunk, None))
        host = option.place == "host"
        copies = numel * self.element_size
        return GroupCost(encode_ms, channel, decode_ms, host,
                         self.compute.copy_ms("d2h", copies) if host else 0.0,
                         self.compute.copy_ms("h2d", copies) if host else 0.0, wire, intra)
