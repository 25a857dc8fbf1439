"""Dense compressors: no compression, casts, and quantizers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import bytecomp.compress.bits as bits
from bytecomp.compress import kernels
from bytecomp.compress.base import (
    ALLREDUCE_HOOK,
    FP16_HOOK,
    SOLO,
    Compressor,
    Param,
    Peers,
    meta_of,
    next_step,
    seeded_generator,
)
from bytecomp.compress.registry import register

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch


@register
class NoCompression(Compressor):
    """fp32 (or the gradient's own dtype) as it is."""

    name = "none"
    summary = "no compression: the gradient travels as it is"
    summable = True
    compresses = False
    pytorch_hook = ALLREDUCE_HOOK  # DDP's own allreduce, no hook at all

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return numel * element_size

    def compress(self, x, state, peers: Peers = SOLO):
        return [x], meta_of(x)

    def decompress(self, payload, ctx):
        return payload[0]


class _CastTarget:
    """``Cast.target``: the torch dtype its class's ``cast_dtype`` names (float16 where it
    names none), looked up on use: importing the compressors needs no torch."""

    def __get__(self, instance: object, owner: type) -> torch.dtype:
        import torch

        return getattr(torch, getattr(owner, "cast_dtype", None) or "float16")


class Cast(Compressor):
    """Cast to a 16-bit float type; summable, like PyTorch's fp16/bf16 hooks."""

    target = _CastTarget()
    summable = True
    metered_without_ef = True

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return numel * 2

    def compress(self, x, state, peers: Peers = SOLO):
        return [x.to(self.target)], meta_of(x)

    def decompress(self, payload, ctx):
        return payload[0].to(ctx.dtype)

    def decompress_into(self, payload, ctx, out):
        return out.copy_(payload[0])


@register
class FP16(Cast):
    name = "fp16"
    summary = "cast to float16 (2 bytes per element)"
    cast_dtype = "float16"
    pytorch_hook = FP16_HOOK


@register
class BF16(Cast):
    name = "bf16"
    summary = "cast to bfloat16 (2 bytes per element)"
    cast_dtype = "bfloat16"
    # PyTorch's bf16_compress_hook is not its hook: it refuses any backend but NCCL and XCCL


@register
class Int8(Compressor):
    """Min-max 8-bit quantization with deterministic rounding."""

    name = "int8"
    summary = "min-max linear 8-bit quantization"
    kernel = kernels.TRITON

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return numel + 8

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        fused = kernels.for_tensor(x)
        if fused is not None and (done := fused.int8_encode(x)) is not None:
            return [done[0], done[1]], meta_of(x)
        xf = x.float()
        if x.numel() == 0:
            return [x.new_zeros(0, dtype=torch.uint8), xf.new_zeros(2)], meta_of(x)
        low, high = xf.min(), xf.max()
        scale = (high - low) / 255
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = ((xf - low) / scale).round_().clamp_(0, 255).to(torch.uint8)
        return [codes, torch.stack([low, scale])], meta_of(x)

    def compress_fed_back(self, x, residual, state, peers: Peers = SOLO, keep=False):
        fused = kernels.for_tensor(x)
        if fused is None or not kernels.fits(residual, x):
            return None
        done = fused.int8_encode(x, residual, feedback=True, keep=keep)
        if done is None:
            return None
        codes, low_scale, new_residual, compensated = done
        return [codes, low_scale], meta_of(x), new_residual, compensated

    def decompress(self, payload, ctx):
        codes, low_scale = payload
        fused = kernels.for_tensor(codes, ctx.dtype)
        if fused is not None and (out := fused.int8_decode(codes, low_scale, ctx.numel,
                                                           ctx.dtype)) is not None:
            return out
        return (codes.float() * low_scale[1] + low_scale[0]).to(ctx.dtype)


@register
class QSGD(Compressor):
    """QSGD: stochastic rounding of |x| / ||x|| to ``levels`` magnitudes (unbiased).

    Payload: one uint8 magnitude per element, one packed sign bit per element,
    and the float32 norm.
    """

    name = "qsgd"
    summary = "QSGD stochastic quantization, unbiased"
    params = {
        "levels": Param(int, 256, "2 <= levels <= 256", lambda v: 2 <= v <= 256,
                        "number of magnitude levels, 0 included"),
        "seed": Param(int, 0, "seed >= 0", lambda v: v >= 0, "random seed", primary=False),
    }
    levels: int
    seed: int

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return numel + bits.packed_size(numel, 1) + 4

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        step = next_step(state)
        xf = x.float()
        norm = xf.norm().reshape(1)
        top = self.levels - 1
        # A zero norm means a zero tensor: divide by 1 instead (no host sync on CUDA).
        scaled = xf.abs() / torch.where(norm > 0, norm, torch.ones_like(norm)) * top
        floor = scaled.floor()
        generator = seeded_generator(x.device, self.seed, state.get("salt", 0), peers.rank, step)
        noise = torch.rand(scaled.shape, generator=generator, device=x.device)
        magnitudes = (floor + (noise < scaled - floor)).clamp_(0, top).to(torch.uint8)
        return [magnitudes, bits.pack(xf < 0, 1), norm], meta_of(x)

    def decompress(self, payload, ctx):
        magnitudes, signs, norm = payload
        negative = bits.unpack(signs, ctx.numel, 1).float()
        values = magnitudes.float() * (norm / (self.levels - 1)) * (1 - 2 * negative)
        return values.to(ctx.dtype)


@register
class TernGrad(Compressor):
    """TernGrad: each element becomes -s, 0 or +s with s = max|x| (unbiased), 2 bits each."""

    name = "terngrad"
    summary = "TernGrad ternary stochastic quantization, unbiased"
    params = {
        "seed": Param(int, 0, "seed >= 0", lambda v: v >= 0, "random seed", primary=False),
    }
    seed: int

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return bits.packed_size(numel, 2) + 4

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        step = next_step(state)
        xf = x.float()
        scale = xf.abs().max().reshape(1) if x.numel() else xf.new_zeros(1)
        generator = seeded_generator(x.device, self.seed, state.get("salt", 0), peers.rank, step)
        noise = torch.rand(xf.shape, generator=generator, device=x.device)
        keep = noise < xf.abs() / torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = (torch.sign(xf) * keep + 1).to(torch.uint8)  # -1, 0, +1 -> 0, 1, 2
        return [bits.pack(codes, 2), scale], meta_of(x)

    def decompress(self, payload, ctx):
        packed, scale = payload
        ternary = bits.unpack(packed, ctx.numel, 2).float() - 1
        return (ternary * scale).to(ctx.dtype)
