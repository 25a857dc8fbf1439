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

Every exchange returns the mean over all ranks, identical on every rank, with
the input's shape and dtype; the input may be overwritten. An exchange has
three stages (encode, communicate, decode) so that the executor can run
compression on the hook's thread or on host workers and the collectives on its
FIFO communication thread (:class:`bytecomp.comm.worker.CommWorker`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bytecomp.comm.collectives import (
    allgather_fixed_async,
    allgather_payloads,
    allreduce_average,
    allreduce_mean_,
    alltoall_payloads,
)
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


def mean_of_decompressed(compressor: Compressor, payloads, ctx, like: torch.Tensor,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of every rank's decompressed payload, summed in rank order in float32, into
    ``out`` (a new tensor shaped like ``like`` by default)."""
    if out is None:
        out = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
    return compressor.aggregate_into(payloads, ctx, out.reshape(-1))


class Exchange:
    """One tensor's exchange in three stages, which may run on different threads:
    ``encode`` (compression), ``communicate`` (every collective, with the work the
    scheme does between them) and ``decode`` (decompression and averaging), in that
    order. ``sent_bytes`` counts what this rank handed to collectives."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.sent_bytes = 0

    def encode(self) -> None:
        pass

    def communicate(self) -> None:
        pass

    def decode(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The averaged tensor; written into ``out`` when given (which may be the input)."""
        if out is None or out.data_ptr() == self.x.data_ptr():
            return self.x if out is None else out
        return out.copy_(self.x.reshape(out.shape))

    def run(self) -> torch.Tensor:
        self.encode()
        self.communicate()
        return self.decode()


def _nbytes(payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload)


def one_collective(compressor: Compressor, scheme: str) -> bool:
    """True when the flat exchange is a single collective (see
    :meth:`FlatExchange.communicate_async`): one allreduce round, or one allgather of a
    fixed-size payload."""
    if scheme == "allreduce":
        return compressor.collectives_of_rounds() == ("allreduce",)
    return scheme == "allgather" and compressor.rounds == 1 and compressor.fixed_size


class FlatExchange(Exchange):
    """One-stage exchange over ``group``: the native rounds, or an allgather."""

    def __init__(self, x, compressor: Compressor, state: dict, group, scheme: str = "allreduce",
                 peers: Peers | None = None):
        super().__init__(x)
        self.shape, self.flat = x.shape, x.reshape(-1)
        self.compressor, self.state, self.group = compressor, state, group
        self.peers = peers or peers_of(group)
        self.rounds = compressor.collectives_of_rounds() if scheme == "allreduce" \
            else ("allgather",)

    def encode(self) -> None:
        self.payload, self.ctx = self.compressor.compress(self.flat, self.state, self.peers)

    def communicate(self) -> None:
        payload = self.payload
        result: Any = None
        for number, collective in enumerate(self.rounds):
            self.sent_bytes += _nbytes(payload)
            if collective == "allreduce":
                result = allreduce_mean_(payload, self.group)
            else:
                result = allgather_payloads(payload, self.group, self.compressor.fixed_size)
            if number + 1 < len(self.rounds):
                payload, self.ctx = self.compressor.advance(result, self.ctx, self.state,
                                                            self.peers)
        self.result: Any = result

    def communicate_async(self) -> torch.futures.Future:
        """Issue the single collective now; the future completes when it is done."""
        payload = self.payload
        self.sent_bytes += _nbytes(payload)
        size = dist.get_world_size(self.group)
        if size == 1:
            self.result = payload if self.rounds[0] == "allreduce" else [payload]
            done: torch.futures.Future = torch.futures.Future()
            done.set_result([])  # nothing to wait for: _finish iterates the value
            return done
        works: list = []
        self.divide_after: list[torch.Tensor] = []
        if self.rounds[0] == "allreduce":
            for tensor in payload:
                work, divide_after = allreduce_average(tensor, self.group, async_op=True)
                works.append(work)
                if divide_after:
                    self.divide_after.append(tensor)
            self.result = payload
        else:
            gathered, finish = allgather_fixed_async(payload, self.group)
            works.append(gathered)
            self.result = finish
        if len(works) == 1:
            return works[0].get_future()
        return torch.futures.collect_all([w.get_future() for w in works])

    def decode(self, out: torch.Tensor | None = None) -> torch.Tensor:
        if callable(self.result):  # an asynchronous allgather: unpack now
            self.result = self.result()
        for tensor in getattr(self, "divide_after", ()):  # an asynchronous allreduce's sum
            tensor.div_(self.peers.size)
        self.divide_after = []
        if self.rounds[-1] == "allreduce":
            if out is None:
                return self.compressor.decompress(self.result, self.ctx).reshape(self.shape)
            return self.compressor.decompress_into(self.result, self.ctx, out.reshape(-1))
        result = mean_of_decompressed(self.compressor, self.result, self.ctx, self.flat, out)
        return result.reshape(self.shape) if out is None else out


def _padded(x: torch.Tensor, multiple: int) -> torch.Tensor:
    flat_x = x.reshape(-1)
    padding = (-flat_x.numel()) % multiple
    return F.pad(flat_x, (0, padding)) if padding else flat_x


class TwoShotExchange(Exchange):
    """Alltoall + allgather: each rank averages and re-compresses one chunk."""

    def __init__(self, x, compressor: Compressor, state: dict, group):
        super().__init__(x)
        self.compressor, self.state, self.group = compressor, state, group
        self.peers = peers_of(group)

    def encode(self) -> None:
        size = self.peers.size
        self.chunks = _padded(self.x, size).view(size, -1)
        meter = {"meter": True} if self.state.get("meter") else {}
        chunk_states = self.state.setdefault("chunks", [{"salt": j, **meter}
                                                        for j in range(size)])
        self.compressed = [self.compressor.compress(self.chunks[j], chunk_states[j], self.peers)
                           for j in range(size)]

    def communicate(self) -> None:
        compressor, peers = self.compressor, self.peers
        outgoing = [payload for payload, _ in self.compressed]
        self.sent_bytes += sum(_nbytes(p) for p in outgoing)
        received = alltoall_payloads(outgoing, self.group, compressor.fixed_size)
        own_chunk = mean_of_decompressed(compressor, received, self.compressed[peers.rank][1],
                                         self.chunks[0])
        server_state = self.state.setdefault("server", {"salt": SERVER_SALT})
        payload, self.ctx = compressor.compress(own_chunk, server_state, peers)
        self.sent_bytes += _nbytes(payload)
        self.gathered = allgather_payloads(payload, self.group, compressor.fixed_size)

    def decode(self, out: torch.Tensor | None = None) -> torch.Tensor:
        full = torch.cat([self.compressor.decompress(p, self.ctx) for p in self.gathered])
        result = full[: self.x.numel()].view(self.x.shape)
        return result if out is None else out.copy_(result.reshape(out.shape))


class HierarchicalExchange(Exchange):
    """Intra-node reduce-scatter, inter-node compressed exchange, intra-node allgather.
    Compression happens between collectives, so all of it runs in ``communicate``."""

    def __init__(self, x, compressor: Compressor, state: dict, topology: Topology):
        super().__init__(x)
        self.compressor, self.state, self.topology = compressor, state, topology

    def communicate(self) -> None:
        topology, x = self.topology, self.x
        k = topology.ranks_per_node
        padded = _padded(x, k)
        if k > 1:
            chunk = torch.empty(padded.numel() // k, dtype=x.dtype, device=x.device)
            self.sent_bytes += padded.numel() * padded.element_size()
            reduce_scatter_flat(chunk, padded, group=topology.intra)
            chunk.div_(k)
        else:
            chunk = padded
        if topology.nodes > 1:
            native = "allreduce" if "allreduce" in supported_schemes(self.compressor) \
                else "allgather"
            inner = FlatExchange(chunk, self.compressor, self.state, topology.inter, native)
            chunk = inner.run()
            self.sent_bytes += inner.sent_bytes
        if k > 1:
            out = torch.empty_like(padded)
            self.sent_bytes += chunk.numel() * chunk.element_size()
            all_gather_flat(out, chunk.contiguous(), group=topology.intra)
        else:
            out = chunk
        self.out = out[: x.numel()].view(x.shape)

    def decode(self, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.out if out is None else out.copy_(self.out.reshape(out.shape))


def take_residuals(state: dict, scheme: str, numel: int, topology: Topology
                   ) -> torch.Tensor | None:
    """Remove the error-feedback residuals of a tensor's exchange from ``state`` and
    return them as one flat tensor of ``numel`` elements in this rank's own units:
    added to this rank's next gradient, they reach the average as they would have
    through the residuals (None: there were none).

    ``allreduce``/``allgather`` keep one residual of the whole tensor; ``twoshot``
    one per chunk and, for the chunk this rank re-compresses, a "server" residual of
    the average (so it counts ``world`` times); ``hierarchical`` one of this rank's
    chunk of the node's average (so it counts ``ranks_per_node`` times)."""
    if scheme in ("allreduce", "allgather"):
        return state.pop("residual", None)
    if scheme == "twoshot":
        size = topology.size
        pieces = [(j, chunk.pop("residual", None), 1)
                  for j, chunk in enumerate(state.get("chunks") or [])]
        pieces.append((topology.rank, (state.get("server") or {}).pop("residual", None), size))
        return _placed(pieces, -(-numel // size), size, numel)
    residual = state.pop("residual", None)  # hierarchical: this rank's chunk
    k = topology.ranks_per_node
    width = residual.numel() if residual is not None else 0
    return _placed([(topology.local_rank, residual, k)], width, k, numel)


def _placed(pieces: list[tuple[int, torch.Tensor | None, int]], width: int, chunks: int,
            numel: int) -> torch.Tensor | None:
    """``(chunk index, residual, scale)`` pieces laid out in a flat tensor of ``chunks``
    chunks of ``width``, cut to ``numel``."""
    present = [piece for piece in pieces if piece[1] is not None]
    if not present:
        return None
    like = present[0][1]
    assert like is not None
    out = torch.zeros(width * chunks, dtype=like.dtype, device=like.device)
    for index, residual, scale in present:
        assert residual is not None
        out[index * width:(index + 1) * width] += residual * scale
    return out[:numel]


def make_exchange(x: torch.Tensor, compressor: Compressor, state: dict, topology: Topology,
                  scheme: str = "allreduce") -> Exchange:
    """The staged exchange of ``x`` with ``compressor`` on ``scheme`` (the input may be
    overwritten; the result is the mean over all ranks, identical on every rank)."""
    check_scheme(compressor, scheme)
    if x.numel() == 0:
        return Exchange(x)
    if scheme == "twoshot":
        return TwoShotExchange(x, compressor, state, topology.world)
    if scheme == "hierarchical":
        return HierarchicalExchange(x, compressor, state, topology)
    return FlatExchange(x, compressor, state, topology.world, scheme)


def exchange(x: torch.Tensor, compressor: Compressor, state: dict, topology: Topology,
             scheme: str = "allreduce") -> torch.Tensor:
    """Average ``x`` over all ranks with ``compressor`` on ``scheme`` (synchronous)."""
    return make_exchange(x, compressor, state, topology, scheme).run()
