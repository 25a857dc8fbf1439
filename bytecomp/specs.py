"""The ``name:key=value,...`` spec form, split in one place: compressor specs
(:mod:`bytecomp.compress.registry`), optimizer and scheduler specs
(:mod:`bytecomp.recipe`) and built-in model specs (:mod:`bytecomp.training.workloads`).

Each caller checks its own values (their kinds and ranges differ); the splitting and
its refusals (an empty spec, an unknown name, an empty item) are here. Light: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from bytecomp.errors import BytecompError

T = TypeVar("T")

Item = tuple[str, str, str]  # (key, "=" or "", value), each stripped


def split_name(spec: str, fold: bool = True) -> tuple[str, str]:
    """``(name, rest)`` of ``spec``: the text before the first ``:`` and after it. ``fold``:
    the name stripped and lower-cased (else as written, so that ``"mlp :x"`` names no
    built-in model)."""
    name, _, rest = spec.strip().partition(":")
    return (name.strip().lower() if fold else name), rest


def split_items(rest: str, where: str, shown: str, noun: str = "parameter",
                error: type[BytecompError] = BytecompError) -> list[Item]:
    """The ``key=value`` items of ``rest`` (after the name), comma-separated; ``error``
    (``where: 'shown' has an empty parameter ...``) for an empty one."""
    items = [part.strip() for part in rest.split(",")] if rest.strip() else []
    if "" in items:
        raise error(f"{where}: {shown!r} has an empty {noun} ({noun}s are key=value, one "
                    f"comma between two)")
    return [(key.strip(), equals, value.strip())
            for key, equals, value in (item.partition("=") for item in items)]


def parse_spec(spec: object, kind: str, table: Mapping[str, T], where: str = "{kind} {name}",
               choose: str = "choose from ",
               error: type[BytecompError] = BytecompError) -> tuple[str, T, list[Item]]:
    """A spec of ``kind`` (``"optimizer"``, ``"compressor"``) whose name is one of
    ``table``: ``(name, table[name], items)``. ``error`` for an empty spec or an unknown
    name (``choose`` and the names follow), or an empty item (after ``where``, formatted
    with ``kind`` and ``name``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise error(f"empty {kind} spec; {choose}{', '.join(table)}")
    name, rest = split_name(spec)
    entry = table.get(name)
    if entry is None:
        raise error(f"unknown {kind} {name!r}; {choose}{', '.join(table)}")
    return name, entry, split_items(rest, where.format(kind=kind, name=name), spec.strip(),
                                    error=error)
