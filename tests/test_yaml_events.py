"""Large YAML read from libyaml's events (bytecomp/yaml_events.py): the same document
the strict loader reads, or the strict loader decides."""

from __future__ import annotations

import pytest
import yaml

from bytecomp.errors import BytecompError
from bytecomp.safe_yaml import FAST_YAML_BYTES, YAML_MAX_DEPTH, _StrictLoader, load_yaml
from bytecomp.yaml_events import UNUSUAL, from_events

pytestmark = pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False),
                                reason="PyYAML without libyaml: the strict loader reads all")

PLAIN = [
    "a: 1\nb: [1, 2, {c: d}]\n", "", "---\n", "just a string", "1.5", "null",
    "a: 2001-12-14t21:59:43.10-05:00\n", "'a': \"b\"\n", "a: |\n  text\n  more\n",
    "a: yes\nb: off\nc: 0o17\nd: 017\ne: 0x1F\nf: .inf\ng: -.nan\nh: ~\ni: 1_000\nj: 190:20:30\n",
    "- 1\n- - 2\n  - 3\n", "%YAML 1.1\n---\na: 1\n", "\ufeffa: 1\n", "a: 1\n...\n",
]
UNUSUAL_TEXTS = [
    "a: &x 1\nb: *x\n", "<<: {a: 1}\n", "a: !!str 1\n", "a: 1\n---\nb: 2\n",
    "[" * 40 + "]" * 40, "a: 1\na: 2\n", "a: " + "9" * 5000 + "\n", "? [1, 2]\n: 3\n",
    "=: 1\n", "a: \x00", "a: b: c", "{a: 1, a: 1}", "%YAML 2.0\n---\na: 1\n", "a:\n\t- 1\n",
    "1: a\n1.0: b\n", "a: !!binary aGVsbG8=\n", "!foo 1", "a: [1, 2\n",
    "- !!python/object:os.system x", "a: 1\n...\n---\nb: 1\n",
]


@pytest.mark.parametrize("text", PLAIN)
def test_plain_documents_are_what_the_strict_loader_reads(text):
    assert repr(from_events(text, YAML_MAX_DEPTH)) == \
        repr(yaml.load(text, Loader=_StrictLoader))  # noqa: S506 (a SafeLoader)


@pytest.mark.parametrize("text", UNUSUAL_TEXTS)
def test_anything_else_is_left_to_the_strict_loader(text):
    assert from_events(text, YAML_MAX_DEPTH) is UNUSUAL


def _large(text: str) -> str:
    """``text`` after a comment that makes it larger than FAST_YAML_BYTES."""
    return "# " + "x" * FAST_YAML_BYTES + "\n" + text


def test_a_large_plan_reads_the_same_both_ways():
    entries = "".join(f"- name: layer{i}.weight\n  action: compress\n  compressor: fp16\n"
                      f"  place: device\n  collective: allreduce\n  group: {i // 3}\n"
                      for i in range(700))
    text = "format_version: 1\nbucket_cap_mb: 25.0\nnote: 'x: y'\ntensors:\n" + entries
    assert len(text) > FAST_YAML_BYTES
    assert load_yaml(text, "plan.yaml") == yaml.load(text, Loader=_StrictLoader)  # noqa: S506


@pytest.mark.parametrize("text", ["a: &x 1\nb: *x\n", "a: 1\na: 2\n", "a: 1\n---\nb: 2\n",
                                  "a: \x07\n", "- !!python/object:os.system x"])
def test_a_large_file_is_refused_as_a_small_one(text):
    """Anchors, duplicate keys, two documents, a control character, a Python tag: the
    same one-line error, whatever the size."""
    with pytest.raises(BytecompError) as small:
        load_yaml(text, "f.yaml")
    with pytest.raises(BytecompError) as large:
        load_yaml(_large(text), "f.yaml")
    assert str(small.value).split(" (")[0] == str(large.value).split(" (")[0]
    assert str(large.value).startswith("f.yaml: not valid YAML")
