"""What the readers of bytecomp's files share: the failure line, the field reader, the
document reader and the limits (each declared once) that plan files
(:mod:`bytecomp.plan_file`), profiles (:mod:`bytecomp.profile_store`) and calibrations
(:mod:`bytecomp.profiler.calibration_file`) are checked against.

Every failure is one line, ``PATH: MESSAGE`` (:func:`fail`), a
:class:`~bytecomp.errors.BytecompError`. Torch-free and pandas-free: a training job reads
its plan through it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeGuard

from bytecomp.errors import BytecompError
from bytecomp.files import control_character
from bytecomp.safe_yaml import read_yaml_file

# Bounds on what a real file can hold: beyond them a number is an error, not a model.
MAX_INTEGER = 1 << 50  # elements or bytes
MAX_MS = 1e7  # a measured time: 2.8 hours
MAX_COUNT = 1 << 20  # ranks, nodes, batch
MAX_SECONDS = 1e7  # informative durations (a stage, the probe, a verification): about four months
MAX_BUCKET_CAP_MB = 1e6
MAX_PREDICTED_MS = 1e9  # a predicted step time
# A measured steps factor's cap: "it does not learn", beyond any step budget worth
# planning for (the convergence probe's bytecomp.training.probe.MAX_FACTOR)
MAX_STEPS_FACTOR = 10.0
# what a trained comparison (the convergence probe, a verified plan's finalists) measured
# its losses on (bytecomp.training.workloads)
PROBE_BATCHES = ("validation", "held-out training batches")


def fail(path: Path | str, message: str) -> NoReturn:
    """Refuse the file (or object) ``path``: one line, ``PATH: MESSAGE``."""
    raise BytecompError(f"{path}: {message}")


class Reader:
    """Reads the fields of a file's mappings, failing as ``PATH: WHERE: REASON``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, reason: str) -> NoReturn:
        fail(self.path, f"{where}: {reason}")

    def field(self, data: dict, key: str, kinds, where: str = ""):
        """``data[key]``, of one of ``kinds`` (a bool is no number); ``where``: the
        mapping's place, as the message names it (``levels[0].``)."""
        label = f"{where}{key}"
        if key not in data:
            self.fail(label, "missing")
        value = data[key]
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            self.fail(label, f"must be {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            self.fail(label, f"must be {_kind_names(kinds)}, got {type(value).__name__}")
        return value

    def check(self, where: str, value, check: Check) -> None:
        """``value`` within its declared range or choices (``check``)."""
        problem = check.problem(value)
        if problem:
            self.fail(where, problem)

    def declared(self, data: dict, key: str, kinds, check: Check,
                 where: str = ""):
        """``data[key]``, of one of ``kinds`` (:meth:`field`) and within ``check``."""
        value = self.field(data, key, kinds, where)
        self.check(f"{where}{key}", value, check)
        return value

    def printable(self, where: str, name: str) -> None:
        """A name that is printed holds no control character."""
        control = control_character(name)
        if control:
            self.fail(where, f"holds the control character {control} (a name is printed: no "
                             f"escape sequences)")


def _kind_names(kinds) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def is_number(value) -> TypeGuard[int | float]:
    """An int or a float, not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float))


def number_in(value, low: float, high: float) -> TypeGuard[int | float]:
    """A number (not a bool) from ``low`` to ``high``; false for NaN."""
    return is_number(value) and low <= value <= high


@dataclass(frozen=True)
class Integer:
    """A declared field's range: an integer from ``least`` to ``most`` (a bool is no
    integer), its ``unit`` named after the range."""

    least: int
    most: int
    unit: str = ""

    def problem(self, value) -> str | None:
        """Why ``value`` is refused (the message after ``FIELD: ``), or None."""
        if isinstance(value, bool) or not isinstance(value, int) or \
                not self.least <= value <= self.most:
            unit = f" ({self.unit})" if self.unit else ""
            return f"must be an integer from {self.least:,} to {self.most:,}{unit}, got {value!r}"
        return None


@dataclass(frozen=True)
class Number:
    """A declared field's range: a number (an int or a float, not a bool, not NaN) from
    ``low`` to ``high``; ``optional``: or None (null in the file)."""

    low: float
    high: float
    optional: bool = False

    def problem(self, value) -> str | None:
        if not (self.optional and value is None) and not number_in(value, self.low, self.high):
            null = " or null" if self.optional else ""
            return f"must be a number from {self.low:g} to {self.high:g}{null}, got {value!r}"
        return None


@dataclass(frozen=True)
class OneOf:
    """A declared field's choices."""

    choices: tuple[str, ...]

    def problem(self, value) -> str | None:
        if value not in self.choices:
            return f"{value!r} is not one of {', '.join(self.choices)}"
        return None


@dataclass(frozen=True)
class Rule:
    """A declared field's test and what its refusal ``says`` (formatted with the
    ``value``), for the forms the ranges above do not write (``must be true or false``)."""

    test: Callable[[Any], bool]
    says: str

    def problem(self, value) -> str | None:
        return None if self.test(value) else self.says.format(value=value)


# a count of ranks, nodes or samples in a file's head (an integer already: its reader's
# type check), as the plan, the profile and the calibration hold them
COUNT = Rule(lambda value: 1 <= value <= MAX_COUNT, f"must be between 1 and {MAX_COUNT:,}")
Check = Integer | Number | OneOf | Rule  # what a field is declared with
Fields = dict[str, tuple[Any, Check]]  # a section's fields: each key's default and check


def declared(default: Any, check: Check) -> Any:
    """A dataclass field with its ``default`` and its range or choices (``check``),
    declared once: the file readers check against it (:func:`check_of`) and the
    options name its bounds."""
    return dataclasses.field(default=default, metadata={"check": check})


def check_of(cls, name: str) -> Any:
    """The range or choices declared on ``cls``'s field ``name`` (:func:`declared`)."""
    return next(item.metadata["check"] for item in dataclasses.fields(cls)
                if item.name == name)


def check_field(path: Path | str, name: str, value, check: Check) -> None:
    """A document's field ``name`` (dotted) within its declared range, choices or rule:
    ``PATH: field 'NAME' REASON``, as profile.yaml's and calibration.yaml's checks say it."""
    problem = check.problem(value)
    if problem:
        fail(path, f"field '{name}' {problem}")


def check_fields(path: Path | str, section: str, entry: dict,
                 fields: Fields) -> None:
    """Each of a mapping's declared ``fields`` (key: its default where absent, and its
    check), in their order: :func:`check_field` of ``SECTION.KEY``."""
    for key, (default, check) in fields.items():
        check_field(path, f"{section}.{key}", entry.get(key, default), check)


def check_section(path: Path | str, section: str, entry, fields: Fields) -> None:
    """An optional section of a document (None: absent): a mapping of its declared
    ``fields`` (:func:`check_fields`)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        fail(path, f"field '{section}' must be a mapping")
    check_fields(path, section, entry, fields)


def iso_time(value) -> bool:
    """A time as ISO 8601 text."""
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def check_finite(path: Path | str, value, where: str = "") -> None:
    """Every number anywhere in a document must be finite (a NaN compares false with
    everything, so it slips through range checks and hangs or corrupts the models)."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(path, item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_finite(path, item, f"{where}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        fail(path, f"field '{where}' is {value} (must be a finite number)")


def read_document(path: Path, what: str, required: dict, version: int) -> dict:
    """A bytecomp YAML document (profile.yaml, calibration.yaml): a mapping with the
    ``required`` fields of their types (a bool is no number), every number finite, of
    format ``version``; else one line naming ``path``."""
    return check_document(path, read_yaml_file(path, what), required, version)


def check_document(path: Path | str, meta, required: dict, version: int) -> dict:
    """:func:`read_document`'s checks of a document already read (``meta``)."""
    if not isinstance(meta, dict):
        fail(path, "must be a YAML mapping")
    for key, kind in required.items():
        if key not in meta:
            fail(path, f"missing field '{key}'")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            fail(path, f"field '{key}' has the wrong type ({type(meta[key]).__name__})")
    check_finite(path, meta)
    if meta["format_version"] != version:
        fail(path, f"format_version {meta['format_version']} is not supported "
                   f"(this bytecomp reads {version})")
    return meta
