"""Payload collectives on any process group (synchronous; run them on a CommWorker).

A payload is a list of tensors of mixed dtypes. To gather or scatter one in a
single collective it is packed into one uint8 buffer, each tensor starting at
an 8-byte boundary so that it can be viewed back as its dtype without a copy.
Payloads whose size depends on the data are sent with their element counts
first, and the padding is removed on arrival.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from bytecomp.comm.compat import all_gather_flat
from bytecomp.compress.base import Payload

ALIGN = 8


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def packed_nbytes(dtypes: list[torch.dtype], numels: list[int]) -> int:
    return sum(_aligned(n * torch.empty(0, dtype=d).element_size()) for d, n in zip(dtypes, numels))


def pack(payload: Payload, device: torch.device) -> torch.Tensor:
    """One uint8 buffer holding every tensor of ``payload`` at 8-byte boundaries."""
    sizes = [t.numel() * t.element_size() for t in payload]
    buffer = torch.zeros(sum(_aligned(s) for s in sizes), dtype=torch.uint8, device=device)
    offset = 0
    for tensor, size in zip(payload, sizes):
        if size:
            buffer[offset : offset + size] = tensor.contiguous().reshape(-1).view(torch.uint8)
        offset += _aligned(size)
    return buffer


def unpack(buffer: torch.Tensor, dtypes: list[torch.dtype], numels: list[int]) -> Payload:
    """Views of ``buffer`` as the tensors that :func:`pack` put there."""
    payload, offset = [], 0
    for dtype, numel in zip(dtypes, numels):
        size = numel * torch.empty(0, dtype=dtype).element_size()
        payload.append(buffer[offset : offset + size].view(dtype))
        offset += _aligned(size)
    return payload


def divide_first(tensor: torch.Tensor, async_op: bool = False) -> bool:
    """16-bit payloads are divided before they are summed (as PyTorch's fp16 hook does),
    so that the sum cannot overflow. So is every payload of an asynchronous allreduce
    (issued from DDP's hook, as PyTorch's allreduce_hook does): divided afterwards, the
    pass would run in the completion callback, on the thread that runs the backend's
    next collectives, and delay them (measured: +3 to +5% on the MLP). A synchronous
    allreduce (the FIFO thread's) divides after, off the hook's thread."""
    return async_op or tensor.element_size() < 4


def averages_in_reduction(tensor: torch.Tensor, group: dist.ProcessGroup) -> bool:
    """NCCL averages inside its reduction kernel (ReduceOp.AVG): no pass to divide. A
    group may map CUDA to NCCL and the CPU to gloo ("cpu:gloo,cuda:nccl"): the tensor's
    device says which of them runs the allreduce."""
    return tensor.is_cuda and "nccl" in str(dist.get_backend(group)) and \
        hasattr(dist.ReduceOp, "AVG")


def allreduce_average(tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False):
    """Start the allreduce that averages ``tensor``; returns (work, divide afterwards?)."""
    if averages_in_reduction(tensor, group):
        return dist.all_reduce(tensor, op=dist.ReduceOp.AVG, group=group, async_op=async_op), \
            False
    if divide_first(tensor, async_op):
        tensor.div_(dist.get_world_size(group))
        return dist.all_reduce(tensor, group=group, async_op=async_op), False
    return dist.all_reduce(tensor, group=group, async_op=async_op), True


def allreduce_mean_(payload: Payload, group: dist.ProcessGroup) -> Payload:
    """Average every tensor over the group, in place."""
    size = dist.get_world_size(group)
    for tensor in payload:
        if size > 1 and tensor.numel():
            _, divide_after = allreduce_average(tensor, group)
            if divide_after:
                tensor.div_(size)
    return payload


def _exchange_counts(numels: list[int], group, device) -> list[list[int]]:
    size = dist.get_world_size(group)
    mine = torch.tensor(numels, dtype=torch.int64, device=device)
    everyone = torch.empty(size * len(numels), dtype=torch.int64, device=device)
    all_gather_flat(everyone, mine, group=group)
    return everyone.view(size, len(numels)).tolist()


def allgather_payloads(payload: Payload, group: dist.ProcessGroup, fixed_size: bool) -> list[Payload]:
    """Every rank's payload, in rank order. Sizes are exchanged first unless fixed."""
    size = dist.get_world_size(group)
    if size == 1:
        return [payload]
    device = payload[0].device if payload else torch.device("cpu")
    dtypes = [t.dtype for t in payload]
    numels = [t.numel() for t in payload]
    counts = [numels] * size if fixed_size else _exchange_counts(numels, group, device)
    longest = max(packed_nbytes(dtypes, c) for c in counts)
    if longest == 0:
        return [[t.new_zeros(0) for t in payload] for _ in range(size)]
    mine = pack(payload, device)
    if mine.numel() < longest:
        mine = torch.cat([mine, mine.new_zeros(longest - mine.numel())])
    gathered = torch.empty(size * longest, dtype=torch.uint8, device=device)
    all_gather_flat(gathered, mine, group=group)
    rows = gathered.view(size, longest)
    return [unpack(rows[r], dtypes, counts[r]) for r in range(size)]


def allgather_fixed_async(payload: Payload, group: dist.ProcessGroup):
    """Start an allgather of a fixed-size payload; return the work and a function that
    unpacks every rank's payload (in rank order) once the work is done."""
    size = dist.get_world_size(group)
    device = payload[0].device if payload else torch.device("cpu")
    dtypes = [t.dtype for t in payload]
    numels = [t.numel() for t in payload]
    mine = pack(payload, device)
    gathered = torch.empty(size * mine.numel(), dtype=torch.uint8, device=device)
    work = all_gather_flat(gathered, mine, group=group, async_op=True)

    def unpacked() -> list[Payload]:
        rows = gathered.view(size, mine.numel())
        return [unpack(rows[r], dtypes, numels) for r in range(size)]

    return work, unpacked


def alltoall_payloads(payloads: list[Payload], group: dist.ProcessGroup,
                      fixed_size: bool) -> list[Payload]:
    """Send ``payloads[j]`` to rank j; return what each rank sent here, in rank order.

    All payloads must have the same dtypes, and for ``fixed_size`` the same sizes.
    """
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if size == 1:
        return payloads
    device = payloads[0][0].device if payloads[0] else torch.device("cpu")
    dtypes = [t.dtype for t in payloads[rank]]
    if fixed_size:
        incoming_counts = [[t.numel() for t in payloads[rank]]] * size
    else:
        outgoing = torch.tensor([[t.numel() for t in p] for p in payloads], dtype=torch.int64,
                                device=device)
        incoming = torch.empty_like(outgoing)
        dist.all_to_all_single(incoming, outgoing, group=group)
        incoming_counts = incoming.tolist()
    packed = [pack(p, device) for p in payloads]
    in_sizes = [packed_nbytes(dtypes, c) for c in incoming_counts]
    received = torch.empty(sum(in_sizes), dtype=torch.uint8, device=device)
    dist.all_to_all_single(received, torch.cat(packed), output_split_sizes=in_sizes,
                           input_split_sizes=[p.numel() for p in packed], group=group)
    pieces = received.split(in_sizes)
    return [unpack(piece, dtypes, counts) for piece, counts in zip(pieces, incoming_counts)]
