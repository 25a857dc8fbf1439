"""Fused Triton kernels for the compressors' hot paths (see docs/kernels.md).

Imported only by :mod:`bytecomp.compress.kernels`, the first time a CUDA tensor is
encoded or decoded by a compressor that has kernels (never by planning: this module
imports torch and triton). Each wrapper below gives exactly what the compressor's
PyTorch path gives, with the same arithmetic in the same order and precision:

* int8: one pass finds the min and max (of ``x + residual`` under error feedback,
  without writing it; one program folds the blocks' partials), a second quantizes and,
  under error feedback, writes the new residual ``c - dequantize(codes)`` in the same
  pass: bit-identical.
* sign packing (signSGD, Signum's momentum update, EF-signSGD, 1-bit): one pass packs
  the signs (and updates the momentum, and writes the residual); EF-signSGD's and 1-bit's
  scales need a reduction pass before it. The signs and the arithmetic on them are
  bit-identical; the scales are float32 sums taken in another (fixed) order than
  ``torch.sum``'s, equal within a relative 1e-5 (of ``mean |x|``).
* random-k: gather and scatter at the indices the compressor draws with PyTorch's
  generator, as today (the draw is not moved into a kernel: docs/kernels.md says why).

Float arithmetic is kept from being contracted into fused multiply-adds
(``enable_fp_fusion=False``), as PyTorch computes ``a * b + c`` in two kernels; where
PyTorch computes an FMA (``add_`` with ``alpha``: Signum's momentum) the kernel calls
``tl.fma``. Division is IEEE (``div_rn``), rounding half to even.

Every public function returns None where a kernel fails to compile or launch (a warning
once, and the PyTorch path from then on; :func:`bytecomp.compress.kernels.disable`), or
raises where :mod:`bytecomp.compress.kernels` is strict (the tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import triton
import triton.language as tl

from bytecomp.compress import kernels

F = TypeVar("F", bound=Callable[..., Any])

# Elements per program of the element-wise and reduction kernels, bytes (8 elements each)
# per program of the sign kernels, indices per program of gather and scatter: powers of
# two, tuned on no GPU yet (docs/kernels.md: what is left to measure).
BLOCK = 4096
SIGN_BYTES = 512
INDEX_BLOCK = 1024
WARPS = 8
# round half to even of 0 <= v < 2**23 in float32: (v + 2**23) - 2**23 (IEEE adds)
ROUNDER: tl.constexpr = tl.constexpr(8388608.0)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# the 16-bit float a sign decode rounds each term to before summing (EF-signSGD's mean)
ROUND_NONE, ROUND_FP16, ROUND_BF16 = 0, 1, 2
_ROUND_CODES = {torch.float32: ROUND_NONE, torch.float16: ROUND_FP16,
                torch.bfloat16: ROUND_BF16}
_LAUNCH = {"num_warps": WARPS, "enable_fp_fusion": False}


def supports(x: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether the kernels take ``x``: a non-empty contiguous tensor of float32, float16
    or bfloat16 (or a payload to decode into one of those: ``dtype``)."""
    return (dtype or x.dtype) in DTYPES and x.numel() > 0 and x.is_contiguous()


def _fallible(fn: F) -> F:
    """Run ``fn`` on ``x``'s device; a failure becomes a warning, None and the PyTorch
    path from then on (raised instead where the kernels are strict)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        device = args[0].device
        try:
            if device.type == "cuda":
                with torch.cuda.device(device):
                    result = fn(*args, **kwargs)
            else:  # the interpreter (TRITON_INTERPRET=1) on CPU tensors: the tests
                result = fn(*args, **kwargs)
        except torch.cuda.OutOfMemoryError:
            raise  # the PyTorch path would need the memory too
        except Exception as error:  # a compiler or driver error: never a wrong result
            if kernels.strict():
                raise
            kernels.disable(f"{fn.__name__}: {type(error).__name__}: {error}")
            return None
        kernels.LAUNCHES[fn.__name__] += 1
        return result

    return run  # type: ignore[return-value]


# -- kernels ------------------------------------------------------------------------


@triton.jit
def _rounded(v, dtype: tl.constexpr):
    """``v`` rounded to ``dtype`` to nearest even, as torch's casts. Written out for
    bfloat16 (the bits of float32, rounded at bit 16: what ``cvt.rn.bf16.f32`` computes),
    since Triton's interpreter truncates there instead; NaN stays a (quiet) NaN."""
    if dtype == tl.bfloat16:
        v = v.to(tl.float32)
        bits = v.to(tl.uint32, bitcast=True)
        bits = tl.where(v != v, bits | 0x400000, bits + 0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(dtype)


@triton.jit
def _compensated(x_ptr, r_ptr, offsets, mask, HAS_RESIDUAL: tl.constexpr):
    """``x + residual`` in x's dtype, as torch adds (in float32, rounded once)."""
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + offsets, mask=mask, other=0.0)
        x = _rounded(x.to(tl.float32) + r.to(tl.float32), x.dtype)
    return x


@triton.jit
def _min_max(values, nans):
    """The min and max of a block, NaN where ``nans`` (a count of NaN seen) is not 0, as
    torch's min and max propagate NaN (min and max are exact: any order gives them)."""
    low = tl.min(values, axis=0)
    high = tl.max(values, axis=0)
    nan = tl.sum(nans, axis=0) > 0
    return tl.where(nan, float("nan"), low), tl.where(nan, float("nan"), high)


STAT_MINMAX, STAT_ABS_SUM, STAT_SIGNED_SUMS = 0, 1, 2
STAT_COLUMNS = {STAT_MINMAX: 2, STAT_ABS_SUM: 1, STAT_SIGNED_SUMS: 3}


@triton.jit
def _stats_kernel(x_ptr, r_ptr, out_ptr, n, STAT: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                  COLUMNS: tl.constexpr, BLOCK: tl.constexpr):
    """One row of partials per program, over ``c = x (+ residual)`` in float32: min and
    max (NaN propagates, as torch's); sum of |c|; or the count of c >= 0, the sum of
    those and the sum of all."""
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    c = _compensated(x_ptr, r_ptr, offsets, mask, HAS_RESIDUAL).to(tl.float32)
    row = out_ptr + pid.to(tl.int64) * COLUMNS
    if STAT == 0:
        nans = tl.where(mask & (c != c), 1, 0)
        low, _ = _min_max(tl.where(mask, c, float("inf")), nans)
        _, high = _min_max(tl.where(mask, c, -float("inf")), nans)
        tl.store(row, low)
        tl.store(row + 1, high)
    elif STAT == 1:
        tl.store(row, tl.sum(tl.where(mask, tl.abs(c), 0.0), axis=0))
    else:
        positive = (c >= 0) & mask
        tl.store(row, tl.sum(positive.to(tl.float32), axis=0))
        tl.store(row + 1, tl.sum(tl.where(positive, c, 0.0), axis=0))
        tl.store(row + 2, tl.sum(tl.where(mask, c, 0.0), axis=0))


@triton.jit(do_not_specialize=["n"])  # n is a value here (a 1 would become a constant)
def _finalize_kernel(partials_ptr, out_ptr, programs, n, STAT: tl.constexpr,
                     COLUMNS: tl.constexpr, BLOCK: tl.constexpr):
    """One program folds the partials, in a fixed order, into what the payload carries:
    int8's ``[low, (high - low) / 255 or 1]`` (the min and max are exact: bit-identical
    with torch's), EF-signSGD's ``[sum |c| / n]``, or 1-bit's ``[sum of c >= 0 / their
    count, sum of c < 0 / theirs]`` (0 where none; the counts exact in int64)."""
    lanes = tl.arange(0, BLOCK)
    first = tl.zeros([BLOCK], dtype=tl.float32)
    second = tl.zeros([BLOCK], dtype=tl.float32)
    count = tl.zeros([BLOCK], dtype=tl.int64)  # of NaN (min-max) or of c >= 0 (1-bit)
    if STAT == 0:
        first += float("inf")
        second -= float("inf")
    for start in range(0, programs, BLOCK):
        rows = (start + lanes).to(tl.int64)
        mask = rows < programs
        row = partials_ptr + rows * COLUMNS
        if STAT == 0:
            low = tl.load(row, mask=mask, other=float("inf"))
            high = tl.load(row + 1, mask=mask, other=-float("inf"))
            count += tl.where((low != low) | (high != high), 1, 0)
            first = tl.minimum(first, low)
            second = tl.maximum(second, high)
        elif STAT == 1:
            first += tl.load(row, mask=mask, other=0.0)
        else:
            count += tl.load(row, mask=mask, other=0.0).to(tl.int64)
            first += tl.load(row + 1, mask=mask, other=0.0)
            second += tl.load(row + 2, mask=mask, other=0.0)
    if STAT == 0:
        low, _ = _min_max(first, count)
        _, high = _min_max(second, count)
        scale = tl.math.div_rn(high - low, 255.0)
        tl.store(out_ptr, low)
        tl.store(out_ptr + 1, tl.where(scale > 0, scale, 1.0))
    elif STAT == 1:
        tl.store(out_ptr, tl.math.div_rn(tl.sum(first, axis=0), n.to(tl.float32)))
    else:
        positives = tl.sum(count, axis=0)
        sum_positive = tl.sum(first, axis=0)
        sum_negative = tl.sum(second, axis=0) - sum_positive
        negatives = n - positives
        tl.store(out_ptr, tl.math.div_rn(sum_positive, tl.maximum(positives, 1).to(tl.float32)))
        tl.store(out_ptr + 1,
                 tl.math.div_rn(sum_negative, tl.maximum(negatives, 1).to(tl.float32)))


@triton.jit
def _int8_encode_kernel(x_ptr, r_ptr, low_scale_ptr, codes_ptr, residual_ptr, comp_ptr, n,
                        HAS_RESIDUAL: tl.constexpr, FEEDBACK: tl.constexpr,
                        KEEP: tl.constexpr, BLOCK: tl.constexpr):
    """codes = clamp(round((c - low) / scale), 0, 255); under error feedback the new
    residual ``c - (codes * scale + low)`` (in c's dtype) in the same pass."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    c = _compensated(x_ptr, r_ptr, offsets, mask, HAS_RESIDUAL)
    low = tl.load(low_scale_ptr)
    scale = tl.load(low_scale_ptr + 1)
    cf = c.to(tl.float32)
    q = tl.math.div_rn(cf - low, scale)
    q = (q + ROUNDER) - ROUNDER
    q = tl.minimum(tl.maximum(q, 0.0), 255.0)
    tl.store(codes_ptr + offsets, q.to(tl.uint8), mask=mask)
    if FEEDBACK:
        approx = _rounded(q * scale + low, c.dtype)
        residual = _rounded(cf - approx.to(tl.float32), c.dtype)
        tl.store(residual_ptr + offsets, residual, mask=mask)
    if KEEP:
        tl.store(comp_ptr + offsets, c, mask=mask)


@triton.jit
def _int8_decode_kernel(codes_ptr, low_scale_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    q = tl.load(codes_ptr + offsets, mask=mask, other=0).to(tl.float32)
    low = tl.load(low_scale_ptr)
    scale = tl.load(low_scale_ptr + 1)
    tl.store(out_ptr + offsets, _rounded(q * scale + low, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sign_encode_kernel(x_ptr, r_ptr, m_ptr, values_ptr, bits_ptr, residual_ptr, comp_ptr,
                        n, beta, alpha, HAS_RESIDUAL: tl.constexpr, MOMENTUM: tl.constexpr,
                        MIRROR: tl.constexpr, FEEDBACK: tl.constexpr, KEEP: tl.constexpr,
                        BYTES: tl.constexpr):
    """One bit per element, 1 where the source >= 0, the first element in the highest
    bit of its byte (:func:`bytecomp.compress.bits.pack`). The source is ``c = x (+
    residual)``, or with ``MOMENTUM`` the momentum ``m = fma(c, alpha, m * beta)``
    (torch's ``m.mul_(beta).add_(c, alpha=alpha)``), updated in place. Under error
    feedback the new residual ``c - where(bit, values[0], values[1])`` (``values[1]`` is
    ``-values[0]`` with ``MIRROR``)."""
    rows = tl.program_id(0).to(tl.int64) * BYTES + tl.arange(0, BYTES)
    columns = tl.arange(0, 8)
    offsets = rows[:, None] * 8 + columns[None, :]
    mask = offsets < n
    c = _compensated(x_ptr, r_ptr, offsets, mask, HAS_RESIDUAL)
    if MOMENTUM:
        m = tl.load(m_ptr + offsets, mask=mask, other=0.0)
        m = tl.fma(c.to(tl.float32), alpha, m * beta)
        tl.store(m_ptr + offsets, m, mask=mask)
        positive = m >= 0
    else:
        positive = c.to(tl.float32) >= 0  # (the interpreter compares bfloat16 as integers)
    flags = tl.where(positive & mask, 1, 0)
    packed = tl.sum(flags << (7 - columns)[None, :], axis=1)
    tl.store(bits_ptr + rows, packed.to(tl.uint8), mask=rows * 8 < n)
    if FEEDBACK:
        approx = _rounded(tl.where(positive, tl.load(values_ptr),
                                   _second(values_ptr, MIRROR)), c.dtype)
        residual = _rounded(c.to(tl.float32) - approx.to(tl.float32), c.dtype)
        tl.store(residual_ptr + offsets, residual, mask=mask)
    if KEEP:
        tl.store(comp_ptr + offsets, c, mask=mask)


@triton.jit
def _second(values_ptr, MIRROR: tl.constexpr):
    """What a 0 bit decodes to: ``values[1]``, or ``-values[0]`` (exact) with ``MIRROR``."""
    if MIRROR:
        return -tl.load(values_ptr)
    else:
        return tl.load(values_ptr + 1)


@triton.jit
def _sign_decode_kernel(bits_ptr, values_ptr, out_ptr, n, MIRROR: tl.constexpr,
                        ACCUMULATE: tl.constexpr, ROUND: tl.constexpr, BYTES: tl.constexpr):
    """``where(bit, values[0], values[1])`` in out's dtype (``values[1]`` is ``-values[0]``
    with ``MIRROR``), first rounded to float16 or bfloat16 by ``ROUND``; with
    ``ACCUMULATE`` added to what ``out`` holds."""
    rows = tl.program_id(0).to(tl.int64) * BYTES + tl.arange(0, BYTES)
    columns = tl.arange(0, 8)
    offsets = rows[:, None] * 8 + columns[None, :]
    mask = offsets < n
    packed = tl.load(bits_ptr + rows, mask=rows * 8 < n, other=0).to(tl.int32)
    positive = ((packed[:, None] >> (7 - columns)[None, :]) & 1) != 0
    term = tl.where(positive, tl.load(values_ptr), _second(values_ptr, MIRROR))
    if ROUND == 1:
        term = term.to(tl.float16).to(tl.float32)
    elif ROUND == 2:
        term = _rounded(term, tl.bfloat16).to(tl.float32)
    if ACCUMULATE:
        term = tl.load(out_ptr + offsets, mask=mask, other=0.0) + term
    tl.store(out_ptr + offsets, _rounded(term, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gather_kernel(src_ptr, index_ptr, out_ptr, k, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < k
    index = tl.load(index_ptr + offsets, mask=mask, other=0).to(tl.int64)
    tl.store(out_ptr + offsets, tl.load(src_ptr + index, mask=mask), mask=mask)


@triton.jit
def _scatter_kernel(values_ptr, index_ptr, out_ptr, k, SUBTRACT: tl.constexpr,
                    BLOCK: tl.constexpr):
    """``out[index] = values`` (in out's dtype), or with ``SUBTRACT`` ``values - values``
    (error feedback's residual where a value was sent: 0, or NaN where it was not
    finite)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < k
    index = tl.load(index_ptr + offsets, mask=mask, other=0).to(tl.int64)
    values = tl.load(values_ptr + offsets, mask=mask, other=0.0)
    if SUBTRACT:
        values = _rounded(values.to(tl.float32) - values.to(tl.float32), values.dtype)
    if values.dtype != out_ptr.dtype.element_ty:
        values = _rounded(values.to(tl.float32), out_ptr.dtype.element_ty)
    tl.store(out_ptr + index, values, mask=mask)


# -- what the compressors call ------------------------------------------------------


def _grid(count: int, per_program: int) -> tuple[int]:
    return (triton.cdiv(count, per_program),)


FINALIZE_BLOCK = 1024
STAT_OUTPUTS = {STAT_MINMAX: 2, STAT_ABS_SUM: 1, STAT_SIGNED_SUMS: 2}


def _stats(x: torch.Tensor, residual: torch.Tensor | None, stat: int) -> torch.Tensor:
    """The float32 scales a payload carries, from :func:`_stats_kernel`'s partials folded
    by :func:`_finalize_kernel` (two launches, no host sync)."""
    n = x.numel()
    columns, programs = STAT_COLUMNS[stat], triton.cdiv(n, BLOCK)
    partials = torch.empty(programs, columns, dtype=torch.float32, device=x.device)
    _stats_kernel[(programs,)](x, x if residual is None else residual, partials, n,
                               STAT=stat, HAS_RESIDUAL=residual is not None,
                               COLUMNS=columns, BLOCK=BLOCK, **_LAUNCH)
    out = torch.empty(STAT_OUTPUTS[stat], dtype=torch.float32, device=x.device)
    _finalize_kernel[(1,)](partials, out, programs, n, STAT=stat, COLUMNS=columns,
                           BLOCK=FINALIZE_BLOCK, **_LAUNCH)
    return out


def _outputs(x: torch.Tensor, feedback: bool, keep: bool):
    residual = torch.empty_like(x) if feedback else x
    compensated = torch.empty_like(x) if keep else x
    return residual, compensated


@_fallible
def int8_encode(x: torch.Tensor, residual: torch.Tensor | None = None,
                feedback: bool = False, keep: bool = False):
    """``(codes, [low, scale], new residual, compensated)`` of ``c = x (+ residual)``:
    the residual where ``feedback``, ``c`` itself where ``keep`` (else None)."""
    n = x.numel()
    low_scale = _stats(x, residual, STAT_MINMAX)
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    new_residual, compensated = _outputs(x, feedback, keep)
    _int8_encode_kernel[_grid(n, BLOCK)](
        x, x if residual is None else residual, low_scale, codes, new_residual, compensated,
        n, HAS_RESIDUAL=residual is not None, FEEDBACK=feedback, KEEP=keep, BLOCK=BLOCK,
        **_LAUNCH)
    return (codes, low_scale, new_residual if feedback else None,
            compensated if keep else None)


@_fallible
def int8_decode(codes: torch.Tensor, low_scale: torch.Tensor, numel: int,
                dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(numel, dtype=dtype, device=codes.device)
    _int8_decode_kernel[_grid(numel, BLOCK)](codes, low_scale, out, numel, BLOCK=BLOCK,
                                             **_LAUNCH)
    return out


@functools.cache
def unit_values(device: torch.device) -> torch.Tensor:
    """``[1, -1]``: what signSGD's and Signum's bits decode to."""
    return torch.tensor([1.0, -1.0], dtype=torch.float32, device=device)


SCALES_UNIT, SCALES_MEAN, SCALES_MEANS = "unit", "mean", "means"


@_fallible
def sign_encode(x: torch.Tensor, residual: torch.Tensor | None = None,
                momentum: torch.Tensor | None = None, beta: float = 0.0,
                scales: str = SCALES_UNIT, feedback: bool = False, keep: bool = False):
    """``(packed signs, scales, new residual, compensated)`` of ``c = x (+ residual)``
    (of the momentum, updated in place, where given). ``scales``: ``"unit"`` (none: the
    bits decode to +-1), ``"mean"`` (``[mean |c|]``, EF-signSGD) or ``"means"`` (the
    means of the non-negative and of the negative elements, 1-bit SGD)."""
    n = x.numel()
    other = x if residual is None else residual
    if scales == SCALES_UNIT:
        payload_scales, values = None, unit_values(x.device)
    elif scales in (SCALES_MEAN, SCALES_MEANS):
        payload_scales = values = _stats(x, residual, STAT_ABS_SUM if scales == SCALES_MEAN
                                         else STAT_SIGNED_SUMS)
    else:
        raise ValueError(f"scales must be unit, mean or means, got {scales!r}")
    packed = torch.empty(triton.cdiv(n, 8), dtype=torch.uint8, device=x.device)
    new_residual, compensated = _outputs(x, feedback, keep)
    _sign_encode_kernel[_grid(packed.numel(), SIGN_BYTES)](
        x, other, x if momentum is None else momentum, values, packed, new_residual,
        compensated, n, float(beta), float(1 - beta), HAS_RESIDUAL=residual is not None,
        MOMENTUM=momentum is not None, MIRROR=scales == SCALES_MEAN, FEEDBACK=feedback,
        KEEP=keep, BYTES=SIGN_BYTES, **_LAUNCH)
    return (packed, payload_scales, new_residual if feedback else None,
            compensated if keep else None)


@_fallible
def sign_decode(packed: torch.Tensor, values: torch.Tensor, numel: int, dtype: torch.dtype,
                out: torch.Tensor | None = None, accumulate: bool = False,
                round_to: torch.dtype = torch.float32) -> torch.Tensor:
    """``where(bit, values[0], values[1])`` as ``dtype`` (into ``out`` where given), or
    ``where(bit, values[0], -values[0])`` where ``values`` has one element (EF-signSGD's
    scale); with ``accumulate``, added to the float32 ``out``, each term first rounded to
    ``round_to``."""
    if out is None:
        out = torch.empty(numel, dtype=dtype, device=packed.device)
    _sign_decode_kernel[_grid(packed.numel(), SIGN_BYTES)](
        packed, values, out, numel, MIRROR=values.numel() == 1, ACCUMULATE=accumulate,
        ROUND=_ROUND_CODES[round_to], BYTES=SIGN_BYTES, **_LAUNCH)
    return out


@_fallible
def gather(src: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``src[indices]``."""
    k = indices.numel()
    out = torch.empty(k, dtype=src.dtype, device=src.device)
    if k:
        _gather_kernel[_grid(k, INDEX_BLOCK)](src, indices, out, k, BLOCK=INDEX_BLOCK,
                                              **_LAUNCH)
    return out


@_fallible
def scatter(values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
            subtract: bool = False) -> torch.Tensor:
    """``out[indices] = values`` (cast to out's dtype), or ``values - values`` with
    ``subtract``; in place, ``out`` returned."""
    k = indices.numel()
    if k:
        _scatter_kernel[_grid(k, INDEX_BLOCK)](values, indices, out, k, SUBTRACT=subtract,
                                               BLOCK=INDEX_BLOCK, **_LAUNCH)
    return out
