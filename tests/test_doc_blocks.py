"""The fenced code blocks of the README and docs/ (docs/history.md aside: it is a record)
run as written, or say why they do not.

The convention (docs/development.md#code-blocks-in-the-docs):

- every block names its language: ``python`` and ``bash`` are programs; ``console`` (a
  command after ``$ `` and what it printed), ``text`` (output, usage lines, layouts) and
  ``yaml`` (files) are not;
- a program runs here, in a temporary directory laid out as a checkout (the shipped
  ``profiles/``, ``examples/`` and ``configs/``), unless the HTML comment on the line above
  its fence says otherwise:

  - ``<!-- not run: REASON -->``: not run, and why (what it needs that a test cannot have,
    or how long it takes and which test runs the same thing);
  - ``<!-- run by tests/FILE.py::TEST -->``: that test runs the block as written (it
    reads it from the page);
  - ``<!-- run: CHECK -->``: run here, then checked by ``CHECK``, one of :data:`CHECKS`;

- a block between ``<!-- BEGIN GENERATED: ... -->`` and ``<!-- END GENERATED -->`` is
  written by docs/generate.py, and ``tests/test_docs.py`` keeps it equal to what the code
  gives now: an ``api`` region holds signatures and the docstrings' examples (excerpts of
  a training script), a ``sample`` region what the commands printed when generate.py ran
  them.

A ``bash`` block runs its ``bytecomp`` commands in this process (the ``cli`` fixture:
what the console script does, without a new interpreter each); a line that is not a
``bytecomp`` command is not run here, so its block must be marked. A ``python`` block runs
in this process with ``__name__ == "__main__"``, and (slow tier) as a script of its own,
``python block.py``, as a reader saves and runs it: what a spawned rank does with a
script (it runs it again: the main guard) only shows there (:func:`run_script`).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_docs  # the pages, the history page
from conftest import working_directory

ROOT = Path(__file__).resolve().parents[1]
PAGES = [path for path in test_docs.markdown_files() if path != test_docs.HISTORY]
PROGRAMS = ("python", "bash")
NOT_PROGRAMS = ("console", "text", "yaml")
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<language>[^\s`]*)")
NOTE = re.compile(r"^<!--\s*(?P<text>.*?)\s*-->$")
BEGIN = re.compile(r"^<!-- BEGIN GENERATED: (?P<spec>[^>]*?) -->$")
END = "<!-- END GENERATED -->"
TEST_ID = re.compile(r"\btests/(?P<file>[\w/]+\.py)::(?P<name>\w+)")
# The checkout's files a block may name, as a reader in a clone has them.
CHECKOUT = ("examples", "configs")
MIN_REASON_WORDS = 4


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # the opening fence's line, from 1
    language: str
    code: str
    note: str | None  # the HTML comment on the line above the fence, without <!-- -->
    generated: str | None  # the spec of the generated region it is in ("api ...", ...)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_program(self) -> bool:
        return self.language in PROGRAMS


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    generated: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        begin = BEGIN.match(line)
        if begin:
            generated = begin.group("spec")
        elif line == END:
            generated = None
        fence = FENCE.match(line.lstrip())
        if not fence:
            index += 1
            continue
        closing = fence.group("fence")
        end = index + 1
        while end < len(lines) and not lines[end].lstrip().startswith(closing):
            end += 1
        above = NOTE.match(lines[index - 1].strip()) if index else None
        note = above.group("text") if above and not BEGIN.match(lines[index - 1]) else None
        indent = len(line) - len(line.lstrip())
        code = "\n".join(text[indent:] for text in lines[index + 1:end]) + "\n"
        found.append(Block(page, index + 1, fence.group("language"), code, note, generated))
        index = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ---------------------------------------------------------------- the convention


def test_the_pages_have_blocks_of_every_kind():
    """The parser finds what the pages hold: a guard against a parser that finds nothing."""
    languages = {block.language for block in ALL_BLOCKS}
    assert {"python", "bash", "console", "text", "yaml"} <= languages, languages
    assert any(block.generated and block.generated.startswith("api") for block in ALL_BLOCKS)
    assert any(block.note and block.note.startswith("not run:") for block in ALL_BLOCKS)


@pytest.mark.parametrize("note, expected", [
    ("not run: it needs root and network namespaces", None),
    ("not run: slow", "does not say why"),
    ("not run", "is none of"),
    ("run by tests/test_docs.py::no_such_test", "do not exist"),
    ("run by tests/test_docs.py", "names no tests/FILE.py::TEST"),
    ("run: as a --model factory", None),
    ("run: twice", "no check"),
    ("figures", None),
])
def test_a_mark_is_read_as_the_convention_says(note, expected):
    """What :func:`problem` says of a python block on README.md under each kind of mark."""
    found = problem(Block(test_docs.README, 1, "python", "pass\n", note, None))
    assert (found is None) if expected is None else (expected in found), found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_names_its_language(page):
    wrong = [f"{block.where}: ```{block.language}" for block in blocks(page)
             if block.language not in PROGRAMS + NOT_PROGRAMS]
    assert not wrong, f"blocks without a known language ({', '.join(PROGRAMS)}: programs; " \
                      f"{', '.join(NOT_PROGRAMS)}: output and files): {wrong}"


def _test_exists(match: re.Match) -> bool:
    path = ROOT / "tests" / match.group("file")
    return path.is_file() and re.search(rf"^def {match.group('name')}\(", path.read_text(),
                                        flags=re.MULTILINE) is not None


def problem(block: Block) -> str | None:
    """What is wrong with how ``block`` says whether it runs (``None``: nothing)."""
    if block.note is None:
        return None
    if block.note.startswith("not run:"):
        reason = block.note.removeprefix("not run:").strip()
        if len(reason.split()) < MIN_REASON_WORDS:
            return f"the reason {reason!r} does not say why"
    elif block.note.startswith("run by "):
        if not TEST_ID.fullmatch(block.note.removeprefix("run by ").strip()):
            return f"'run by' names no tests/FILE.py::TEST: {block.note!r}"
        test_file = ROOT / "tests" / TEST_ID.search(block.note).group("file")  # type: ignore
        if test_file.is_file() and block.page.name not in test_file.read_text():
            return f"{test_file.relative_to(ROOT)} does not read {block.page.name}"
    elif block.note.startswith("run:"):
        check = block.note.removeprefix("run:").strip()
        if check not in CHECKS:
            return f"no check {check!r} (known: {', '.join(CHECKS)})"
    elif re.match(r"(?i)(not\s+)?run\b", block.note):
        return f"{block.note!r} is none of `not run: REASON`, `run by tests/FILE.py::TEST`, " \
               f"`run: CHECK`"
    else:
        return None  # another comment (a figures marker, say): the block runs
    if not block.is_program:
        return f"marked {block.note!r}, but ```{block.language} is not a program"
    missing = [m.group(0) for m in TEST_ID.finditer(block.note) if not _test_exists(m)]
    if missing:
        return f"names tests that do not exist: {missing}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_mark_says_why_and_names_tests_that_exist(page):
    found = [f"{block.where}: {problem(block)}" for block in blocks(page) if problem(block)]
    assert not found, "\n".join(found)


def runs_here(block: Block) -> bool:
    """Whether this file runs ``block``: a program, not generated, not marked otherwise."""
    if not block.is_program or block.generated:
        return False
    return block.note is None or not block.note.startswith(("not run:", "run by "))


def not_bytecomp(block: Block) -> list[str]:
    """The commands of a bash block that this file cannot run: those not ``bytecomp``."""
    return [" ".join(argv) for argv in commands(block) if argv[0] != "bytecomp"]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_a_program_this_file_cannot_run_is_marked(page):
    """An unmarked bash block must be ``bytecomp`` commands alone (a pipe, a redirection,
    torchrun, pip, sudo or make is not run here): mark it ``not run`` or ``run by``."""
    found = [f"{block.where}: {not_bytecomp(block)}" for block in blocks(page)
             if runs_here(block) and block.language == "bash" and not_bytecomp(block)]
    assert not found, "blocks with commands not run here, and no `<!-- not run: REASON -->` " \
                      "or `<!-- run by tests/FILE.py::TEST -->` above them:\n" + "\n".join(found)


# ---------------------------------------------------------------- running them


def commands(block: Block) -> list[list[str]]:
    """A bash block's commands (continued lines joined, comments dropped), as argv."""
    text = block.code.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            found.append(argv)
    if any(set(argv) & {"|", ">", ">>", "<", "&&", ";"} for argv in found):
        return [["(a pipe or redirection)"]]
    return found


@pytest.fixture
def checkout(tmp_path):
    """A temporary directory laid out as a checkout: the shipped profiles (a block may
    write profiles of its own beside them), examples/ and configs/."""
    (tmp_path / "profiles").mkdir()
    for shipped in sorted((ROOT / "profiles").iterdir()):
        (tmp_path / "profiles" / shipped.name).symlink_to(shipped)
    for name in CHECKOUT:
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def check_model_factory(block: Block, namespace: dict, where: Path) -> None:
    """The block is a module with ``factory``, as ``--model pkg.module:factory`` takes it:
    loaded the way bytecomp profile loads it, the recipe trains a step and validates."""
    import torch

    from bytecomp.training.workloads import load_workload

    assert callable(namespace.get("factory")), "the block defines no factory()"
    module = "doc_block_factory"
    (where / f"{module}.py").write_text(block.code)
    sys.path.insert(0, str(where))
    try:
        workload = load_workload(f"{module}:factory")
    finally:
        sys.path.remove(str(where))
        sys.modules.pop(module, None)
    optimizer = workload.make_optimizer(workload.model.parameters())
    x, y = workload.make_batch(workload.batch_size)
    loss = workload.loss(workload.model(x), y)
    loss.backward()
    optimizer.step()
    batches = workload.validation_fn
    batches = batches(workload.batch_size) if callable(batches) else batches
    assert batches, "the recipe has no validation batches"
    with torch.no_grad():
        for x, y in batches:
            assert torch.isfinite(workload.loss(workload.model(x), y))


# What checks a ``<!-- run: CHECK -->`` block after it ran: f(block, its namespace, its
# directory).
CHECKS: dict[str, Callable[[Block, dict, Path], None]] = {
    "as a --model factory": check_model_factory,
}

RUN_HERE = [block for block in ALL_BLOCKS if runs_here(block)]


@pytest.mark.parametrize("block", RUN_HERE, ids=lambda block: block.where)
def test_the_block_runs_as_written(block, checkout, cli, capsys):
    if block.language == "bash":
        assert not not_bytecomp(block), f"{block.where} has commands not run here"
        for argv in commands(block):
            done = cli(*argv[1:], cwd=checkout)
            assert done.returncode == 0, f"{block.where}: `{shlex.join(argv)}` failed:\n" \
                                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        return
    namespace: dict = {"__name__": "__main__"}
    code = compile(block.code, block.where, "exec")
    with working_directory(checkout):
        exec(code, namespace)
    if block.note and block.note.startswith("run:"):
        CHECKS[block.note.removeprefix("run:").strip()](block, namespace, checkout)


def run_script(code: str, where: Path, name: str = "example.py",
               timeout: float = 300) -> subprocess.CompletedProcess:
    """``code`` saved as ``where/name`` and run as ``python name`` from ``where``, with this
    checkout's bytecomp importable: as a reader runs a page's example."""
    (where / name).write_text(code)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, name], cwd=where, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": path})


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in RUN_HERE if b.language == "python"],
                         ids=lambda block: block.where)
def test_the_python_block_runs_as_a_script(block, checkout):
    done = run_script(block.code, checkout)
    assert done.returncode == 0, f"{block.where} failed as a script:\n{done.stderr[-3000:]}"
