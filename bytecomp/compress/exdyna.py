"""ExDyna (CCGrid'24): exclusive dynamic partitions and an online threshold.

The flat gradient is cut into fine blocks (a multiple of 32 elements each),
grouped into as many contiguous partitions as there are ranks. At step ``t``
rank ``r`` selects only inside partition ``(t + r) mod N``, so selections never
overlap and their union has no duplicates. Exchange, two rounds:

1. allgather: every rank's selected indices;
2. allreduce: every rank's values at the union of those indices.

After round 1 every rank knows every partition's count, so all ranks apply the
same updates: a boundary moves one block from a partition that selected more
than 5% above the average to a neighbour that selected more than 5% below it,
and the shared threshold is scaled by ``1 + adjust`` when the union is larger
than ``density * numel`` and by ``1 - adjust`` when smaller.

Departure from the paper: the first threshold is not ``1 / (2 sqrt(k))`` (which
ignores the gradient's scale and can take hundreds of 0.5% steps to correct)
but the k-th largest magnitude of a random sample of the first gradient,
averaged over ranks in round 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bytecomp.compress.base import (
    FRACTION_LADDER,
    SOLO,
    Compressor,
    Param,
    Peers,
    count_of,
    index_bytes,
    index_dtype,
    meta_of,
    next_step,
    scatter_values,
    seeded_generator,
)
from bytecomp.compress.registry import register

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch

BLOCK_ALIGN = 32
SAMPLE_SIZE = 4096
IMBALANCE = 0.05


def block_layout(numel: int, blocks: int) -> tuple[int, int]:
    """Block size (a multiple of 32) and the number of blocks that cover ``numel``."""
    if numel == 0:
        return BLOCK_ALIGN, 0
    size = max(1, math.ceil(numel / blocks / BLOCK_ALIGN)) * BLOCK_ALIGN
    return size, math.ceil(numel / size)


def even_bounds(num_blocks: int, parts: int) -> list[int]:
    return [round(i * num_blocks / parts) for i in range(parts + 1)]


def rebalance(bounds: list[int], counts: list[int]) -> list[int]:
    """Move one block across each boundary whose two sides are unbalanced by >5%."""
    bounds = list(bounds)
    average = sum(counts) / max(len(counts), 1)
    if average == 0:
        return bounds
    high, low = (1 + IMBALANCE) * average, (1 - IMBALANCE) * average
    for i in range(len(counts) - 1):
        left_blocks = bounds[i + 1] - bounds[i]
        right_blocks = bounds[i + 2] - bounds[i + 1]
        if counts[i] > high and counts[i + 1] < low and left_blocks > 1:
            bounds[i + 1] -= 1
        elif counts[i + 1] > high and counts[i] < low and right_blocks > 1:
            bounds[i + 1] += 1
    return bounds


@register
class ExDyna(Compressor):
    """ExDyna sparsification: per-rank exclusive partitions, dynamic, online threshold."""

    name = "exdyna"
    summary = "ExDyna: exclusive rotating partitions, online threshold (2 rounds)"
    summable = True
    gatherable = False
    chunkable = False
    fixed_size = False
    default_ef = True
    round_collectives = ("allgather", "allreduce")
    payload_estimate = "target"  # the online threshold aims at the density
    ladder = ("density", FRACTION_LADDER)
    params = {
        "density": Param(float, 0.01, "0 < density <= 1", lambda v: 0 < v <= 1,
                         "target fraction of elements selected over all ranks"),
        "blocks": Param(int, 1024, "blocks >= 1", lambda v: v >= 1,
                        "number of fine blocks", primary=False),
        "adjust": Param(float, 0.005, "0 < adjust < 1", lambda v: 0 < v < 1,
                        "threshold scaling per step", primary=False),
        "seed": Param(int, 0, "seed >= 0", lambda v: v >= 0, "sampling seed", primary=False),
    }
    density: float
    blocks: int
    adjust: float
    seed: int

    def payload_bytes(self, numel, element_size=4, shapes=None):
        # Bound used by the planner: indices and values of the target count, plus
        # the 4-byte threshold proposal. Real sizes vary around it.
        selected = count_of(self.density, numel)
        return selected * (index_bytes(numel) + element_size) + 4

    def round_payload_bytes(self, numel, element_size=4, shapes=None):
        selected = count_of(self.density, numel)
        return [selected * index_bytes(numel) + 4, selected * element_size]

    def _layout(self, state: dict, numel: int, parts: int) -> tuple[int, list[int]]:
        block_size, num_blocks = block_layout(numel, self.blocks)
        if state.get("numel") != numel or len(state.get("bounds", ())) != parts + 1:
            state.update(numel=numel, bounds=even_bounds(num_blocks, parts), threshold=None)
        return block_size, state["bounds"]

    def _initial_threshold(self, magnitude: torch.Tensor, state: dict, peers: Peers, step: int):
        import torch

        generator = seeded_generator(magnitude.device, self.seed, state.get("salt", 0),
                                     peers.rank, step)
        size = min(magnitude.numel(), SAMPLE_SIZE)
        sample = magnitude[torch.randint(0, magnitude.numel(), (size,), generator=generator,
                                         device=magnitude.device)]
        return torch.topk(sample, count_of(self.density, size), sorted=False).values.min().float()

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        step = next_step(state)
        numel = x.numel()
        block_size, bounds = self._layout(state, numel, peers.size)
        magnitude = x.abs()
        threshold = state.get("threshold")
        if threshold is None:
            proposal = (self._initial_threshold(magnitude, state, peers, step) if numel
                        else torch.zeros((), device=x.device))
            threshold = proposal
        else:
            proposal = torch.tensor(threshold, device=x.device)
        part = (step + peers.rank) % peers.size
        start = min(bounds[part] * block_size, numel)
        stop = min(bounds[part + 1] * block_size, numel)
        local = torch.nonzero(magnitude[start:stop] >= threshold).reshape(-1) + start
        indices = local.to(index_dtype(numel))
        ctx = (meta_of(x), x, part)
        return [indices, proposal.reshape(1).float()], ctx

    def advance(self, result, ctx, state, peers: Peers = SOLO):
        import torch

        meta, x, _ = ctx
        step = state["step"] - 1
        indices = [payload[0] for payload in result]
        counts = [0] * peers.size
        for rank, rank_indices in enumerate(indices):
            counts[(step + rank) % peers.size] = rank_indices.numel()
        target = count_of(self.density, meta.numel)
        if state.get("threshold") is None:
            proposals = torch.cat([payload[1] for payload in result])
            state["threshold"] = proposals.mean().item()
        elif sum(counts) > target:
            state["threshold"] *= 1 + self.adjust
        elif sum(counts) < target:
            state["threshold"] *= 1 - self.adjust
        state["bounds"] = rebalance(state["bounds"], counts)
        state["last_counts"] = counts
        union = torch.cat(indices).long() if indices else torch.zeros(0, dtype=torch.long)
        return [x[union]], (meta, union)

    def decompress(self, payload, ctx):
        meta, union = ctx
        return scatter_values(payload[0], union, meta)
