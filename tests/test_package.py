"""The package's shape: what a training job imports, the import graph's layering, and
the shipped cluster configs as package data. (The built wheel in a fresh virtual
environment is checked by ``make wheel-check``, part of ``make check``.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

import bytecomp
from bytecomp.costs.clusters import available_clusters, load_cluster, shipped_clusters

PACKAGE = Path(bytecomp.__file__).resolve().parent
REPO = PACKAGE.parent
HEAVY = ("pandas", "scipy", "rich", "networkx", "matplotlib", "typer")
PLANNER = ("bytecomp.search", "bytecomp.profiler", "bytecomp.costs", "bytecomp.timeline",
           "bytecomp.bencher", "bytecomp.cli", "bytecomp.ui")


def test_a_training_job_imports_no_planner_code():
    script = ("import sys, bytecomp, bytecomp.runtime\n"
              "from bytecomp import apply_plan, load_plan, autotune, comm_hook\n"
              "import bytecomp.autotuner.tuner\n"
              "print('\\n'.join(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True)
    loaded = result.stdout.split()
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    planner = [m for m in loaded if m.startswith(PLANNER)]
    assert not heavy and not planner, (heavy, planner)
    assert "bytecomp.runtime.executor" in loaded and "yaml" in loaded


# what `bytecomp plan --no-verify` has no use for: it runs no torch code (the compressors and
# the scheme registry import torch where they run it), fits without scipy.optimize, and reads
# a profile without the profiler
PLAN_SKIPS = ("torch", "triton", "scipy", "matplotlib", "bytecomp.profiler",
              "bytecomp.runtime", "bytecomp.launch", "bytecomp.recipe", "bytecomp.bencher",
              "bytecomp.emulate", "bytecomp.comm.exchanges", "bytecomp.comm.collectives",
              "bytecomp.comm.worker", "bytecomp.compress.triton_kernels")


def test_bytecomp_plan_imports_only_what_it_needs(tmp_path):
    """The plan command's start is most of its time (the shipped transformer profile's
    search takes a tenth of a second): none of it goes to modules it does not run."""
    out, modules = tmp_path / "plan.yaml", tmp_path / "modules.txt"
    script = ("import sys\n"
              "from bytecomp.cli import main\n"
              f"sys.argv = ['bytecomp', 'plan', {str(REPO / 'profiles' / 'transformer')!r}, "
              f"'--cluster', 'gbe1', '--no-verify', '--out', {str(out)!r}]\n"
              "try:\n"
              "    main()\n"
              "except SystemExit as stop:\n"
              "    assert not stop.code, stop.code\n"
              f"open({str(modules)!r}, 'w').write('\\n'.join(sorted(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.exists() and "wrote" in result.stdout
    loaded = modules.read_text().split()
    unneeded = [m for m in loaded if any(m == s or m.startswith(f"{s}.") for s in PLAN_SKIPS)]
    assert not unneeded, unneeded
    assert "bytecomp.search.planner" in loaded and "bytecomp.compress.quantize" in loaded


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(submodules: bool = False) -> tuple[nx.DiGraph, nx.DiGraph]:
    """bytecomp's imports of bytecomp modules: (module-level ones, all including those
    inside functions). ``from package import name`` counts as an edge to the package, or
    with ``submodules`` to ``package.name`` where that is a module (a package's
    ``__init__`` is then a module of its own, not the sum of its submodules)."""
    top, every = nx.DiGraph(), nx.DiGraph()
    modules = {_module_name(path) for path in PACKAGE.rglob("*.py")}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        top.add_node(module)
        every.add_node(module)
        tree = ast.parse(path.read_text())
        functions = [node for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inner = {id(n) for f in functions for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
                if submodules:
                    targets = [f"{node.module}.{alias.name}"
                               if f"{node.module}.{alias.name}" in modules else node.module
                               for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("bytecomp") and target != module:
                    every.add_edge(module, target)
                    if id(node) not in inner:
                        top.add_edge(module, target)
    return top, every


def test_the_import_graph_has_no_cycle():
    top, _ = import_graph()
    cycles = list(nx.simple_cycles(top))
    assert not cycles, cycles


def _stage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_stages_import_only_downward():
    _, every = import_graph()
    planning = ("bytecomp.profiler", "bytecomp.costs", "bytecomp.timeline", "bytecomp.search")
    forbidden = []
    for source, target in every.edges:
        # the profiler alone may run the executor: it measures the executor's fixed costs, and
        # the convergence probe trains with compressors
        runs_executor = source in ("bytecomp.profiler.overheads", "bytecomp.training.probe",
                                   "bytecomp.training.finalist_runs") \
            and target == "bytecomp.runtime"
        if _stage(source) in planning and _stage(target) in ("bytecomp.runtime", "bytecomp.cli") \
                and not runs_executor:
            forbidden.append((source, target))
        if _stage(source) == "bytecomp.runtime" and _stage(target) in (*planning, "bytecomp.cli"):
            forbidden.append((source, target))
    assert not forbidden, forbidden
    assert not any(_stage(t) == "bytecomp.testing" for s, t in every.edges
                   if _stage(s) != "bytecomp.testing"), "product code imports bytecomp.testing"


def test_cluster_configs_are_package_data_with_one_source():
    shipped = PACKAGE / "configs" / "clusters"
    assert sorted(p.stem for p in shipped.glob("*.yaml")) == available_clusters()
    assert set(shipped_clusters()) >= {"gbe1", "gbe10", "v100-nvlink-100g"}
    top_level = REPO / "configs" / "clusters"
    if top_level.exists():  # a checkout: the documented copies are the package's own
        assert top_level.resolve() == shipped.resolve()
    assert load_cluster("gbe1").world_size == 8


def test_the_package_data_rule_ships_every_config():
    """pyproject's package data matches every shipped config (what the wheel holds)."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    rules = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["bytecomp"]
    for path in (PACKAGE / "configs" / "clusters").iterdir():
        relative = str(path.relative_to(PACKAGE))
        assert any(fnmatch.fnmatch(relative, rule) for rule in rules), relative


# ---------------------------------------------------------------- install truth

INSTALL = REPO / "docs" / "install.md"
README = REPO / "README.md"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # as PyTorch documents its CPU wheels


def test_pyproject_the_install_page_and_the_readme_agree_on_torch():
    """The torch requirement install.md states is pyproject's; the version the Makefile
    installs satisfies it, and install.md and the README give the same line for its CPU
    build (PyTorch's CPU index) and say how to get the CUDA build (PyPI's, on Linux)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch"]
    assert len(torch) == 1, "pyproject.toml must require torch once"
    install, readme = INSTALL.read_text(), README.read_text()
    assert f"requires `torch{torch[0].specifier}`" in install, \
        f"docs/install.md does not say the package requires `torch{torch[0].specifier}`"
    pinned = re.search(r"^TORCH \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert pinned, "the Makefile has no TORCH ?= torch==VERSION"
    version = pinned.group(1)
    assert torch[0].specifier.contains(version), \
        f"the Makefile's torch {version} does not satisfy pyproject's torch{torch[0].specifier}"
    cpu = f"pip install torch=={version} --index-url {CPU_INDEX}"
    cuda = f"`pip install torch=={version}`"
    for name, text in (("docs/install.md", install), ("README.md", readme)):
        assert cpu in text, f"{name} does not give the CPU build's line: {cpu}"
        assert cuda in text and "CUDA build" in text, \
            f"{name} does not say how to get the CUDA build ({cuda} from PyPI)"


def test_the_install_page_lists_every_extra():
    """Every optional dependency set of pyproject.toml is on install.md (and nothing else
    is named as an extra), and its make install-dev line is the Makefile's."""
    tomllib = pytest.importorskip("tomllib")

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    install = INSTALL.read_text()
    named = {name for group in re.findall(r"\.\[([\w,]+)\]", install) for name in group.split(",")}
    assert extras - named == set(), f"docs/install.md does not list the extras " \
                                    f"{sorted(extras - named)}"
    assert named - extras == set(), f"docs/install.md names extras pyproject.toml does not " \
                                    f"declare: {sorted(named - extras)}"
    dev = re.search(r'-e "(\.\[[\w,]+\])"', (REPO / "Makefile").read_text())
    assert dev, "the Makefile's install-dev installs no extras"
    assert f"`make install-dev` installs `{dev.group(1)}`" in install, \
        f"docs/install.md does not say that make install-dev installs {dev.group(1)}"
