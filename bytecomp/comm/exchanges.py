"""Staged exchanges: the work of one tensor's average over the ranks, in three stages.

Each collective scheme (:mod:`bytecomp.comm.schemes`) builds one of these for a
tensor. An exchange has three stages, ``encode`` (compression), ``communicate``
(every collective, with the work the scheme does between them) and ``decode``
(decompression and averaging), so that the executor can run compression on the
hook's thread or on host workers and the collectives on its FIFO communication
thread (:class:`bytecomp.comm.worker.CommWorker`). Every exchange returns the mean
over all ranks, identical on every rank, with the input's shape and dtype; the
input may be overwritten.

The functions at the end lay out the error-feedback residuals a scheme's stages
keep, as one flat tensor in this rank's own units (:func:`placed`).
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
from bytecomp.comm.rounds import GATHER, native_rounds  # noqa: F401 (GATHER: as before)
from bytecomp.comm.topology import Topology
from bytecomp.compress.base import Compressor, Peers

SERVER_SALT = 1_000_003  # same on every rank, so stage-two contexts agree
INTER_SALT = 2_000_003  # the two-level scheme's inter-node stage, same on every node


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
    order. ``sent_bytes`` counts what this rank handed to collectives. The base class
    is the exchange of an empty tensor: nothing to do."""

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


class FlatExchange(Exchange):
    """One-stage exchange over ``group`` in the given ``rounds``: the compressor's own
    (``None``, the default) or one allgather of its payload (:data:`GATHER`)."""

    def __init__(self, x, compressor: Compressor, state: dict, group,
                 rounds: tuple[str, ...] | None = None, peers: Peers | None = None):
        super().__init__(x)
        self.shape, self.flat = x.shape, x.reshape(-1)
        self.compressor, self.state, self.group = compressor, state, group
        self.peers = peers or peers_of(group)
        self.rounds = rounds or compressor.collectives_of_rounds()

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
        """Issue the single collective now (the exchange must be one: see
        :meth:`bytecomp.comm.schemes.Scheme.one_collective`); the future completes when
        it is done."""
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


def padded(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``x`` flat, zero-padded to a multiple of ``multiple`` elements."""
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
        self.chunks = padded(self.x, size).view(size, -1)
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
    Compression happens between collectives, so all of it runs in ``communicate``.
    ``intra_dtype`` (float16 or bfloat16): the intra-node stages run in it, the sum
    of the reduce-scatter on values already divided by the ranks per node."""

    def __init__(self, x, compressor: Compressor, state: dict, topology: Topology,
                 intra_dtype: torch.dtype | None = None):
        super().__init__(x)
        self.compressor, self.state, self.topology = compressor, state, topology
        self.wire = intra_dtype or x.dtype

    def communicate(self) -> None:
        topology, x = self.topology, self.x
        k = topology.ranks_per_node
        whole = padded(x, k)
        if k > 1:
            chunk = self._reduce_scatter(whole, k)
        else:
            chunk = whole
        if topology.nodes > 1:
            inner = FlatExchange(chunk, self.compressor, self.state, topology.inter,
                                 native_rounds(self.compressor))
            chunk = inner.run()
            self.sent_bytes += inner.sent_bytes
        if k > 1:
            sent = chunk.to(self.wire).contiguous()
            gathered = torch.empty(whole.numel(), dtype=self.wire, device=x.device)
            self.sent_bytes += sent.numel() * sent.element_size()
            all_gather_flat(gathered, sent, group=topology.intra)
            out = gathered.to(x.dtype)
        else:
            out = chunk
        self.out = out[: x.numel()].view(x.shape)

    def _reduce_scatter(self, whole: torch.Tensor, k: int) -> torch.Tensor:
        """This rank's chunk of the node's mean."""
        intra = self.topology.intra
        if self.wire == whole.dtype:
            chunk = torch.empty(whole.numel() // k, dtype=whole.dtype, device=whole.device)
            self.sent_bytes += whole.numel() * whole.element_size()
            reduce_scatter_flat(chunk, whole, group=intra)
            return chunk.div_(k)
        sent = (whole / k).to(self.wire)  # divided first: a 16-bit sum cannot overflow
        chunk = torch.empty(whole.numel() // k, dtype=self.wire, device=whole.device)
        self.sent_bytes += sent.numel() * sent.element_size()
        reduce_scatter_flat(chunk, sent, group=intra)
        return chunk.to(whole.dtype)

    def decode(self, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.out if out is None else out.copy_(self.out.reshape(out.shape))


class TwoLevelExchange(Exchange):
    """Espresso's two-level exchange: two-shot inside the node, with an inter-node
    exchange of each local rank's chunk between its two stages. States: ``chunks``
    (this rank's compression of each of its chunks), ``inter`` (the inter-node stage)
    and ``server`` (the re-compression of the world's mean of this rank's chunk)."""

    def __init__(self, x, compressor: Compressor, state: dict, topology: Topology):
        super().__init__(x)
        self.compressor, self.state, self.topology = compressor, state, topology
        self.peers = Peers(topology.local_rank, topology.ranks_per_node)

    def encode(self) -> None:
        k = self.topology.ranks_per_node
        self.chunks = padded(self.x, k).view(k, -1)
        meter = {"meter": True} if self.state.get("meter") else {}
        chunk_states = self.state.setdefault("chunks", [{"salt": j, **meter} for j in range(k)])
        self.compressed = [self.compressor.compress(self.chunks[j], chunk_states[j], self.peers)
                           for j in range(k)]

    def communicate(self) -> None:
        compressor, topology = self.compressor, self.topology
        intra = topology.intra
        assert intra is not None  # Topology.build gives every rank its node's group
        outgoing = [payload for payload, _ in self.compressed]
        self.sent_bytes += sum(_nbytes(p) for p in outgoing)
        received = alltoall_payloads(outgoing, intra, compressor.fixed_size)
        mean = mean_of_decompressed(compressor, received,
                                    self.compressed[topology.local_rank][1], self.chunks[0])
        if topology.nodes > 1:
            inter_state = self.state.setdefault("inter", {"salt": INTER_SALT})
            inner = FlatExchange(mean, compressor, inter_state, topology.inter,
                                 native_rounds(compressor))
            mean = inner.run()
            self.sent_bytes += inner.sent_bytes
        server_state = self.state.setdefault("server", {"salt": SERVER_SALT})
        payload, self.ctx = compressor.compress(mean.reshape(-1), server_state, self.peers)
        self.sent_bytes += _nbytes(payload)
        self.gathered = allgather_payloads(payload, intra, compressor.fixed_size)

    def decode(self, out: torch.Tensor | None = None) -> torch.Tensor:
        full = torch.cat([self.compressor.decompress(p, self.ctx) for p in self.gathered])
        result = full[: self.x.numel()].view(self.x.shape)
        return result if out is None else out.copy_(result.reshape(out.shape))


# -- error-feedback residuals, laid out ------------------------------------------------


def chunk_residuals(state: dict) -> list[tuple[int, torch.Tensor | None, int]]:
    """``(chunk, residual, 1)`` for every chunk's state (two-shot, two-level), taken."""
    return [(j, chunk.pop("residual", None), 1) for j, chunk in enumerate(state.get("chunks")
                                                                          or [])]


def stage_residual(state: dict, stage: str) -> torch.Tensor | None:
    """The residual a stage's state (``server``, ``inter``) keeps, taken."""
    return (state.get(stage) or {}).pop("residual", None)


def placed(pieces: list[tuple[int, torch.Tensor | None, int]], width: int, chunks: int,
           numel: int) -> torch.Tensor | None:
    """``(chunk index, residual, scale)`` pieces laid out in a flat tensor of ``chunks``
    chunks of ``width``, cut to ``numel`` (None: no piece had a residual)."""
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
