"""The public conformance check of a compressor: what every compressor must do for the
planner, the schemes and the executor to run it, checked on one process.

>>> from bytecomp.testing import check_compressor
>>> check_compressor(MyCompressor)      # raises AssertionError naming what fails

bytecomp's own tests run it over every registered compressor. Each check is a
function of the compressor class (:data:`CHECKS`); ``check_compressor(cls, only=...)``
runs some of them. The checks run the compressor's whole protocol with
:mod:`bytecomp.compress.local` (several virtual ranks in memory where a check needs
them), in float32, float16 and bfloat16, on sizes from empty to a few thousand
elements.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import torch

from bytecomp.compress.base import Compressor, Peers
from bytecomp.compress.kernels import TRITON
from bytecomp.compress.local import encode, roundtrip
from bytecomp.compress.registry import COMPRESSORS, from_spec

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = (0, 1, 9, 1000, 4097)
ROUNDS = ("allreduce", "allgather")
ESTIMATES = ("bound", "target")
# the traits that are flags: those whose base default is True or False
FLAGS = tuple(trait for trait in Compressor.TRAITS if isinstance(getattr(Compressor, trait), bool))


def _fail(cls: type[Compressor], what: str) -> AssertionError:
    return AssertionError(f"{cls.__name__} ({cls.name!r}): {what}")


def _sample(numel: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator).to(dtype)


def _default(cls: type[Compressor], ef: bool | None = None) -> Compressor:
    """The compressor at its defaults (error feedback as asked, where it may be)."""
    if ef is None or (cls.requires_ef and not ef):
        return from_spec(cls.name)
    return from_spec(f"{cls.name}:ef={'true' if ef else 'false'}")


def check_declared(cls: type[Compressor]) -> None:
    """Registered under its name; traits of the right kinds and consistent; parameters
    whose defaults pass their own rules."""
    if COMPRESSORS.get(cls.name) is not cls:
        raise _fail(cls, "not registered under its name (decorate it with "
                         "bytecomp.compress.register)")
    for trait in FLAGS:
        if not isinstance(getattr(cls, trait), bool):
            raise _fail(cls, f"{trait} must be True or False")
    rounds = _default(cls).collectives_of_rounds()
    if not rounds or any(r not in ROUNDS for r in rounds):
        raise _fail(cls, f"round_collectives must be allreduce or allgather rounds, got {rounds}")
    if cls.summable and rounds[-1] != "allreduce":
        raise _fail(cls, "a summable compressor's last round must be an allreduce")
    if cls.payload_estimate not in ESTIMATES:
        raise _fail(cls, f"payload_estimate must be one of {', '.join(ESTIMATES)}")
    if cls.cast_dtype is not None and not isinstance(getattr(torch, cls.cast_dtype, None),
                                                     torch.dtype):
        raise _fail(cls, f"cast_dtype {cls.cast_dtype!r} is not a torch dtype")
    if cls.requires_ef and not cls.default_ef:
        raise _fail(cls, "requires_ef needs default_ef")
    if cls.kernel not in (None, TRITON):
        raise _fail(cls, f"kernel must be None or {TRITON!r}, got {cls.kernel!r}")
    for key, param in cls.params.items():
        if not param.valid(param.default):
            raise _fail(cls, f"parameter {key}'s default {param.default!r} breaks its rule")
    if cls.ladder is not None:
        key, settings = cls.ladder
        if key not in cls.params or not settings or \
                not all(cls.params[key].valid(value) for value in settings):
            raise _fail(cls, f"its ladder must move one of its parameters through valid "
                             f"settings, got {cls.ladder!r}")


def check_specs(cls: type[Compressor]) -> None:
    """The canonical spec parses back to itself, with error feedback on and off."""
    for ef in (None, True, False):
        compressor = _default(cls, ef)
        again = from_spec(compressor.spec)
        if again.spec != compressor.spec or again.error_feedback != compressor.error_feedback:
            raise _fail(cls, f"spec {compressor.spec!r} parses back to {again.spec!r}")


def check_payload_sizes(cls: type[Compressor]) -> None:
    """What travels matches :meth:`~bytecomp.compress.base.Compressor.payload_bytes`:
    exactly on average over two steps for a fixed size, at most it for a bound."""
    for dtype in DTYPES:
        for numel in SIZES:
            compressor = _default(cls)
            state: dict = {}
            x = _sample(numel, numel, dtype)
            first = encode(compressor, x, state).bytes_sent
            second = encode(compressor, x, state).bytes_sent
            declared = compressor.payload_bytes(numel, x.element_size())
            if compressor.fixed_size and first + second != 2 * declared:
                raise _fail(cls, f"{numel} {dtype} elements sent {first} and {second} bytes, "
                                 f"declared {declared} a step")
            if not compressor.fixed_size and compressor.payload_estimate == "bound" and \
                    max(first, second) > declared:
                raise _fail(cls, f"{numel} {dtype} elements sent {max(first, second)} bytes, "
                                 f"above the declared bound {declared}")


def check_roundtrip(cls: type[Compressor]) -> None:
    """Decompression keeps the shape and dtype, and finite inputs stay finite."""
    for dtype in DTYPES:
        for numel in SIZES:
            compressor = _default(cls)
            state: dict = {}
            x = _sample(numel, 7 + numel, dtype)
            for _ in range(2):
                out, _ = roundtrip(compressor, x, state)
                if out.shape != x.shape or out.dtype != x.dtype:
                    raise _fail(cls, f"{numel} {dtype} elements came back as {out.dtype} "
                                     f"{tuple(out.shape)}")
                if not torch.isfinite(out.float()).all():
                    raise _fail(cls, f"{numel} {dtype} elements came back not finite")


def check_error_feedback(cls: type[Compressor]) -> None:
    """With error feedback, what was sent plus the residual is everything given
    (telescoping), and a metered state records the two squared norms of the gain."""
    compressor = _default(cls, ef=True)
    if not compressor.error_feedback:
        return
    state: dict = {"meter": True}
    sent = torch.zeros(3000, dtype=torch.float64)
    given = torch.zeros(3000, dtype=torch.float64)
    for step in range(6):
        x = _sample(3000, 100 + step)
        transmitted, _ = roundtrip(compressor, x, state)
        sent += transmitted.double()
        given += x.double()
    total = sent + state["residual"].double()
    if not torch.allclose(total, given, atol=1e-4 * given.abs().max().item()):
        raise _fail(cls, f"error feedback loses {(total - given).abs().max().item():.3g} over "
                         f"6 steps: sent + residual must equal what was given")
    if "sq_norm" not in state or "sq_error" not in state:
        raise _fail(cls, "a metered state must record sq_norm and sq_error")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check_approximation(cls: type[Compressor]) -> None:
    """A single-round compressor's own approximation of its payload (what error feedback
    keeps the gradient less) is its decompression, to the bit, zeros of both signs and
    all."""
    compressor = _default(cls, ef=False)
    if compressor.rounds != 1:
        return
    for dtype in DTYPES:
        x = _sample(1001, 3, dtype)
        x[:250] = 0.0
        x[250:333] = -0.0
        for sample in (x, torch.zeros(64, dtype=dtype)):
            payload, ctx = compressor.compress(sample, {})
            if not _same_bits(compressor.approximation(payload, ctx, sample),
                              compressor.decompress(payload, ctx)):
                raise _fail(cls, f"approximation differs from decompress in {dtype}")


def check_aggregate(cls: type[Compressor]) -> None:
    """A gatherable single-round compressor's aggregate is the mean of the ranks'
    decompressions, summed in rank order in float32: what every rank must compute alike."""
    compressor = _default(cls, ef=False)
    if compressor.rounds != 1 or not compressor.gatherable:
        return
    for dtype in DTYPES:
        payloads, ctx = [], None
        for rank in range(3):
            payload, ctx = compressor.compress(_sample(777, 10 + rank, dtype), {"salt": 5},
                                               Peers(rank, 3))
            payloads.append(payload)
        ours = compressor.aggregate_into(payloads, ctx, torch.empty(777, dtype=dtype))
        default = Compressor.aggregate_into(compressor, payloads, ctx,
                                            torch.empty(777, dtype=dtype))
        if not torch.equal(ours, default):
            raise _fail(cls, f"aggregate_into differs from the rank-order float32 mean in "
                             f"{dtype}")


def check_summable(cls: type[Compressor]) -> None:
    """A summable single-round compressor's payloads average: decompressing the element-wise
    mean of the ranks' payloads gives the mean of their decompressions (to float32
    rounding), so an allreduce of payloads is the average."""
    compressor = _default(cls, ef=False)
    if not compressor.summable or compressor.rounds != 1:
        return
    sent = [compressor.compress(_sample(2000, 40 + rank), {"salt": 9}, Peers(rank, 2))
            for rank in range(2)]
    mean_payload = [torch.stack([p.float() for p in parts]).mean(0).to(parts[0].dtype)
                    for parts in zip(*(payload for payload, _ in sent))]
    averaged = compressor.decompress(mean_payload, sent[0][1]).float()
    means = (compressor.decompress(*sent[0]).float() + compressor.decompress(*sent[1]).float()) / 2
    scale = means.abs().max().item() or 1.0
    if not torch.allclose(averaged, means, atol=1e-2 * scale):
        raise _fail(cls, "decompressing the mean of payloads is not the mean of the "
                         "decompressions: it is not summable")


def check_agreement(cls: type[Compressor]) -> None:
    """Two ranks with the same input and equal fresh states send the same payload: its
    randomness comes from seeds, so ranks and runs agree."""
    compressor = _default(cls)
    x = _sample(1500, 11)
    first = encode(compressor, x.clone(), {"salt": 3})
    second = encode(_default(cls), x.clone(), {"salt": 3})
    if len(first.payload) != len(second.payload) or not all(
            torch.equal(a, b) for a, b in zip(first.payload, second.payload)):
        raise _fail(cls, "the same input and state gave different payloads (unseeded "
                         "randomness?)")


def check_checkpointable(cls: type[Compressor]) -> None:
    """The state a compressor keeps is plain (tensors, numbers, strings, lists, dicts): it
    survives ``torch.save`` and ``torch.load(weights_only=True)``."""
    compressor, state = _default(cls), {"salt": 1}
    for step in range(3):
        roundtrip(compressor, _sample(500, step), state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as error:  # noqa: BLE001  (what torch says is the reason)
        raise _fail(cls, f"its state does not load with weights_only=True ({error})") from None


def check_compresses(cls: type[Compressor]) -> None:
    """A fixed-size compressor that says it compresses declares fewer bytes than a large
    tensor has, at its defaults; the identity (``compresses = False``) declares them all.
    (A variable size depends on the data: a threshold may keep every element.)"""
    compressor = _default(cls)
    numel = 1 << 16
    sent = compressor.payload_bytes(numel, 4)
    if compressor.compresses and compressor.fixed_size and not sent < numel * 4:
        raise _fail(cls, f"compresses, yet declares {sent} bytes for {numel * 4}")
    if not compressor.compresses and sent != numel * 4:
        raise _fail(cls, f"does not compress, yet declares {sent} bytes for {numel * 4}")


CHECKS: dict[str, Callable[[type[Compressor]], None]] = {
    check.__name__.removeprefix("check_"): check
    for check in (check_declared, check_specs, check_payload_sizes, check_roundtrip,
                  check_error_feedback, check_approximation, check_aggregate, check_summable,
                  check_agreement, check_checkpointable, check_compresses)}


def check_compressor(cls: type[Compressor], only: list[str] | None = None) -> None:
    """Run every conformance check (or those named in ``only``, from :data:`CHECKS`) on the
    compressor class ``cls``; the first that fails raises an ``AssertionError`` naming
    the compressor and what it does wrong."""
    if not (isinstance(cls, type) and issubclass(cls, Compressor)):
        raise TypeError(f"check_compressor takes a Compressor subclass, got {cls!r}")
    for name in only or list(CHECKS):
        if name not in CHECKS:
            raise ValueError(f"no check named {name!r}; the checks: {', '.join(CHECKS)}")
        CHECKS[name](cls)


__all__ = ["CHECKS", "check_compressor"]
