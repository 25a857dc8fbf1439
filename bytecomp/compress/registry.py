"""Compressor specs: ``name[:key=value,...]`` strings, parsed and validated in one place."""

from __future__ import annotations

from bytecomp.compress.base import Compressor, Param, format_value
from bytecomp.compress.exdyna import ExDyna
from bytecomp.compress.feedback import ErrorFeedback
from bytecomp.compress.lowrank import ACPSGD, PowerSGD
from bytecomp.compress.quantize import BF16, FP16, QSGD, Int8, NoCompression, TernGrad
from bytecomp.compress.sign import EFSignSGD, OneBit, SignSGD, Signum
from bytecomp.compress.sparse import DGC, RandomK, Threshold, TopK
from bytecomp.errors import SpecError

COMPRESSORS: dict[str, type[Compressor]] = {
    cls.name: cls
    for cls in (NoCompression, FP16, BF16, Int8, TopK, RandomK, DGC, Threshold, QSGD,
                TernGrad, SignSGD, Signum, EFSignSGD, OneBit, PowerSGD, ACPSGD, ExDyna)
}

_EF = Param(bool, False, help="error feedback (residual memory)")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_value(name: str, key: str, param: Param, text: str) -> bool | int | float | str:
    value: bool | int | float | str
    try:
        if param.kind is bool:
            lowered = text.lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError
            value = lowered in _TRUE
        elif param.kind is int:
            value = int(text)
        elif param.kind is float:
            value = float(text)
        else:
            value = text
    except ValueError:
        raise SpecError(
            f"{name}: {key}={text!r} is not a valid {param.kind.__name__} "
            f"(expected {param.describe()})"
        ) from None
    if not param.valid(value):
        raise SpecError(f"{name}: {key}={format_value(value)} is out of range "
                        f"(expected {param.describe()})")
    return value


def parameters_of(cls: type[Compressor]) -> dict[str, Param]:
    """The parameters a spec may set for ``cls``, ``ef`` included."""
    return {**cls.params, "ef": Param(bool, cls.default_ef, help=_EF.help, primary=False)}


def from_spec(spec: str | Compressor) -> Compressor:
    """Parse ``spec`` (e.g. ``"topk:ratio=0.01"``, ``"powersgd:rank=4,ef=false"``).

    Returns a ready compressor, wrapped in :class:`ErrorFeedback` when error
    feedback is on (the compressor's default unless ``ef=`` says otherwise).
    Raises :class:`~bytecomp.errors.SpecError` (a ``ValueError``) naming the
    valid choices for an unknown name or parameter or an out-of-range value.

    >>> from_spec("topk:ratio=0.01").spec
    'topk:ratio=0.01'
    """
    if isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty compressor spec; choose from: {', '.join(COMPRESSORS)}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    cls = COMPRESSORS.get(name)
    if cls is None:
        raise SpecError(f"unknown compressor {name!r}; choose from: {', '.join(COMPRESSORS)}")
    allowed = parameters_of(cls)
    values = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, equals, text = (s.strip() for s in item.partition("="))
        if key not in allowed:
            valid = ", ".join(allowed)
            raise SpecError(f"{name}: unknown parameter {key!r}; valid parameters: {valid}")
        if not equals or not text:
            raise SpecError(f"{name}: parameter {key!r} needs a value ({key}=...)")
        if key in values:
            raise SpecError(f"{name}: parameter {key!r} given twice")
        values[key] = _parse_value(name, key, allowed[key], text)
    error_feedback = values.pop("ef", cls.default_ef)
    if cls.requires_ef and not error_feedback:
        raise SpecError(f"{name} always uses error feedback; drop ef=false")
    compressor = cls(**values)
    return ErrorFeedback(compressor) if error_feedback else compressor


def canonical(spec: str | Compressor) -> str:
    """The canonical form of a spec: ``"topk"`` -> ``"topk:ratio=0.01"``."""
    return from_spec(spec).spec


# Families an adaptive plan can move along: the parameter that sets how hard they
# compress, and its settings from mild to aggressive. Sparsifiers follow GraVAC: a
# compression factor from 0.1 halving down to 1e-4 (values as their specs print them).
_FACTORS = tuple(float(f"{0.1 / 2 ** k:.6g}") for k in range(10))
LADDERS: dict[str, tuple[str, tuple]] = {
    "topk": ("ratio", _FACTORS), "randomk": ("ratio", _FACTORS), "dgc": ("ratio", _FACTORS),
    "exdyna": ("density", _FACTORS), "powersgd": ("rank", (16, 8, 4, 2, 1)),
    "acpsgd": ("rank", (16, 8, 4, 2, 1)),
}


def ladder_specs(family: str) -> list[str]:
    """The default ladder of ``family``, mild to aggressive: ``topk`` ->
    ``["topk:ratio=0.1", "topk:ratio=0.05", ..., "topk:ratio=0.000195313"]``."""
    if family not in LADDERS:
        raise SpecError(f"no adaptive ladder for {family!r}; families with one: "
                        f"{', '.join(LADDERS)}")
    key, values = LADDERS[family]
    return [canonical(f"{family}:{key}={format_value(value)}") for value in values]


def ladder_place(spec: str) -> tuple[str, float] | None:
    """``(family, mildness)`` of a spec whose compressor has a ladder (a larger
    mildness compresses less), or None."""
    compressor = from_spec(spec)
    if compressor.name not in LADDERS:
        return None
    return compressor.name, float(compressor.values[LADDERS[compressor.name][0]])


def default_specs() -> list[str]:
    """Every compressor at its default parameters."""
    return [canonical(name) for name in COMPRESSORS]
