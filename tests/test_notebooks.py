"""The notebooks in notebooks/ run from a clean kernel, and are stored without outputs.

Each notebook is executed with nbclient in a fresh ``python3`` kernel (ipykernel; the
kernel runs this interpreter, so the project's virtual environment), with a temporary
directory outside the checkout as its working directory: a notebook finds the repository
itself (through the installed package), so it runs from wherever a reader opens it. Any error, or a notebook still running
after ``TIMEOUT_S`` in all, fails the test: a notebook that no longer runs against the
library fails CI. A cell that shows a figure must show it (a plot that silently stops
rendering is stale too).

Stored notebooks carry no outputs and no execution counts, so their diffs stay readable.
``python tests/test_notebooks.py --strip`` strips them in place.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

# executes the notebooks: make test-all
pytestmark = pytest.mark.notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 600  # a whole notebook; the walkthrough takes about a minute on a 2-core CPU
SHOWS_A_FIGURE = ("plt.show()", "display(Image(")


def _names(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def test_the_walkthrough_is_there():
    assert "walkthrough.ipynb" in _names(NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_names(NOTEBOOKS))
def test_notebook_runs_from_a_clean_kernel(path: Path, tmp_path: Path):
    notebook = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + TIMEOUT_S
    client = NotebookClient(
        notebook, kernel_name="python3", timeout=TIMEOUT_S,
        # each cell may take what is left of the notebook's time
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        resources={"metadata": {"path": str(tmp_path)}})  # not the checkout
    started = time.monotonic()
    client.execute()  # raises CellExecutionError (with the cell's traceback) or a timeout
    print(f"{path.name}: executed in {time.monotonic() - started:.1f} s")
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "code" and any(call in cell.source for call in SHOWS_A_FIGURE):
            images = [output for output in cell.outputs if "image/png" in output.get("data", {})]
            assert images, f"{path.name}: cell {number} shows a figure but none was displayed:" \
                           f"\n{cell.source}"


# What a notebook may import: the standard library, bytecomp itself (`import bytecomp`, no
# submodule), and the libraries a reader already has beside it.
THIRD_PARTY = {"bytecomp", "matplotlib", "pandas", "numpy", "IPython"}


def _bytecomp_use(source: str) -> tuple[set[str], set[str]]:
    """The modules ``source`` imports (top-level names, bytecomp's in full) and the names
    it reads from ``bytecomp``."""
    import ast

    tree = ast.parse("\n".join(line for line in source.splitlines()
                                if not line.lstrip().startswith(("%", "!"))))
    imported, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "bytecomp":
            used.add(node.attr)
    return imported, used


@pytest.mark.smoke
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_names(NOTEBOOKS))
def test_notebook_uses_only_bytecomp_s_public_names(path: Path):
    """Imports: ``import bytecomp`` (no submodule), the standard library, pandas,
    matplotlib, numpy, IPython; from bytecomp, only the names of ``bytecomp.__all__``."""
    import bytecomp

    notebook = nbformat.read(path, as_version=4)
    source = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    imported, used = _bytecomp_use(source)
    outside = sorted(name for name in imported if name.split(".")[0] not in
                     sys.stdlib_module_names | THIRD_PARTY or name.startswith("bytecomp."))
    assert not outside, f"{path.name} imports {outside}: a notebook uses bytecomp's public API"
    private = sorted(name for name in used - set(bytecomp.__all__) if not name.startswith("__"))
    assert not private, f"{path.name} uses bytecomp.{private}, which bytecomp.__all__ lacks"


def _unstripped(notebook) -> list[str]:
    """What keeps ``notebook`` from being stored stripped, one line per cell."""
    problems = []
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {number} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {number} has an execution count")
        if "execution" in cell.get("metadata", {}):
            problems.append(f"cell {number} has execution timings in its metadata")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_names(NOTEBOOKS))
def test_notebook_is_stored_stripped(path: Path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    problems = _unstripped(notebook)
    assert not problems, f"{path.name} is stored with outputs ({'; '.join(problems)}); " \
                         f"strip it: python tests/test_notebooks.py --strip"


def strip(path: Path) -> None:
    """Remove outputs, execution counts and execution timings from ``path``, in place."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    nbformat.write(notebook, path)


if __name__ == "__main__":
    if sys.argv[1:] != ["--strip"]:
        sys.exit("usage: python tests/test_notebooks.py --strip")
    for notebook_path in NOTEBOOKS:
        strip(notebook_path)
        print(f"stripped {notebook_path.relative_to(ROOT)}")
