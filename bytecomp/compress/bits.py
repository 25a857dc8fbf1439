"""Packing small unsigned codes (1, 2 or 4 bits each) into uint8, on any device."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch


@cache  # every pack and unpack needs them: one small tensor per width and device
def _shifts(bits: int, device: torch.device) -> torch.Tensor:
    import torch

    per_byte = 8 // bits
    # The first code of a byte goes into its highest bits.
    return torch.arange(per_byte - 1, -1, -1, device=device, dtype=torch.uint8) * bits


@cache
def _bit_masks(device: torch.device) -> torch.Tensor:
    """Each bit of a byte alone, the highest first (the order :func:`pack` fills them)."""
    import torch

    return torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=device)


def packed_size(numel: int, bits: int) -> int:
    per_byte = 8 // bits
    return -(-numel // per_byte)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes in ``[0, 2**bits)`` into ``ceil(n * bits / 8)`` bytes."""
    import torch

    if bits not in (1, 2, 4):
        raise ValueError(f"bits must be 1, 2 or 4, got {bits}")
    per_byte = 8 // bits
    codes = codes.reshape(-1)
    # a bool is one byte of 0 or 1: seen as uint8 without a copy
    codes = codes.view(torch.uint8) if codes.dtype == torch.bool else codes.to(torch.uint8)
    padding = (-codes.numel()) % per_byte
    if padding:
        codes = torch.cat([codes, codes.new_zeros(padding)])
    grouped = codes.view(-1, per_byte) << _shifts(bits, codes.device)
    return grouped.sum(dim=1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`: the first ``numel`` codes, as uint8."""
    mask = (1 << bits) - 1
    codes = (packed.reshape(-1, 1) >> _shifts(bits, packed.device)) & mask
    return codes.reshape(-1)[:numel]


def unpack_bools(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of ``pack(flags, 1)``: the first ``numel`` flags, as bool."""
    return (packed.reshape(-1, 1) & _bit_masks(packed.device)).bool().reshape(-1)[:numel]


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per element: 1 where ``x >= 0``."""
    return pack(x >= 0, 1)


def unpack_signs(packed: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """+1 / -1 per element from :func:`pack_signs`."""
    return unpack(packed, numel, 1).to(dtype) * 2 - 1
