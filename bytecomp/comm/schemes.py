"""Collective schemes: how a compressed tensor is averaged over the ranks.

* ``allreduce``: the compressor's native rounds (summable payloads are averaged
  in place; PowerSGD's two rounds; ExDyna's gather-then-reduce).
* ``allgather``: every rank's payload is gathered and decompressed (any
  gatherable single-round compressor).
* ``twoshot``: alltoall + allgather for chunkable compressors: rank j receives
  chunk j of every rank, averages it, re-compresses it (with its own "server"
  state, so error feedback applies to both stages) and it is gathered.
* ``hierarchical``: intra-node reduce-scatter uncompressed, inter-node exchange of
  each rank's chunk with the compressor, intra-node allgather uncompressed.

Every function returns the mean over all ranks, identical on every rank, with
the input's shape and dtype; the input may be overwritten. They are synchronous:
:class:`bytecomp.comm.worker.CommWorker` runs them in the background.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bytecomp.comm.collectives import allgather_payloads, allreduce_mean_, alltoall_payloads
from bytecomp.comm.compat import all_gather_flat, reduce_scatter_flat
from bytecomp.comm.topology import Topology
from bytecomp.compress.base import Compressor, Peers

SCHEMES = ("allreduce", "allgather", "twoshot", "hierarchical")
SERVER_SALT = 1_000_003  # same on every rank, so stage-two contexts agree


def supported_schemes(compressor: Compressor) -> list[str]:
    """The schemes ``compressor`` can run on."""
    schemes = []
    if compressor.collectives_of_rounds()[-1] == "allreduce":
        schemes.append("allreduce")
    if compressor.gatherable and compressor.rounds == 1:
        schemes.append("allgather")
        if compressor.chunkable:
            schemes.append("twoshot")
    schemes.append("hierarchical")
    return schemes


def check_scheme(compressor: Compressor, scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown collective scheme {scheme!r}; choose from {', '.join(SCHEMES)}")
    if scheme not in supported_schemes(compressor):
        raise ValueError(f"{compressor.spec} cannot run on {scheme}; it supports "
                         f"{', '.join(supported_schemes(compressor))}")


def peers_of(group: dist.ProcessGroup) -> Peers:
    return Peers(dist.get_rank(group), dist.get_world_size(group))


def mean_of_decompressed(compressor: Compressor, payloads, ctx, like: torch.Tensor) -> torch.Tensor:
    """Mean of every rank's decompressed payload, summed in rank order in float32."""
    total = torch.zeros(like.numel(), dtype=torch.float32, device=like.device)
    for payload in payloads:
        total += compressor.decompress(payload, ctx).float()
    return total.div_(len(payloads)).to(like.dtype)


def flat(x: torch.Tensor, compressor: Compressor, state: dict, group: dist.ProcessGroup,
         scheme: str = "allreduce") -> torch.Tensor:
    """One-stage exchange over ``group``: the native rounds, or an allgather."""
    peers = peers_of(group)
    shape, x = x.shape, x.reshape(-1)
    payload, ctx = compressor.compress(x, state, peers)
    rounds = compressor.collectives_of_rounds() if scheme == "allreduce" else ("allgather",)
    for number, collective in enumerate(rounds):
        if collective == "allreduce":
            result = allreduce_mean_(payload, group)
        else:
            result = allgather_payloads(payload, group, compressor.fixed_size)
        if number + 1 < len(rounds):
            payload, ctx = compressor.advance(result, ctx, state, peers)
    if rounds[-1] == "allreduce":
        return compressor.decompress(result, ctx).reshape(shape)
    return mean_of_decompressed(compressor, result, ctx, x).reshape(shape)


def _padded(x: torch.Tensor, multiple: int) -> torch.Tensor:
    flat_x = x.reshape(-1)
    padding = (-flat_x.numel()) % multiple
    return F.pad(flat_x, (0, padding)) if padding else flat_x


def two_shot(x: torch.Tensor, compressor: Compressor, state: dict,
             group: dist.ProcessGroup) -> torch.Tensor:
    """Alltoall + allgather: each rank averages and re-compresses one chunk."""
    peers = peers_of(group)
    chunks = _padded(x, peers.size).view(peers.size, -1)
    chunk_states = state.setdefault("chunks", [{"salt": j} for j in range(peers.size)])
    compressed = [compressor.compress(chunks[j], chunk_states[j], peers) for j in range(peers.size)]
    received = alltoall_payloads([p for p, _ in compressed], group, compressor.fixed_size)
    own_chunk = mean_of_decompressed(compressor, received, compressed[peers.rank][1], chunks[0])
    server_state = state.setdefault("server", {"salt": SERVER_SALT})
    payload, ctx = compressor.compress(own_chunk, server_state, peers)
    gathered = allgather_payloads(payload, group, compressor.fixed_size)
    out = torch.cat([compressor.decompress(p, ctx) for p in gathered])
    return out[: x.numel()].view(x.shape)


def hierarchical(x: torch.Tensor, compressor: Compressor, state: dict,
                 topology: Topology) -> torch.Tensor:
    """Intra-node reduce-scatter, inter-node compressed exchange, intra-node allgather."""
    k = topology.ranks_per_node
    padded = _padded(x, k)
    if k > 1:
        chunk = torch.empty(padded.numel() // k, dtype=x.dtype, device=x.device)
        reduce_scatter_flat(chunk, padded, group=topology.intra)
        chunk.div_(k)
    else:
        chunk = padded
    if topology.nodes > 1:
        native = "allreduce" if "allreduce" in supported_schemes(compressor) else "allgather"
        chunk = flat(chunk, compressor, state, topology.inter, native)
    if k > 1:
        out = torch.empty_like(padded)
        all_gather_flat(out, chunk.contiguous(), group=topology.intra)
    else:
        out = chunk
    return out[: x.numel()].view(x.shape)


def exchange(x: torch.Tensor, compressor: Compressor, state: dict, topology: Topology,
             scheme: str = "allreduce") -> torch.Tensor:
    """Average ``x`` over all ranks with ``compressor`` on ``scheme`` (synchronous)."""
    check_scheme(compressor, scheme)
    if x.numel() == 0:
        return x
    if scheme == "twoshot":
        return two_shot(x, compressor, state, topology.world)
    if scheme == "hierarchical":
        return hierarchical(x, compressor, state, topology)
    return flat(x, compressor, state, topology.world, scheme)
