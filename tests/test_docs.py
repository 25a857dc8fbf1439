"""The README and docs/: a short front page, links that resolve inside the repository,
every command-line option documented on its command's page, history kept on its own page,
generated parts equal to what the code gives now, results quoted as their files hold them,
and the README's training snippet runs as it is on two ranks."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from bytecomp.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 200
# The pages that document each command: its reference page first (an option may be named
# on any of them).
COMMAND_PAGES = {
    "compressors": ["commands/compressors.md", "compressors.md"],
    "profile": ["commands/profile.md", "profiling.md"],
    "plan": ["commands/plan.md", "planning.md", "adaptive.md", "large-clusters.md"],
    "simulate": ["commands/simulate.md", "planning.md"],
    "bench": ["commands/bench.md", "emulation.md"],
    "emulate": ["commands/emulate.md", "emulation.md"],
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README has {len(lines)} lines"
    head = "\n".join(lines[:120])
    assert "apply_plan" in head and "bytecomp plan" in head and "bytecomp profile" in head


def test_every_command_has_its_page():
    group = typer.main.get_command(app)
    assert set(group.commands) == set(COMMAND_PAGES)
    for pages in COMMAND_PAGES.values():
        assert (DOCS / pages[0]).is_file()


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_links_resolve_inside_the_repository(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    for target in LINK.findall(text):
        assert not re.match(r"[a-z]+:", target), f"{path.name} links outside: {target}"
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        assert resolved.is_relative_to(ROOT), f"{path.name} links outside: {target}"
        assert resolved.exists(), f"{path.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{path.name}: no heading #{anchor} in {file}"


def documented_options() -> list[tuple[str, str, list[str]]]:
    """(command, the option's names, ...) for every option of every command."""
    group = typer.main.get_command(app)
    found = [("bytecomp", "--version", ["--version"])]
    for name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name == "option":
                found.append((name, param.opts[0], [*param.opts, *param.secondary_opts]))
    return found


@pytest.mark.parametrize("command,option,names", documented_options(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_is_documented_on_its_commands_page(command, option, names):
    pages = COMMAND_PAGES.get(command, [])
    texts = [README.read_text(), (DOCS / "install.md").read_text()] if command == "bytecomp" \
        else [(DOCS / page).read_text() for page in pages if (DOCS / page).exists()]
    pattern = re.compile("|".join(rf"{re.escape(n)}(?![\w-])" for n in names))
    assert any(pattern.search(text) for text in texts), \
        f"`bytecomp {command} {option}` is not in docs/{', docs/'.join(pages)}"


# ---------------------------------------------------------------- history on its own page

HISTORY = DOCS / "history.md"
# "issue 18", "issues 15 and 18", "(issue 40)", "issue #7", "(#12)"; conv runs: "conv22", "conv19b"
ISSUE = re.compile(r"\bissues?\s+#?\d+|\(#\d+\)", re.IGNORECASE)
CONV_RUN = re.compile(r"\bconv\d+[a-z]?\b")


# Dates ("2026-11-27", "Nov 27") and a run's own machine ("this VM", "this project's 2-core
# machine", "2 min here"): a reference page names the benchmark machine
# (benchmarks.md#how-these-were-measured), not the one a diary was written on.
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|"
                  r"Nov|Dec)[a-z]*\.?\s+[0-3]?\d\b(?!\.\d)")
THIS_MACHINE = re.compile(r"\bthis\s+(?:project's\s+)?(?:[\w-]+\s+){0,2}?(?:VM|machine|box|"
                          r"computer|laptop|host)\b|\b(?:\d[\d.,-]*\s*(?:ms|s|min|minutes|"
                          r"seconds|hours)|(?:a|one|two|three|a few)\s+minutes?)\s+here\b",
                          re.IGNORECASE)
# Where a date is a name, not a diary: a link's target, a results file's path (a link's text
# that is its file's name), a generated quote of a results file.
NAMES = re.compile(r"\]\([^)]*\)|\[[\w./-]+\.md(?=\]\()|benchmarks/results/[\w./:=,+*<>-]*"
                   r"|<!-- BEGIN GENERATED: quote .*?<!-- END GENERATED -->", re.DOTALL)


def diary_marks(text: str) -> list[str]:
    """What in ``text`` belongs to a diary: issue numbers, conv runs' names, dates, and
    phrases about the machine a run was written on."""
    found = [*ISSUE.finditer(text), *CONV_RUN.finditer(text)]
    named = NAMES.sub(lambda m: " " * len(m.group(0)), text)
    found += [*DATE.finditer(named), *THIS_MACHINE.finditer(named)]
    return sorted({" ".join(m.group(0).split()) for m in found})


def test_the_diary_check_finds_each_kind():
    """The check itself, on sentences of each kind (and on names that are not diaries)."""
    assert diary_marks("Fixed in issue 18 (#12); conv22 diverged.") == \
        ["(#12)", "conv22", "issue 18"]
    assert diary_marks("On 2026-11-27, and again on Nov 28, this VM took 245 s.") == \
        ["2026-11-27", "Nov 28", "this VM"]
    assert diary_marks("on this project's 2-core machine, about 13 s here") == \
        ["13 s here", "this project's 2-core machine"]
    assert diary_marks("[search-2026-11-27b.md](../benchmarks/results/search-2026-11-27b.md), "
                       "`benchmarks/results/gpu-check-2026-11-26b-h200.md`, "
                       "[history](history.md#runs-to-2026-11-27), the links here") == []


@pytest.mark.parametrize("path", [p for p in markdown_files() if p != HISTORY],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_history_stays_on_the_history_page(path):
    """Issue numbers, the convergence runs' names (conv8..conv22), dates and phrases about
    the machine a run was written on ("this VM", "2 min here") belong to docs/history.md:
    a reference page states what holds now (results files may carry dates in their names)."""
    found = diary_marks(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} mentions {found}: run diaries, dates, conv " \
                      f"runs and issue numbers go to docs/history.md"


def test_the_torch_versions_are_explained_in_one_place():
    """Every torch pin the pages name is one that install.md's "Which torch" explains."""
    install = (DOCS / "install.md").read_text()
    section = install.split("## Which torch", 1)[1].split("\n## ", 1)[0]
    explained = set(re.findall(r"torch==([\d.]+)", section))
    assert {"2.13.0", "2.14.1"} <= explained
    for path in markdown_files():
        if path == HISTORY:
            continue
        for version in re.findall(r"torch==([\d.]+)", path.read_text()):
            assert version in explained, f"{path.relative_to(ROOT)} pins torch=={version}, " \
                                         f"which docs/install.md#which-torch does not explain"


# ---------------------------------------------------------------- generated parts

sys.path.insert(0, str(DOCS))
import generate  # noqa: E402  (docs/generate.py)


def generated_pages() -> list[Path]:
    return [path for path in markdown_files() if generate.BLOCK.search(path.read_text())]


def test_the_generated_pages_are_there():
    names = {str(path.relative_to(ROOT)) for path in generated_pages()}
    assert {"README.md", "docs/planning.md", "docs/api.md", "docs/benchmarks.md",
            *(f"docs/commands/{command}.md" for command in COMMAND_PAGES)} <= names


@pytest.mark.parametrize("path", generated_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_parts_are_current(path):
    """Option tables (from the typer app), the API page (from the docstrings), the sample
    outputs of plan and simulate (run now) and quoted results tables equal what
    docs/generate.py makes now; the search time of a sample may differ."""
    import difflib

    text = path.read_text()
    now = generate.regenerate(text)
    old, new = generate.normalized(text), generate.normalized(now)
    diff = "\n".join(list(difflib.unified_diff(old.splitlines(), new.splitlines(), "on disk",
                                               "generated now", lineterm=""))[:60])
    assert old == new, f"{path.relative_to(ROOT)} is stale: run `python docs/generate.py` " \
                       f"(make docs)\n{diff}"


def test_the_api_page_covers_the_public_names():
    import bytecomp

    text = (DOCS / "api.md").read_text()
    for name in bytecomp.__all__:
        if name != "__version__":
            assert f"#### `bytecomp.{name}`" in text, f"docs/api.md has no section for {name}"
    for name in ("Stats.summary", "Stats.interval", "Stats.log_every", "Executor.state_dict",
                 "Executor.load_state_dict", "search.Planner"):
        assert f"{name}`" in text, f"docs/api.md has no section for {name}"


# ---------------------------------------------------------------- benchmark results

RESULTS = ROOT / "benchmarks" / "results"
RESULTS_PATH = re.compile(r"benchmarks/results/[\w./:=,+*<>-]*")
# Paths written as patterns, not files: a placeholder or a glob.
PATTERN = re.compile(r"[*<]|RUN|FILE|<date>")


def test_the_results_index_lists_every_file():
    listed = generate.indexed_files((RESULTS / "INDEX.md").read_text())
    files = set(generate.result_files())
    assert not files - listed, f"benchmarks/results/INDEX.md does not list " \
                               f"{sorted(files - listed)[:10]}: run `python docs/generate.py`"
    assert not listed - files, f"benchmarks/results/INDEX.md lists files that are not " \
                               f"there: {sorted(listed - files)[:10]}"


def test_every_results_file_has_its_command():
    undescribed = [name for name in generate.result_files()
                   if generate.set_of(name) is generate.UNDESCRIBED]
    assert not undescribed, f"no set of docs/generate.py's SETS describes {undescribed[:10]}: " \
                            f"add one with the command that makes them"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_results_files_exist(path):
    for match in RESULTS_PATH.finditer(path.read_text()):
        name = match.group(0).rstrip(".,:;")
        if PATTERN.search(name) or name.endswith("/results/"):
            continue
        assert (ROOT / name).exists(), f"{path.relative_to(ROOT)} names {name}, which does " \
                                       f"not exist"


FIGURES = re.compile(r"<!-- figures(?::\s*(?P<files>[^>]*?))?\s*-->\n(?P<table>(?:\|.*\n)+)")
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def _quoted(figure: str, held: set[str]) -> bool:
    """Whether a file holds ``figure``, as written or rounded to its decimals."""
    from decimal import ROUND_DOWN, ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

    if figure in held:
        return True
    wanted = Decimal(figure)
    places = Decimal(1).scaleb(wanted.as_tuple().exponent)
    for value in held:
        number = Decimal(value)
        if any(number.quantize(places, rounding=mode) == wanted
               for mode in (ROUND_HALF_UP, ROUND_HALF_EVEN, ROUND_DOWN)):
            return True
    return False


def figure_tables() -> list[tuple[Path, str, list[str], list[list[str]]]]:
    """(page, the marker's files, rows) for every table a page marks with
    ``<!-- figures: FILE ... -->`` (or ``<!-- figures -->``: each row's linked files)."""
    found = []
    for path in markdown_files():
        for match in FIGURES.finditer(path.read_text()):
            files = (match.group("files") or "").split()
            rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
                    for line in match.group("table").splitlines()[2:]]
            found.append((path, match.group(0).splitlines()[0], files, rows))
    return found


FIGURE_TABLES = figure_tables()


@pytest.mark.parametrize("page,marker,files,rows", FIGURE_TABLES,
                         ids=[f"{table[0].relative_to(ROOT)}:{table[2][0] if table[2] else 'rows'}"
                              for table in FIGURE_TABLES])
def test_quoted_figures_are_the_files_figures(page, marker, files, rows):
    """Every figure of a table that quotes benchmark results (the cells after the first, but
    commands and links) is one its results files hold, as written or rounded."""
    assert rows, f"{page.name}: {marker} is followed by no table"
    for row in rows:
        sources = files or [f"benchmarks/results/{target}" for cell in row
                            for target in re.findall(r"\]\((?:\.\./)*benchmarks/results/"
                                                     r"([^)]+)\)", cell)]
        assert sources, f"{page.name}: the row {row[0]!r} names no results file"
        held = {n for source in sources for n in _numbers((ROOT / source).read_text())}
        for cell in row[1:]:
            if "`" in cell or "](" in cell:
                continue
            for figure in _numbers(cell):
                if "." not in figure and int(figure) < 10:
                    continue  # counts ("5 of 8") say little by themselves
                assert _quoted(figure, held), \
                    f"{page.relative_to(ROOT)}: {figure} in the row {row[0]!r} is not in " \
                    f"{', '.join(sources)}"


def readme_training_snippet() -> str:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    training = [block for block in blocks if "apply_plan" in block]
    assert training, "the README has no python block with apply_plan"
    return training[0]


@pytest.mark.multirank
@pytest.mark.smoke
def test_readme_training_snippet_runs_on_two_ranks(tmp_path):
    """The README's step 3, as written, with a plan for its model and world size."""
    from bytecomp.launch import free_port
    from bytecomp.plan_file import plan_for_model
    from bytecomp.plan_types import Option
    from bytecomp.training.workloads import load_workload

    model = load_workload("mlp:inputs=64,width=256,depth=3").model
    biggest = max(p.numel() for p in model.parameters())
    plan = plan_for_model(model, lambda name, p: Option("topk:ratio=0.01", "device", "allgather")
                          if p.numel() == biggest else Option("none", "device", "allreduce"),
                          2, 1, bucket_cap_mb=25)
    plan.save(tmp_path / "plan.yaml")
    (tmp_path / "snippet.py").write_text(readme_training_snippet())
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "--master_port", str(free_port()), "snippet.py"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "bytes_vs_fp32" in done.stdout


@pytest.mark.multirank
@pytest.mark.clock  # one rank's line may be lost to torchrun stopping it: alone, it is not
def test_readme_training_snippet_prints_one_line_per_rank_for_a_plan_of_another_world_size(
        tmp_path):
    """A plan made for 4 ranks, run on 2 by the README's snippet: one line on each rank
    that prints before torchrun stops it, naming the fix, and no traceback."""
    from bytecomp.launch import free_port
    from bytecomp.plan_file import plan_for_model
    from bytecomp.plan_types import Option
    from bytecomp.training.workloads import load_workload

    model = load_workload("mlp:inputs=64,width=256,depth=3").model
    plan_for_model(model, lambda name, p: Option("fp16", "device", "allreduce"), 4, 2,
                   bucket_cap_mb=25).save(tmp_path / "plan.yaml")
    (tmp_path / "snippet.py").write_text(readme_training_snippet())
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "--master_port", str(free_port()), "--redirects", "2",
                           "--log-dir", str(tmp_path / "logs"), "snippet.py"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0  # torchrun prints its own ChildFailedError: not the ranks'
    said = {}
    for rank in range(2):  # each rank's stderr, as torchrun's --redirects keeps it
        logged = next((tmp_path / "logs").rglob(f"attempt_0/{rank}/stderr.log")).read_text()
        said[rank] = [line for line in logged.splitlines() if line.strip()]
    # both ranks fail at once, but torchrun stops the workers left as soon as one exits: on
    # a busy machine one may be stopped before it printed (CI once saw rank 0's log empty)
    assert any(said.values()), done.stderr[-3000:]
    for rank, lines in said.items():
        if not lines:
            continue
        assert len(lines) == 1 and lines[0].startswith(f"error: rank {rank}: "), lines
        assert "the plan is for 4 ranks but this job has 2" in lines[0] and \
            "plan again with --cluster CONFIG for 2 ranks" in lines[0], lines[0]
