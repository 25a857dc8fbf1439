"""Shared test setup: the tests directory on ``sys.path``, and the ``cli`` fixture."""

import contextlib
import io
import os
import shlex
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import PurePosixPath

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# pytest-xdist's workers (make test runs the fast tier on every core) start with COLUMNS=80
# and LINES=24: bytecomp's rich consoles, made at import, would keep that width for good.
# Without them the width is read at each print, as the tests set it (the cli fixture: 160).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# Triton reads TRITON_INTERPRET when it is first imported (its own @jit helpers, tl.sum and
# the like, are made then), and torch.compile's tests import it: without a GPU, the kernel
# tests' interpreter must be on from the start of the session (tests/test_kernels.py).
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# Markers that put a test in the second tier (make test-all), unless it is also `smoke`.
SECOND_TIER = ("multirank", "faults", "notebook", "benchmark", "slow")


def pytest_collection_modifyitems(config, items):
    """Mark `slow` every test of the second tier, so that `make test` (-m "not slow")
    runs the fast tier: a `multirank`, `faults`, `notebook` or `benchmark` test not
    marked `smoke`."""
    for item in items:
        kinds = {mark.name for mark in item.iter_markers()}
        if kinds & set(SECOND_TIER) and "smoke" not in kinds and "slow" not in kinds:
            item.add_marker(pytest.mark.slow)

# Warnings a fresh interpreter does not print (Python's default filters).
SILENT_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


@pytest.fixture(autouse=True, scope="module")
def module_cluster_cache(tmp_path_factory):
    """Every test module (its module-scoped fixtures) an empty per-user cache of cluster
    tables (bytecomp.profiler.cache): none touches the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BYTECOMP_CACHE_DIR", str(tmp_path_factory.mktemp("module-cache")))
        yield


@pytest.fixture(autouse=True)
def cluster_cache(monkeypatch, tmp_path_factory):
    """Every test its own empty per-user cache of cluster tables: no profile reuses
    another test's tables."""
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("BYTECOMP_CACHE_DIR", str(folder))
    return folder


@contextlib.contextmanager
def working_directory(path):
    """Run the block in ``path`` (``None``: where we are), then come back."""
    previous = os.getcwd()
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@pytest.fixture
def cli(monkeypatch):
    """``cli(*args, cwd=None)``: run ``bytecomp ARGS`` in this process, through the console
    script's entry point, and return what a subprocess would (``CompletedProcess``:
    returncode, stdout, stderr; warnings go to stderr, as an interpreter prints them).

    On the command line an exception escaping ``main`` would be a traceback: here it
    fails the test, with that traceback.
    """
    from bytecomp.cli import main

    monkeypatch.setenv("COLUMNS", "160")  # rich reads it at print time: no wrapped tables
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # typer replaces it

    def run(*args, cwd=None) -> subprocess.CompletedProcess:
        argv = [str(arg) for arg in args]
        monkeypatch.setattr(sys, "argv", ["bytecomp", *argv])
        stdout, stderr = io.StringIO(), io.StringIO()
        code = 0
        with working_directory(cwd), contextlib.redirect_stdout(stdout), \
                contextlib.redirect_stderr(stderr), warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            for category in SILENT_BY_DEFAULT:
                warnings.filterwarnings("ignore", category=category)
            try:
                main(argv)
            except SystemExit as done:
                code = done.code
            except Exception as error:
                raise AssertionError(f"`bytecomp {shlex.join(argv)}` raised {error!r}: on the "
                                     f"command line, a traceback") from error
        for warning in caught:
            stderr.write(warnings.formatwarning(warning.message, warning.category,
                                                warning.filename, warning.lineno, warning.line))
        if code is None:
            code = 0
        elif not isinstance(code, int):  # sys.exit("message"), as the interpreter does it
            stderr.write(f"{code}\n")
            code = 1
        return subprocess.CompletedProcess(["bytecomp", *argv], code, stdout.getvalue(),
                                           stderr.getvalue())

    return run


# -- the hostile corpus's size: at the end of any run that collected tests/hostile/, one
# line per case class (a file there) with its cases run and how they ended, and the total
_outcomes: dict[str, Counter] = {}


def pytest_runtest_logreport(report) -> None:
    path = PurePosixPath(report.nodeid.split("::")[0])  # relative to the root: tests/hostile/
    ended = report.when == "call" or (report.when == "setup" and not report.passed)
    if path.parent.name != "hostile" or not ended:
        return
    _outcomes.setdefault(path.stem, Counter())[report.outcome] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _outcomes:
        return
    terminalreporter.write_sep("-", "hostile corpus")
    total: Counter = Counter()
    for name in sorted(_outcomes):
        counts = _outcomes[name]
        total += counts
        terminalreporter.write_line(f"{name}: {sum(counts.values())} cases ("
                                    + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                                    + ")")
    terminalreporter.write_line(f"hostile corpus: {sum(total.values())} cases run in "
                                f"{len(_outcomes)} classes")
