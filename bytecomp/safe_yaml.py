"""YAML as bytecomp reads and writes it: the safe loader and the dumper that suits it.

:func:`load_yaml` parses with ``yaml.safe_load``'s types, no anchors or aliases (a
"billion laughs" file cannot expand), a bounded nesting depth (:data:`YAML_MAX_DEPTH`)
and no duplicate keys; :func:`read_yaml_file` reads the file through
:func:`bytecomp.files.read_text_file` first. :func:`dump_yaml` writes what
:func:`load_yaml` reads back.
"""

from __future__ import annotations

import os

import yaml

from bytecomp.errors import BytecompError
from bytecomp.files import read_text_file

YAML_MAX_DEPTH = 32  # plans, profiles and cluster configs nest 4 levels at most
# above this, YAML is first read from libyaml's events: every document, since even a
# 2 KB profile.yaml reads in 0.6 ms so against 6.6 ms in PyYAML's Python loader (a plan
# of 20,000 tensors: 0.25 s against 7 s)
FAST_YAML_BYTES = 0


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors and aliases, nesting or duplicate keys beyond
    reason: what a plan, profile or cluster file never needs and an attack does."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name) are not accepted",
                event.start_mark)
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {YAML_MAX_DEPTH} levels deep",
                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeConstructor reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


class _PlainDumper(yaml.SafeDumper):
    """Writes an object met twice in full, never as an anchor and alias (which
    :func:`load_yaml` refuses: bytecomp must read back what it writes)."""

    def ignore_aliases(self, data) -> bool:
        return True


def dump_yaml(data, **options) -> str:
    """``yaml.safe_dump`` without anchors or aliases."""
    return yaml.dump(data, Dumper=_PlainDumper, **options)


def load_yaml(text: str, label: str):
    """Parse YAML ``text`` with :class:`_StrictLoader`; errors name ``label`` (a path).
    A text of more than :data:`FAST_YAML_BYTES` is first read from libyaml's events
    (:mod:`bytecomp.yaml_events`: the same document, or that loader decides)."""
    if len(text) > FAST_YAML_BYTES:
        from bytecomp.yaml_events import UNUSUAL, from_events

        document = from_events(text, YAML_MAX_DEPTH)
        if document is not UNUSUAL:
            return document
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as error:
        reason = str(error).replace("\n", " ")
        raise BytecompError(f"{label}: not valid YAML ({' '.join(reason.split())[:200]})") \
            from None
    except (ValueError, OverflowError, RecursionError) as error:  # e.g. a 5,000-digit integer
        raise BytecompError(f"{label}: not valid YAML ({type(error).__name__}: "
                            f"{str(error)[:120]})") from None


def read_yaml_file(path: str | os.PathLike, what: str = "file"):
    """:func:`read_text_file`, then :func:`load_yaml`."""
    return load_yaml(read_text_file(path, what), str(path))
