"""Sign compressors: one packed bit per element, plus optional float32 scales."""

from __future__ import annotations

from typing import TYPE_CHECKING

import bytecomp.compress.bits as bits
from bytecomp.compress.base import SOLO, Compressor, Param, Peers, meta_of
from bytecomp.compress.registry import register

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch


@register
class SignSGD(Compressor):
    """signSGD: the sign of each element (zero counts as +), decoded as +1 / -1."""

    name = "signsgd"
    summary = "signSGD: 1 bit per element, decoded as +-1"

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return bits.packed_size(numel, 1)

    def _signs_of(self, x: torch.Tensor, state: dict) -> torch.Tensor:
        return x

    def compress(self, x, state, peers: Peers = SOLO):
        return [bits.pack_signs(self._signs_of(x, state))], meta_of(x)

    def decompress(self, payload, ctx):
        return bits.unpack_signs(payload[0], ctx.numel, ctx.dtype)


@register
class Signum(SignSGD):
    """Signum: the sign of the momentum ``m = beta * m + (1 - beta) * g``, kept per tensor."""

    name = "signum"
    summary = "Signum: sign of the local momentum, 1 bit per element"
    params = {"momentum": Param(float, 0.9, "0 <= momentum < 1", lambda v: 0 <= v < 1,
                                "momentum coefficient beta")}
    momentum: float

    def _signs_of(self, x, state):
        import torch

        momentum = state.get("momentum")
        if momentum is None or momentum.shape != x.shape:
            momentum = torch.zeros_like(x, dtype=torch.float32)
        momentum.mul_(self.momentum).add_(x.float(), alpha=1 - self.momentum)
        state["momentum"] = momentum
        return momentum


class ScaledSign(Compressor):
    """Signs plus float32 scales that restore the magnitude."""

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def compress(self, x, state, peers: Peers = SOLO):
        return [bits.pack_signs(x), self._scales(x.float())], meta_of(x)


@register
class EFSignSGD(ScaledSign):
    """EF-signSGD: ``mean|x| * sign(x)``, always with error feedback (Karimireddy et al.)."""

    name = "efsignsgd"
    summary = "EF-signSGD: sign scaled by mean |x|, error feedback always on"
    default_ef = True
    requires_ef = True

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return bits.packed_size(numel, 1) + 4

    def _scales(self, xf):
        return xf.abs().mean().reshape(1) if xf.numel() else xf.new_zeros(1)

    # decompress, its own payload's approximation and the mean of payloads all take
    # (2 * bit - 1) * scale in float32, in place: the flags from the bits, or from x
    def decompress(self, payload, ctx):
        signs, scale = payload
        return _scaled_signs(bits.unpack_bools(signs, ctx.numel), scale).to(ctx.dtype)

    def approximation(self, payload, ctx, x):
        return _scaled_signs(x.reshape(-1) >= 0, payload[1]).to(ctx.dtype)

    def aggregate_into(self, payloads, ctx, out):
        import torch

        total = None
        for signs, scale in payloads:  # in rank order, in float32, as the default sums
            # decompress rounds to the gradient's dtype: so does each term here
            term = _scaled_signs(bits.unpack_bools(signs, ctx.numel), scale)
            if ctx.dtype != torch.float32:
                term = term.to(ctx.dtype).float()
            # (the default starts from 0: the sum differs only where it adds -0 to 0)
            total = term if total is None else total.add_(term)
        assert total is not None, "aggregate_into needs at least one payload"
        return out.copy_(total.div_(len(payloads)))


def _scaled_signs(positive: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(2 * positive - 1) * scale`` in float32, the arithmetic of ``decompress``."""
    return positive.float().mul_(2).sub_(1).mul_(scale)


@register
class OneBit(ScaledSign):
    """1-bit SGD: each element becomes the mean of the non-negative elements or the mean
    of the negative ones (two float32 scales)."""

    name = "onebit"
    summary = "1-bit quantization with per-sign mean scales"
    default_ef = True

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return bits.packed_size(numel, 1) + 8

    def _scales(self, xf):
        import torch

        positive = xf >= 0
        count_positive = positive.sum()
        count_negative = xf.numel() - count_positive
        sum_positive = torch.where(positive, xf, 0).sum()
        sum_negative = xf.sum() - sum_positive
        return torch.stack([sum_positive / count_positive.clamp(min=1),
                            sum_negative / count_negative.clamp(min=1)])

    def decompress(self, payload, ctx):
        import torch

        signs, means = payload
        positive = bits.unpack_bools(signs, ctx.numel)
        return torch.where(positive, means[0], means[1]).to(ctx.dtype)
