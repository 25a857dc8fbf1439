"""Single-process references of the collective schemes.

Every virtual rank's compressor calls are made here in memory, step by step,
with plain tensor arithmetic in place of collectives: the result a real
multi-rank run must reproduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bytecomp.comm.exchanges import INTER_SALT, SERVER_SALT
from bytecomp.comm.schemes import SCHEMES, Hierarchical
from bytecomp.compress.base import Peers

# The hierarchical schemes, with their intra-node stages' dtype (None: the tensor's own).
HIERARCHICAL = {name: getattr(torch, scheme.intra_dtype) if scheme.intra_dtype else None
                for name, scheme in SCHEMES.items() if isinstance(scheme, Hierarchical)}


def rank_order_mean(compressor, payloads, ctx, like):
    total = torch.zeros(like.numel(), dtype=torch.float32)
    for payload in payloads:
        total += compressor.decompress(payload, ctx).float()
    return (total / len(payloads)).to(like.dtype)


def flat(compressor, xs, states, scheme="allreduce"):
    """What every rank gets from the flat scheme, given every rank's input."""
    size = len(xs)
    out = [compressor.compress(xs[r].clone(), states[r], Peers(r, size)) for r in range(size)]
    rounds = compressor.collectives_of_rounds() if scheme == "allreduce" else ("allgather",)
    for number, collective in enumerate(rounds):
        payloads = [payload for payload, _ in out]
        if collective == "allreduce":
            for tensors in zip(*payloads):
                mean = torch.stack([t.float() for t in tensors]).mean(0)
                for t in tensors:  # in place, as the real allreduce does
                    t.copy_(mean.to(t.dtype))
            results = payloads
        else:
            results = [payloads] * size
        if number + 1 < len(rounds):
            out = [compressor.advance(results[r], out[r][1], states[r], Peers(r, size))
                   for r in range(size)]
    if rounds[-1] == "allreduce":
        return compressor.decompress(out[0][0], out[0][1])
    return rank_order_mean(compressor, payloads, out[0][1], xs[0])


def _chunks(x, parts):
    flat_x = x.reshape(-1)
    padding = (-flat_x.numel()) % parts
    return (F.pad(flat_x, (0, padding)) if padding else flat_x).view(parts, -1)


def two_shot(compressor, xs, states):
    size = len(xs)
    numel = xs[0].numel()
    chunks = [_chunks(x.clone(), size) for x in xs]
    for state in states:
        state.setdefault("chunks", [{"salt": j} for j in range(size)])
        state.setdefault("server", {"salt": SERVER_SALT})
    # stage 1: rank r compresses chunk j for rank j
    sent = [[compressor.compress(chunks[r][j], states[r]["chunks"][j], Peers(r, size))
             for j in range(size)] for r in range(size)]
    reduced = [rank_order_mean(compressor, [sent[r][j][0] for r in range(size)], sent[j][j][1],
                               chunks[0][0]) for j in range(size)]
    # stage 2: rank j re-compresses its chunk; everyone decompresses everyone's
    second = [compressor.compress(reduced[j], states[j]["server"], Peers(j, size))
              for j in range(size)]
    out = torch.cat([compressor.decompress(second[j][0], second[j][1]) for j in range(size)])
    return out[:numel]


def _native(compressor):
    return "allreduce" if compressor.collectives_of_rounds()[-1] == "allreduce" else "allgather"


def _node_mean(xs, node, ranks_per_node, wire):
    """The mean of a node's inputs, summed in ``wire`` (16 bits: divided first)."""
    members = [xs[node * ranks_per_node + l] for l in range(ranks_per_node)]
    if wire is None or ranks_per_node == 1:
        return torch.stack([x.float() for x in members]).mean(0).to(xs[0].dtype)
    parts = [(x / ranks_per_node).to(wire) for x in members]
    return torch.stack(parts).sum(0).to(xs[0].dtype)  # two 16-bit addends: exact either way


def hierarchical(compressor, xs, states, nodes, ranks_per_node, wire=None):
    """``states[node][local]`` is the inter-node state of that rank; ``wire``: the
    16-bit dtype of the intra-node stages (None: the inputs' own)."""
    numel = xs[0].numel()
    node_means = [_node_mean(xs, n, ranks_per_node, wire) for n in range(nodes)]
    node_chunks = [_chunks(m, ranks_per_node) for m in node_means]
    pieces = []
    for local in range(ranks_per_node):
        inputs = [node_chunks[n][local].clone() for n in range(nodes)]
        if nodes > 1:
            piece = flat(compressor, inputs, [states[n][local] for n in range(nodes)],
                         _native(compressor))
        else:
            piece = inputs[0]
        if wire is not None and ranks_per_node > 1:
            piece = piece.to(wire).to(xs[0].dtype)
        pieces.append(piece)
    return torch.cat(pieces)[:numel]


def two_level(compressor, xs, states, nodes, ranks_per_node):
    """Espresso's two-level scheme; ``states[rank]`` is that rank's state (its chunks',
    its inter-node stage's and its server's)."""
    numel, k = xs[0].numel(), ranks_per_node
    for state in states:
        state.setdefault("chunks", [{"salt": j} for j in range(k)])
        state.setdefault("inter", {"salt": INTER_SALT})
        state.setdefault("server", {"salt": SERVER_SALT})
    chunks = [_chunks(x.clone(), k) for x in xs]
    # intra-node stage: rank (n, l) compresses its chunk j for local rank j
    sent = [[compressor.compress(chunks[r][j], states[r]["chunks"][j], Peers(r % k, k))
             for j in range(k)] for r in range(len(xs))]
    node_means = [[rank_order_mean(compressor, [sent[n * k + l][j][0] for l in range(k)],
                                   sent[n * k + j][j][1], chunks[0][0])
                   for j in range(k)] for n in range(nodes)]
    pieces = []
    for j in range(k):
        inputs = [node_means[n][j] for n in range(nodes)]
        holders = [n * k + j for n in range(nodes)]  # local rank j of every node
        if nodes > 1:
            mean = flat(compressor, inputs, [states[r]["inter"] for r in holders],
                        _native(compressor))
        else:
            mean = inputs[0]
        second = [compressor.compress(mean.clone(), states[r]["server"], Peers(j, k))
                  for r in holders]
        pieces.append(compressor.decompress(second[0][0], second[0][1]))
    return torch.cat(pieces)[:numel]
