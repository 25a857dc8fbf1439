"""What a collective costs under NCCL, which picks an algorithm and a protocol per call.

NCCL prices every (algorithm, protocol) pair with a latency and a bandwidth and
runs the cheapest for the message size; this module follows the structure of
that tuning model (NCCL's ``src/graph/tuning.cc``, 2.18-2.21), with its
published constants:

* algorithms: **ring** (every collective) and **tree** (allreduce only: a
  double binary tree across nodes, a chain inside each node);
* protocols: **LL** (8-byte flag+data stores: the least latency, a quarter of
  the bandwidth), **LL128** (128-byte lines, 120 of data; only where the GPUs
  of a node are joined by NVLink) and **Simple** (full bandwidth, a chunk's
  latency per step);
* latency = a base per (algorithm, protocol) + a per-hop latency per hardware
  class (NVLink, PCIe, network) times the hops: a ring allreduce takes
  ``2(p-1)`` steps, of which ``2 x nodes`` cross the network, a ring
  allgather or reduce-scatter ``p-1`` (``nodes-1``), a tree allreduce
  ``2 ((ranks per node - 1) intra + floor(log2 nodes) inter)`` hops. Steps of a
  ring that spans nodes cost at least NCCL's network post overhead (1 us, 3 us
  with Simple);
* bandwidth: the bus bandwidth of the slowest link a ring crosses (a GPU's
  intra-node link, a node's network link shared by the groups that use it at
  once) scaled per protocol (LL 1/4, or 1/3 for a single-node allgather or
  reduce-scatter; LL128 0.92, 0.7 with one rank per node; tree 0.92, LL
  1/3.8, LL128 7/9 in one node or 120/128), then converted to algorithm
  bandwidth (ring ``p / steps``, tree 1/2); tree bandwidth is corrected for
  medium sizes by NCCL's table;
* time = latency + bytes / algorithm bandwidth, the cheapest pair wins.

Left out: CollNet and NVLS (they need SHARP switches), the per-channel caps
and the ring's latency "plateau" (they depend on channel counts and GPU
generation that a cluster config does not give), kernel launch and host
overheads (the executor's fixed costs are measured per profile). All-to-all
is NCCL's grouped send/receive, which its tuner does not price: here it costs
the Simple base and one hop, a network post per remote peer, and its bytes
over the busiest link (each GPU's intra-node share, each node's remote share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bytecomp.costs.clusters import Link

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("ring", "tree")
# Latencies in microseconds, per protocol (LL, LL128, Simple): NCCL's baseLat and hwLat.
BASE_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
HOP_US = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)},
}
NET_OVERHEAD_US = 1.0  # per network step of a ring (x3 with Simple): an Intel host's
# NCCL's treeCorrectionFactor: tree bandwidth x factor for messages of 64 B x 2^i.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}


@dataclass(frozen=True)
class Span:
    """Where a group's ranks sit: ``ranks`` over ``nodes`` (as many on each), the link
    between two ranks of a node and each node's network link, used by ``sharing``
    such groups at once (the hierarchical scheme's inter-node groups, one per local
    rank). ``nvlink``: the node's GPUs are joined by NVLink (NCCL enables LL128)."""

    ranks: int
    nodes: int
    intra: Link | None
    inter: Link | None
    sharing: int = 1
    nvlink: bool = False

    @property
    def per_node(self) -> int:
        return self.ranks // self.nodes


@dataclass(frozen=True)
class Choice:
    """The pair NCCL runs and its predicted time."""

    time_us: float
    algorithm: str
    protocol: str


def _gbytes_per_s(link: Link) -> float:
    return link.bandwidth_gbps / 8.0


def bus_bandwidth(span: Span) -> float:
    """GB/s of the slowest link a ring over ``span`` crosses."""
    limits = []
    if span.per_node > 1 and span.intra is not None:
        limits.append(_gbytes_per_s(span.intra))
    if span.nodes > 1 and span.inter is not None:
        limits.append(_gbytes_per_s(span.inter) / span.sharing)
    return min(limits) if limits else math.inf


def _steps(collective: str, span: Span) -> tuple[int, int]:
    """A ring's steps and how many of them cross the network."""
    p, nodes = span.ranks, span.nodes
    if collective == "allreduce":
        return 2 * (p - 1), min(2 * (p - 1), 2 * nodes) if nodes > 1 else 0
    if collective in ("allgather", "reduce_scatter"):
        return p - 1, nodes - 1
    return p, nodes if nodes > 1 else 0  # broadcast


def _intra_type(span: Span) -> str:
    return span.intra.type if span.intra is not None else "pcie"


def latency_us(collective: str, algorithm: str, protocol: str, span: Span) -> float:
    """NCCL's latency of one call (no bytes)."""
    index = PROTOCOLS.index(protocol)
    intra_hop = HOP_US[_intra_type(span)][algorithm][index]
    inter_hop = HOP_US["net"][algorithm][index]
    base = BASE_US[algorithm][index]
    if algorithm == "tree":
        return base + 2 * ((span.per_node - 1) * intra_hop +
                           int(math.log2(span.nodes)) * inter_hop)
    steps, network = _steps(collective, span)
    if span.nodes > 1:
        intra_hop = max(intra_hop, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
    return base + (steps - network) * intra_hop + network * inter_hop


def algorithm_bandwidth(collective: str, algorithm: str, protocol: str, span: Span) -> float:
    """GB/s of payload per rank, as NCCL's tuner models it (0: not available)."""
    bus = bus_bandwidth(span)
    if protocol == "LL128" and not span.nvlink:
        return 0.0
    if algorithm == "ring":
        if protocol == "LL":
            bus /= 4.0 if span.nodes > 1 or collective == "allreduce" else 3.0
        elif protocol == "LL128":
            bus *= 0.7 if span.per_node < 2 else 0.92
        steps, _ = _steps(collective, span)
        return bus * span.ranks / steps
    bus *= 0.92
    if protocol == "LL":
        bus /= 3.8
    elif protocol == "LL128":
        bus *= 7.0 / 9.0 if span.nodes == 1 else 120.0 / 128.0
    return bus * 0.5


def _tree_correction(protocol: str, nbytes: float) -> float:
    index = int(math.log2(max(1.0, nbytes / 64.0)))
    table = TREE_CORRECTION[protocol]
    return table[index] if index < len(table) else 1.0


def _pairs(collective: str, span: Span) -> list[tuple[str, str, float, float]]:
    """(algorithm, protocol, latency us, bandwidth GB/s) of every pair NCCL may run."""
    algorithms = ALGORITHMS if collective == "allreduce" else ("ring",)
    pairs = []
    for algorithm in algorithms:
        for protocol in PROTOCOLS:
            bandwidth = algorithm_bandwidth(collective, algorithm, protocol, span)
            if bandwidth > 0:
                pairs.append((algorithm, protocol,
                              latency_us(collective, algorithm, protocol, span), bandwidth))
    return pairs


_PAIRS: dict[tuple[str, Span], list[tuple[str, str, float, float]]] = {}


def choose(collective: str, span: Span, nbytes: float) -> Choice:
    """The cheapest (algorithm, protocol) for ``nbytes`` (the whole array, as
    nccl-tests counts it: the allgather's output, the reduce-scatter's input)."""
    key = (collective, span)
    pairs = _PAIRS.get(key)
    if pairs is None:
        pairs = _PAIRS[key] = _pairs(collective, span)
    best = Choice(math.inf, "ring", "Simple")
    for algorithm, protocol, latency, bandwidth in pairs:
        if algorithm == "tree":
            bandwidth *= _tree_correction(protocol, nbytes)
        time = latency + nbytes / (1000 * bandwidth)
        if time < best.time_us:
            best = Choice(time, algorithm, protocol)
    return best


def alltoall_us(span: Span, nbytes: float) -> float:
    """Grouped send/receive of ``nbytes`` per rank (its chunk for itself included)."""
    p, per_node = span.ranks, span.per_node
    if span.nodes > 1:
        hop = HOP_US["net"]["ring"][2] + NET_OVERHEAD_US * (p - per_node)
    else:
        hop = HOP_US[_intra_type(span)]["ring"][2]
    busiest = 0.0
    if per_node > 1 and span.intra is not None:
        busiest = nbytes * (per_node - 1) / p / (1000 * _gbytes_per_s(span.intra))
    if span.nodes > 1 and span.inter is not None:
        remote = per_node * nbytes * (p - per_node) / p
        busiest = max(busiest, remote / (1000 * _gbytes_per_s(span.inter) / span.sharing))
    return BASE_US["ring"][2] + hop + busiest


def nccl_ms(collective: str, span: Span, nbytes: float) -> float:
    """Milliseconds of ``collective`` over ``span`` (0 for a single rank)."""
    if span.ranks <= 1:
        return 0.0
    if collective == "alltoall":
        return alltoall_us(span, nbytes) / 1000.0
    return choose(collective, span, nbytes).time_us / 1000.0
