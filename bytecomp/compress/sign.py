"""Sign compressors: one packed bit per element, plus optional float32 scales."""

from __future__ import annotations

from typing import TYPE_CHECKING

import bytecomp.compress.bits as bits
from bytecomp.compress import kernels
from bytecomp.compress.base import SOLO, Compressor, Param, Peers, meta_of
from bytecomp.compress.registry import register

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch


class _FusedSigns(Compressor):
    """The sign compressors' kernels (:func:`bytecomp.compress.triton_kernels.
    sign_encode`): the signs packed in one pass, with the residual's update under error
    feedback; the scales, where there are, from a reduction pass before it."""

    kernel = kernels.TRITON
    fused_scales = "unit"  # none; "mean": [mean |x|]; "means": [mean of x >= 0, of x < 0]

    def _fused(self, fused, x, residual, state, feedback=False, keep=False):
        """``sign_encode``'s ``(packed, scales, new residual, compensated)``, or None."""
        return fused.sign_encode(x, residual, scales=self.fused_scales, feedback=feedback,
                                 keep=keep)

    def _payload(self, packed, scales):
        return [packed] if scales is None else [packed, scales]

    def _compress_fused(self, x, state):
        fused = kernels.for_tensor(x)
        done = self._fused(fused, x, None, state) if fused is not None else None
        return None if done is None else (self._payload(done[0], done[1]), meta_of(x))

    def compress_fed_back(self, x, residual, state, peers: Peers = SOLO, keep=False):
        fused = kernels.for_tensor(x)
        if fused is None or not kernels.fits(residual, x):
            return None
        done = self._fused(fused, x, residual, state, feedback=True, keep=keep)
        if done is None:
            return None
        packed, scales, new_residual, compensated = done
        return self._payload(packed, scales), meta_of(x), new_residual, compensated

    def _decompress_fused(self, signs, values, ctx):
        """``where(bit, values[0], values[1])`` by the kernel (``-values[0]`` for a 0 bit
        where ``values`` has one element), or None: the PyTorch path."""
        fused = kernels.for_tensor(signs, ctx.dtype)
        return None if fused is None else fused.sign_decode(signs, values, ctx.numel, ctx.dtype)


@register
class SignSGD(_FusedSigns):
    """signSGD: the sign of each element (zero counts as +), decoded as +1 / -1."""

    name = "signsgd"
    summary = "signSGD: 1 bit per element, decoded as +-1"

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return bits.packed_size(numel, 1)

    def _signs_of(self, x: torch.Tensor, state: dict) -> torch.Tensor:
        return x

    def compress(self, x, state, peers: Peers = SOLO):
        done = self._compress_fused(x, state)
        if done is not None:
            return done
        return [bits.pack_signs(self._signs_of(x, state))], meta_of(x)

    def decompress(self, payload, ctx):
        fused = kernels.for_tensor(payload[0], ctx.dtype)
        if fused is not None:
            out = self._decompress_fused(payload[0], fused.unit_values(payload[0].device), ctx)
            if out is not None:
                return out
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
        momentum = self._momentum_of(x, state)
        momentum.mul_(self.momentum).add_(x.float(), alpha=1 - self.momentum)
        state["momentum"] = momentum
        return momentum

    def _momentum_of(self, x: torch.Tensor, state: dict) -> torch.Tensor:
        import torch

        momentum = state.get("momentum")
        if momentum is None or momentum.shape != x.shape:
            momentum = torch.zeros_like(x, dtype=torch.float32)
        return momentum

    def _fused(self, fused, x, residual, state, feedback=False, keep=False):
        """The momentum's update (``fma(x, 1 - beta, m * beta)``: torch's ``add_`` with
        ``alpha``) fused with the packing of its signs."""
        import torch

        momentum = self._momentum_of(x, state)
        if momentum.dtype != torch.float32 or momentum.device != x.device or \
                not momentum.is_contiguous():
            return None  # as the PyTorch path would have it
        done = fused.sign_encode(x, residual, momentum=momentum, beta=self.momentum,
                                 feedback=feedback, keep=keep)
        if done is not None:
            state["momentum"] = momentum
        return done


class ScaledSign(_FusedSigns):
    """Signs plus float32 scales that restore the magnitude."""

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def compress(self, x, state, peers: Peers = SOLO):
        done = self._compress_fused(x, state)
        if done is not None:
            return done
        return [bits.pack_signs(x), self._scales(x.float())], meta_of(x)


@register
class EFSignSGD(ScaledSign):
    """EF-signSGD: ``mean|x| * sign(x)``, always with error feedback (Karimireddy et al.)."""

    name = "efsignsgd"
    summary = "EF-signSGD: sign scaled by mean |x|, error feedback always on"
    default_ef = True
    requires_ef = True
    fused_scales = "mean"

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return bits.packed_size(numel, 1) + 4

    def _scales(self, xf):
        return xf.abs().mean().reshape(1) if xf.numel() else xf.new_zeros(1)

    # decompress, its own payload's approximation and the mean of payloads all take
    # (2 * bit - 1) * scale in float32, in place: the flags from the bits, or from x
    def decompress(self, payload, ctx):
        signs, scale = payload
        out = self._decompress_fused(signs, scale, ctx)  # a 0 bit: -scale
        if out is not None:
            return out
        return _scaled_signs(bits.unpack_bools(signs, ctx.numel), scale).to(ctx.dtype)

    def approximation(self, payload, ctx, x):
        return _scaled_signs(x.reshape(-1) >= 0, payload[1]).to(ctx.dtype)

    def aggregate_into(self, payloads, ctx, out):
        import torch

        fused = kernels.for_tensor(out) if payloads else None
        if fused is not None:  # the same terms summed in the same order, one pass each
            summed = torch.empty(ctx.numel, dtype=torch.float32, device=out.device)
            for index, (signs, scale) in enumerate(payloads):
                if fused.sign_decode(signs, scale, ctx.numel, torch.float32, out=summed,
                                     accumulate=index > 0, round_to=ctx.dtype) is None:
                    break  # the kernels failed (and are off): the PyTorch path
            else:
                return out.copy_(summed.div_(len(payloads)))
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
    fused_scales = "means"

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
        out = self._decompress_fused(signs, means, ctx)
        if out is not None:
            return out
        positive = bits.unpack_bools(signs, ctx.numel)
        return torch.where(positive, means[0], means[1]).to(ctx.dtype)
