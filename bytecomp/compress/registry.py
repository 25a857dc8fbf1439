"""Compressor specs: ``name[:key=value,...]`` strings, parsed and validated in one place,
and the registry of compressors they name.

A compressor registers itself beside its implementation with :func:`register`::

    @register
    class FP8(Cast):
        name = "fp8"
        ...

``bytecomp.compress`` imports the built-in ones; a compressor defined anywhere else is
available (to specs, ``bytecomp compressors``, the profiler, the planner and
``apply_plan``) once its module is imported. :func:`bytecomp.testing.check_compressor`
is the conformance check every compressor should pass.
"""

from __future__ import annotations

from typing import TypeVar

from bytecomp.compress.base import Compressor, Param, format_value
from bytecomp.compress.feedback import ErrorFeedback
from bytecomp.errors import SpecError
from bytecomp.specs import parse_spec

COMPRESSORS: dict[str, type[Compressor]] = {}  # by name, in the order they registered

C = TypeVar("C", bound=type[Compressor])


def register(cls: C) -> C:
    """Class decorator: make the compressor ``cls`` available by its ``name`` (a lower-case
    word, unique). Registering the same class again (a module imported twice) is
    harmless; another class under a taken name is an error."""
    name = cls.name
    if not name or name != name.strip().lower() or any(c in name for c in ":,= "):
        raise ValueError(f"{cls.__name__}: a compressor's name must be a lower-case word "
                         f"without ':', ',', '=' or spaces, got {name!r}")
    known = COMPRESSORS.get(name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise ValueError(f"a compressor named {name!r} is registered already "
                         f"({known.__module__}.{known.__qualname__})")
    if cls.ladder is not None and cls.ladder[0] not in cls.params:
        raise ValueError(f"{cls.__name__}: its ladder moves {cls.ladder[0]!r}, which is not "
                         f"one of its parameters")
    COMPRESSORS[name] = cls
    return cls


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
    name, cls, items = parse_spec(spec, "compressor", COMPRESSORS, where="{name}",
                                  choose="choose from: ", error=SpecError)
    allowed = parameters_of(cls)
    values = {}
    for key, equals, text in items:
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


def ladder_families() -> dict[str, tuple[str, tuple]]:
    """The families an adaptive plan can move along (each compressor's ``ladder``): the
    parameter that sets how hard they compress, and its settings from mild to
    aggressive."""
    return {name: cls.ladder for name, cls in COMPRESSORS.items() if cls.ladder is not None}


def ladder_specs(family: str) -> list[str]:
    """The default ladder of ``family``, mild to aggressive: ``topk`` ->
    ``["topk:ratio=0.1", "topk:ratio=0.05", ..., "topk:ratio=0.000195313"]``."""
    ladders = ladder_families()
    if family not in ladders:
        raise SpecError(f"no adaptive ladder for {family!r}; families with one: "
                        f"{', '.join(ladders)}")
    key, values = ladders[family]
    return [canonical(f"{family}:{key}={format_value(value)}") for value in values]


def ladder_place(spec: str) -> tuple[str, float] | None:
    """``(family, mildness)`` of a spec whose compressor has a ladder (a larger
    mildness compresses less), or None."""
    compressor = from_spec(spec)
    if compressor.ladder is None:
        return None
    return compressor.name, float(compressor.values[compressor.ladder[0]])


def default_specs() -> list[str]:
    """Every compressor at its default parameters."""
    return [canonical(name) for name in COMPRESSORS]
