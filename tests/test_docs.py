"""The README and docs/: a short front page, links that resolve inside the repository,
every command-line option documented on its command's page, and the README's training
snippet runs as it is on two ranks."""
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
MAX_README_LINES = 250
# The pages that document each command (an option may be named on any of them).
COMMAND_PAGES = {
    "compressors": ["compressors.md"],
    "profile": ["profiling.md"],
    "plan": ["planning.md", "adaptive.md", "large-clusters.md"],
    "simulate": ["planning.md"],
    "bench": ["emulation.md"],
    "emulate": ["emulation.md"],
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


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
    from bytecomp.plan import Option, plan_for_model
    from bytecomp.profile.workloads import load_workload

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
