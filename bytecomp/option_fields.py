"""An option of a command, declared once, and the checks of its values.

:func:`option` declares a field of an options dataclass (:mod:`bytecomp.options` holds
one per command): its default and help; ``names``, its command-line spellings where they
are not ``--field-name`` (a flag with no ``--no-`` form, a short name); ``min``, click's
lower bound; ``path``, a file or directory (an ``os.PathLike`` is taken too); ``cli``
False keeps a field out of the command line (a Python-only option).

:meth:`Options.build` checks every value against its field's declared type first
(:func:`checked_value`: a bool is no number, a string no flag, every number finite and
at most :data:`MAX_NUMBER` in size, at least ``min``), then ``check()`` range-checks
them; either way one :class:`~bytecomp.errors.BytecompError` line, naming the option as
the command line spells it (:func:`cli_name`), before any work.
"""

from __future__ import annotations

import math
import numbers
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import Field, field, fields
from typing import Any

from bytecomp.errors import BytecompError

MAX_NUMBER = 10**9  # every number option's magnitude (seconds, MB, steps, counts, ...)


def option(default: Any, help: str, *names: str, min: int | None = None,
           cli: bool = True, path: bool = False) -> Any:
    """A command's option: its default, its help, and where they differ from the field's
    name, its command-line spellings; ``path``: a file or directory."""
    return field(default=default, metadata={"help": help, "names": names, "min": min,
                                            "cli": cli, "path": path})


def default_of(options: type, name: str) -> Any:
    """The default of option ``name`` of the options dataclass ``options``, for a stage's
    configuration that has the same setting (declared once, on the options)."""
    for item in fields(options):
        if item.name == name:
            return item.default
    raise KeyError(name)


def describe(value: Any) -> str:
    """A value as a message shows it: its type and a short repr (a huge int by its size:
    Python will not print one of more than 4,300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**15:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _number(name: str, kind: type, value: Any, least: float | None) -> int | float:
    """``value`` as an option of type ``kind`` (int or float), in range; else one line."""
    lowest = -MAX_NUMBER if least is None else least
    span = f"from {lowest:,} to {MAX_NUMBER:,}" if least is not None \
        else f"of at most {MAX_NUMBER:,} in size"
    if kind is int:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise BytecompError(f"{name} must be an integer (not a bool, a float or a "
                                f"string), got {describe(value)}")
        if not lowest <= int(value) <= MAX_NUMBER:
            raise BytecompError(f"{name} must be an integer {span}, got {describe(value)}")
        return int(value)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise BytecompError(f"{name} must be a number (an int or a float; not a bool or a "
                            f"string), got {describe(value)}")
    try:
        number = float(value) + 0.0  # + 0.0: -0.0 is 0
    except OverflowError:  # an int beyond the floats
        number = math.inf
    if not (math.isfinite(number) and lowest <= number <= MAX_NUMBER):
        raise BytecompError(f"{name} must be a finite number {span}, got {describe(value)}")
    return number


def _scalar(name: str, kind: Any, value: Any, meta: Mapping) -> Any:
    if kind is bool:
        if value is not True and value is not False:
            raise BytecompError(f"{name} is a flag: True or False, got {describe(value)}")
        return value
    if kind in (int, float):
        return _number(name, kind, value, meta.get("min"))
    if kind is not str:  # a type no option has had: its rule goes here
        raise TypeError(f"{name}: no check for options of type {kind!r}")
    if meta.get("path") and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        what = "a path (a str or an os.PathLike)" if meta.get("path") else "a string"
        raise BytecompError(f"{name} must be {what}, got {describe(value)}")
    return value


def checked_value(name: str, hint: Any, value: Any, meta: Mapping) -> Any:
    """``value`` checked against an option's declared type ``hint`` (``int``,
    ``float | None``, ``tuple[str, ...]``: a repeatable option takes one value or a
    list) and its metadata (``min``, ``path``), as the option is stored (an int as a
    float where a float is declared, a path as a str); else one line naming ``name``."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    if value is None and type(None) in members:
        return None
    kind = next(member for member in members if member is not type(None))
    if typing.get_origin(kind) is not tuple:
        return _scalar(name, kind, value, meta)
    element = typing.get_args(kind)[0]
    if value is None:  # the command line's "not given"
        return ()
    items = value if isinstance(value, (list, tuple)) else (value,)
    return tuple(_scalar(name, element, item, meta) for item in items)


def path_argument(value: Any, command: str, what: str) -> str:
    """A positional path of ``bytecomp.<command>()`` (``what``: its name in the message)
    as a str, from a str or an os.PathLike; else one line."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise BytecompError(f"bytecomp.{command}(): {what} must be a path (a str or an "
                            f"os.PathLike), got {describe(value)}")
    return path


class Options:
    """What every options dataclass has: built from keyword arguments with one line for
    a name it does not have, and a check of every value."""

    command = ""

    @classmethod
    def build(cls, given: Options | Mapping[str, Any] | None = None, **values: Any):
        """``cls`` from ``given`` (an instance or a mapping, or None) overridden by
        ``values``, each value checked against its field's declared type
        (:func:`checked_value`: a repeatable option as a tuple, from a list, one value or
        None), then :meth:`check`; one line naming any unknown option or bad value."""
        if given is not None and not isinstance(given, (cls, Mapping)):
            raise BytecompError(f"bytecomp.{cls.command}(): options must be a {cls.__name__} "
                                f"or a dict of its options, got {describe(given)}")
        base = dict(given.__dict__ if isinstance(given, Options) else given or {})
        base.update(values)
        declared: dict[str, Field] = {item.name: item for item in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(str(name) for name in set(base) - set(declared))
        if unknown:
            import difflib  # a close match, as the command line suggests one

            close = difflib.get_close_matches(unknown[0], list(declared), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BytecompError(f"bytecomp.{cls.command}() has no option "
                                f"{', '.join(map(repr, unknown))}{hint}; its options: "
                                f"{', '.join(sorted(declared))}")
        hints = typing.get_type_hints(cls)
        checked = {name: checked_value(cli_name(cls, name), hints[name], value,
                                       declared[name].metadata)
                   for name, value in base.items()}
        built = cls(**checked)
        built.check()
        return built

    def check(self) -> None:
        """Range-check the values; one line for the first that is out of range."""


def cli_name(cls, name: str) -> str:
    """The command-line spelling of field ``name`` of ``cls``."""
    for item in fields(cls):
        if item.name == name:
            spelled = [n for n in item.metadata.get("names", ()) if n.startswith("--")]
            return spelled[0] if spelled else "--" + name.replace("_", "-")
    raise KeyError(name)
