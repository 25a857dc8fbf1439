"""Large YAML documents read fast: built from libyaml's events, or not at all.

A plan of 20,000 tensors is a 2 MB YAML file that PyYAML's Python loader takes 7 s
to read (its composer, resolver and constructor run per node); libyaml's parser gives
the same document's events in a tenth of that. :func:`from_events` builds the
document from them for what bytecomp's own files are, plain mappings, sequences and
scalars, each distinct scalar resolved and constructed once by ``yaml.SafeLoader``'s
own resolver and constructors, and gives up (:data:`UNUSUAL`) on anything else:
anchors, aliases, tags, merge keys, duplicate or collection keys, more than one
document, nesting near :data:`bytecomp.safe_yaml.YAML_MAX_DEPTH`, characters the Python
reader refuses, an error of any kind, or no libyaml. The caller then reads the text
with its strict loader, which decides (and words any error) as before, so a document
read here is the one that loader returns.
"""

from __future__ import annotations

import re

import yaml
from yaml.events import (
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)

UNUSUAL = object()  # from_events' answer where the strict loader must decide
# what PyYAML's reader refuses (yaml.reader.Reader.NON_PRINTABLE)
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD"
                            "\U00010000-\U0010ffff]")
_SPECIAL_TAGS = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")
_NO_KEY = object()


class _Unusual(Exception):
    pass


def from_events(text: str, max_depth: int):
    """The document in ``text`` as ``yaml.safe_load`` reads it, or :data:`UNUSUAL` (see
    the module docstring); ``max_depth``: nesting at which to give up."""
    if not getattr(yaml, "__with_libyaml__", False) or _NON_PRINTABLE.search(text):
        return UNUSUAL
    loader = yaml.CSafeLoader(text)
    try:
        return _build(loader, max_depth)
    except Exception:  # noqa: BLE001 (whatever it is, the strict loader says it)
        return UNUSUAL
    finally:
        loader.dispose()


def _build(loader, max_depth: int):
    get = loader.get_event
    constructors = loader.yaml_constructors
    scalars: dict = {}  # (value, plain) -> what it constructs to (immutable: shared)
    if type(get()) is not StreamStartEvent:
        raise _Unusual
    event = get()
    if type(event) is StreamEndEvent:
        return None
    if type(event) is not DocumentStartEvent:
        raise _Unusual
    stack: list[list] = []  # the open collections: [container, pending key]
    root = None
    while True:
        event = get()
        kind = type(event)
        if kind is ScalarEvent:
            if event.anchor is not None or event.tag is not None:
                raise _Unusual
            key = (event.value, event.implicit[0])
            value = scalars.get(key, _NO_KEY)
            if value is _NO_KEY:
                tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
                if tag in _SPECIAL_TAGS:
                    raise _Unusual
                value = scalars[key] = constructors[tag](loader,
                                                         yaml.ScalarNode(tag, event.value))
            collection = False
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.anchor is not None or event.tag is not None or \
                    len(stack) >= max_depth - 2:
                raise _Unusual
            stack.append([{} if kind is MappingStartEvent else [], _NO_KEY])
            continue
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            value, collection = stack.pop()[0], True
        elif kind is DocumentEndEvent:
            if type(get()) is not StreamEndEvent:
                raise _Unusual  # a second document
            return root
        else:
            raise _Unusual  # an alias
        if not stack:
            root = value
            continue
        top = stack[-1]
        container = top[0]
        if type(container) is list:
            container.append(value)
        elif top[1] is _NO_KEY:
            if collection or value in container:  # a collection as a key, or a duplicate
                raise _Unusual
            top[1] = value
        else:
            container[top[1]] = value
            top[1] = _NO_KEY
