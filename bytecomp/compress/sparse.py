"""Sparsifiers: a subset of elements travels as (values, indices) or values only."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bytecomp.compress import kernels
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

_RATIO = Param(float, 0.01, "0 < ratio <= 1", lambda v: 0 < v <= 1, "fraction of elements kept")
_SEED = Param(int, 0, "seed >= 0", lambda v: v >= 0, "random seed", primary=False)


class _IndexedSparse(Compressor):
    """Payload: the kept values (gradient dtype) and their int32 indices."""

    default_ef = True

    def _pack(self, x: torch.Tensor, indices: torch.Tensor):
        indices = indices.to(index_dtype(x.numel()))
        return [x[indices.long()], indices], meta_of(x)

    def decompress(self, payload, ctx):
        values, indices = payload
        return scatter_values(values, indices, ctx)

    def aggregate_into(self, payloads, ctx, out):
        """Sum the sparse payloads into ``out`` in rank order (no dense temporaries).
        CUDA's index_add_ sums with atomics in no fixed order, so ranks could disagree
        in the last bit: there the dense rank-order sum is used."""
        import torch

        if out.device.type != "cpu":
            return super().aggregate_into(payloads, ctx, out)
        total = out if out.dtype == torch.float32 else \
            torch.empty(out.numel(), dtype=torch.float32)
        total.zero_()
        for values, indices in payloads:
            total.index_add_(0, indices.long(), values.float())
        total.div_(len(payloads))
        return out if total is out else out.copy_(total)


@register
class TopK(_IndexedSparse):
    """Top-k: the ``ceil(ratio * n)`` elements of largest magnitude."""

    name = "topk"
    summary = "top-k by magnitude (values + int32 indices)"
    params = {"ratio": _RATIO}
    ladder = ("ratio", FRACTION_LADDER)
    ratio: float

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return count_of(self.ratio, numel) * (element_size + index_bytes(numel))

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        k = count_of(self.ratio, x.numel())
        indices = torch.topk(x.abs(), k, sorted=False).indices
        return self._pack(x, indices)


@register
class Threshold(_IndexedSparse):
    """Every element with ``|x| >= threshold``; the payload size depends on the data."""

    name = "threshold"
    summary = "elements with |x| >= threshold (variable size)"
    fixed_size = False
    measured_payload = True  # how many pass depends on the gradients
    params = {"threshold": Param(float, 1e-3, "threshold > 0", lambda v: v > 0,
                                 "absolute magnitude threshold")}
    threshold: float

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return numel * (element_size + index_bytes(numel))

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        indices = torch.nonzero(x.abs() >= self.threshold).reshape(-1)
        return self._pack(x, indices)


@register
class DGC(_IndexedSparse):
    """Deep Gradient Compression's sampled threshold: estimate the top-k threshold on a
    random sample, keep what passes it, and trim to exactly k if more passed. Zeros are
    never kept, so a gradient with fewer than k nonzeros sends just its nonzeros."""

    name = "dgc"
    summary = "sampled-threshold top-k (at most k kept)"
    fixed_size = False
    ladder = ("ratio", FRACTION_LADDER)
    params = {
        "ratio": _RATIO,
        "sample": Param(float, 0.01, "0 < sample <= 1", lambda v: 0 < v <= 1,
                        "fraction of elements sampled to estimate the threshold", primary=False),
        "seed": _SEED,
    }
    ratio: float
    sample: float
    seed: int
    min_sample = 128

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return count_of(self.ratio, numel) * (element_size + index_bytes(numel))

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        step = next_step(state)
        numel = x.numel()
        k = count_of(self.ratio, numel)
        if numel == 0:
            return self._pack(x, torch.zeros(0, dtype=torch.long, device=x.device))
        magnitude = x.abs()
        sample_size = min(numel, max(self.min_sample, math.ceil(self.sample * numel)))
        generator = seeded_generator(x.device, self.seed, state.get("salt", 0), peers.rank, step)
        sample = magnitude[torch.randint(0, numel, (sample_size,), generator=generator,
                                         device=x.device)]
        threshold = torch.topk(sample, count_of(self.ratio, sample_size), sorted=False).values.min()
        # A zero threshold (a gradient with fewer nonzeros than k, like an embedding whose
        # rows are mostly unused) would select every element and fall back to an exact
        # top-k of all of them: keep the nonzeros only, subnormals included (the smallest
        # positive value of the dtype, not finfo.tiny; no host sync on GPU).
        threshold = torch.maximum(threshold, torch.nextafter(torch.zeros_like(threshold),
                                                             torch.ones_like(threshold)))
        indices = torch.nonzero(magnitude >= threshold).reshape(-1)
        if indices.numel() > k:
            indices = indices[torch.topk(magnitude[indices], k, sorted=False).indices]
        return self._pack(x, indices)


@register
class RandomK(Compressor):
    """Random-k with indices drawn from a seed shared by all ranks: only values travel,
    and payloads are summable because every rank picks the same indices."""

    name = "randomk"
    summary = "random-k, indices from a shared seed (values only, summable)"
    summable = True
    default_ef = True
    params = {"ratio": _RATIO, "seed": _SEED}
    ladder = ("ratio", FRACTION_LADDER)
    kernel = kernels.TRITON
    ratio: float
    seed: int

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return count_of(self.ratio, numel) * element_size

    def _indices(self, x: torch.Tensor, state: dict) -> torch.Tensor:
        """This step's indices, the same on every rank: drawn by PyTorch's generator on
        x's device on every path (a kernel would draw others: docs/kernels.md)."""
        import torch

        step = next_step(state)
        numel = x.numel()
        k = count_of(self.ratio, numel)
        # Drawn with replacement: k stays exact and it costs O(k), not O(n) like randperm.
        generator = seeded_generator(x.device, self.seed, state.get("salt", 0), step)
        return torch.randint(0, max(numel, 1), (k,), generator=generator, device=x.device)

    def compress(self, x, state, peers: Peers = SOLO):
        indices = self._indices(x, state)
        fused = kernels.for_tensor(x)
        values = fused.gather(x, indices) if fused is not None else None
        return [x[indices] if values is None else values], (meta_of(x), indices)

    def compress_fed_back(self, x, residual, state, peers: Peers = SOLO, keep=False):
        """``c = x + residual`` (one pass, as PyTorch adds), the values gathered from it,
        and the new residual: ``c`` less its approximation, which is ``c`` but at the k
        indices, where it is ``c - c`` (written there alone, without the dense
        approximation and subtraction of the unfused path)."""
        fused = kernels.for_tensor(x)
        if fused is None or not kernels.fits(residual, x):
            return None
        indices = self._indices(x, state)
        compensated = x + residual if residual is not None else x.clone()
        values = fused.gather(compensated, indices)
        new_residual = compensated.clone() if keep else compensated
        if values is None or fused.scatter(values, indices, new_residual, subtract=True) is None:
            # the kernels failed (and are off): the unfused steps on the same indices
            values = compensated[indices]
            new_residual = compensated - scatter_values(values, indices, meta_of(x))
        return [values], (meta_of(x), indices), new_residual, compensated if keep else None

    def decompress(self, payload, ctx):
        meta, indices = ctx
        fused = kernels.for_tensor(payload[0], meta.dtype)
        if fused is not None:
            import torch

            out = torch.zeros(meta.numel, dtype=meta.dtype, device=meta.device)
            if fused.scatter(payload[0], indices, out) is not None:
                return out
        return scatter_values(payload[0], indices, meta)
