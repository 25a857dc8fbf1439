"""Collective names across torch versions (newer releases renamed the *_tensor ones), and
any of the collectives bytecomp times as one no-argument call (the profiler's sweeps and
autotune's probes)."""

import torch
import torch.distributed as dist

all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def collective_call(name: str, nbytes: int, dtype: torch.dtype, group, ranks: int, device):
    """A no-argument callable running collective ``name`` on ``nbytes`` (the whole array)."""
    element = torch.empty(0, dtype=dtype).element_size()
    numel = max(ranks, (nbytes // element) // ranks * ranks)
    full = torch.ones(numel, dtype=dtype, device=device)
    part = torch.ones(numel // ranks, dtype=dtype, device=device)
    if name == "allreduce":
        return lambda: dist.all_reduce(full, group=group)
    if name == "allgather":
        return lambda: all_gather_flat(full, part, group=group)
    if name == "reduce_scatter":
        return lambda: reduce_scatter_flat(part, full, group=group)
    if name == "alltoall":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if name == "broadcast":
        source = dist.get_global_rank(group, 0) if group is not None else 0
        return lambda: dist.broadcast(full, src=source, group=group)
    raise ValueError(name)
