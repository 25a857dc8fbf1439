"""What the commands print: ``--format json`` (one document on stdout, the same figures as
the files written), tables and help that keep every name whole at 80 columns piped, notes
and warnings on stderr, and Chrome trace events that name their tensors and bytes.

The commands run in this process (the ``cli`` fixture), stdout captured as a pipe would
be; ``COLUMNS`` sets the width rich and click print at."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import typer.main
import yaml
from refusal import one_line_error

from bytecomp.cli import app
from bytecomp.compress import COMPRESSORS, from_spec
from bytecomp.compress.base import Compressor
from bytecomp.plan_file import load_plan
from bytecomp.profile_store import load_profile

ROOT = Path(__file__).resolve().parents[1]
CNN = str(ROOT / "profiles" / "cnn")  # profiled on 1 x 2 ranks, with fidelity
ELLIPSIS = "…"




def plan_json(cli, tmp_path, *extra: str):
    out = tmp_path / "plan.yaml"
    result = cli("plan", CNN, "--cluster", "gbe1", "--no-verify", "--out", out, "--format",
                 "json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), out, result


# -- JSON -----------------------------------------------------------------------------------


def test_plan_json_is_the_plan_file_s_figures_with_the_table_s_rows(cli, tmp_path):
    document, out, _ = plan_json(cli, tmp_path)
    assert document["written"] == str(out)
    written = yaml.safe_load(out.read_text())
    assert {key: document[key] for key in written} == written  # every field, as written
    plan = load_plan(out)
    assert document["predicted_ms"] == plan.predicted_ms
    assert document["fidelity"] == plan.info["fidelity"]
    assert document["search"] == plan.search
    assert document["tensors"] == [entry.to_dict() for entry in plan.entries]
    rows = document["strategies"]
    assert rows[0]["strategy"] == "bytecomp plan"
    assert [row["strategy"] for row in rows[1:]] == list(plan.predicted_ms["baselines"])
    assert rows[0]["iteration_ms"] == pytest.approx(plan.predicted_ms["plan"], abs=1e-3)
    for row in rows[1:]:
        assert row["iteration_ms"] == pytest.approx(
            plan.predicted_ms["baselines"][row["strategy"]], abs=1e-3)
        assert set(row) == {"strategy", "bucket_cap_mb", "iteration_ms", "fidelity",
                            "effective_ms", "below_min_fidelity", "vs_fp32"}


def test_simulate_json_parses_and_simulates_the_plan_s_prediction(cli, tmp_path):
    _, out, _ = plan_json(cli, tmp_path)
    result = cli("simulate", CNN, out, "--cluster", "gbe1", "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["iteration_ms"] == pytest.approx(load_plan(out).predicted_ms["plan"],
                                                     rel=1e-4)
    assert document["exposed_ms"] == pytest.approx(document["iteration_ms"]
                                                   - document["compute_ms"])
    assert document["busy_ms"]["channel:collective"] > 0
    assert document["level"] is None and document["written"] == []


def test_compressors_json_lists_the_registry_with_its_traits(cli):
    result = cli("compressors", "--format", "json", "--numel", "1000")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    listed = document["compressors"]
    assert [c["name"] for c in listed] == list(COMPRESSORS)
    traits = set(Compressor.TRAITS) - {"name", "summary", "params"}
    for shown in listed:
        compressor = from_spec(shown["spec"])
        assert set(shown["traits"]) == traits
        assert shown["traits"]["summable"] == compressor.summable
        assert shown["payload_bytes"] == compressor.payload_bytes(1000, 4)
        assert shown["error_feedback"] == compressor.error_feedback
    assert document["numel"] == 1000


def test_bench_json_is_bench_csv_with_the_caption_s_errors(tmp_path):
    """``bench --format json`` reads back what rank 0 wrote (the ranks themselves are
    run by the multirank bench tests)."""
    from bytecomp.bencher.report import COMPUTE_ONLY
    from bytecomp.cli import _plain
    from bytecomp.commands.bench import BenchResult

    rows = [{"strategy": "fp32 DDP", "measured_ms": 10.0, "error": 0.1,
             "recalibrated_error": -0.05, "compute_drift": 1.2, "speedup_vs_fp32": 1.0},
            {"strategy": "bytecomp plan", "measured_ms": 8.0, "error": -0.3,
             "recalibrated_error": 0.02, "compute_drift": 1.2, "speedup_vs_fp32": 1.25},
            {"strategy": COMPUTE_ONLY, "measured_ms": 5.0, "error": float("nan"),
             "recalibrated_error": 0.9, "compute_drift": 1.2, "speedup_vs_fp32": 2.0}]
    pd.DataFrame(rows).to_csv(tmp_path / "bench.csv", index=False)
    document = json.loads(json.dumps(_plain(BenchResult.read(tmp_path).to_dict()), allow_nan=False))
    assert [r["strategy"] for r in document["strategies"]] == [r["strategy"] for r in rows]
    assert document["strategies"][2]["error"] is None  # NaN: null, as JSON has no NaN
    assert document["summary"] == {"compute_drift": 1.2, "error_median": pytest.approx(0.2),
                                   "error_worst": 0.3, "recalibrated_error_median":
                                   pytest.approx(0.035), "recalibrated_error_worst": 0.05}
    assert document["convergence"] is None and document["files"] == ["bench.csv"]


@pytest.mark.parametrize("command", [("plan", CNN), ("simulate", CNN, "plan.yaml"),
                                     ("bench", CNN, "--plan", "plan.yaml"), ("compressors",)])
def test_a_bad_format_is_one_line_and_exit_2_before_any_work(cli, tmp_path, command):
    result = cli(*command, "--format", "xml", cwd=tmp_path)
    one_line_error(result, "--format must be table or json", "'xml'")
    assert list(tmp_path.iterdir()) == []


# -- stdout and stderr --------------------------------------------------------------------


def test_notes_and_warnings_go_to_stderr_results_to_stdout(cli, tmp_path):
    args = ("--compressor", "topk:ratio=0.01", "--strict")
    result = cli("plan", CNN, "--no-verify", "--out", tmp_path / "plan.yaml", *args)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert any("only topk:ratio=0.01 compresses" in note for note in notes), result.stderr
    assert "warning: --no-verify" in result.stderr
    assert "note:" not in result.stdout and "warning:" not in result.stdout
    assert "bytecomp plan" in result.stdout and "wrote " in result.stdout
    document, _, as_json = plan_json(cli, tmp_path, *args)
    assert [f"note: {note}" for note in document["notes"]] == \
        [line for line in as_json.stderr.splitlines() if line.startswith("note: ")]
    assert any("--no-verify" in warning for warning in document["warnings"])


# -- 80 columns, piped ----------------------------------------------------------------------


def table_cells(text: str, column: int = 0) -> list[str]:
    """The cells of ``column`` of a rich table (framed or not), each cell's wrapped lines
    joined by a space: a row starts where its last column has a value."""
    cells: list[str] = []
    body = False
    for line in text.splitlines():
        if "╇" in line:  # the rule under the header
            body = True
            continue
        fields = re.split(r"[│┃]", line)
        if not body or len(fields) < 2:  # the title, the header, the end of the table
            continue
        if line[:1] in ("│", "┃"):  # framed: the edges are empty fields
            fields = fields[1:-1]
        piece = fields[column].strip()
        if fields[-1].strip() or not cells:
            cells.append(piece)
        elif piece:
            cells[-1] += " " + piece
    return cells


def test_the_plan_table_at_80_columns_piped_shows_every_strategy_whole(cli, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "plan.yaml"
    result = cli("plan", CNN, "--cluster", "gbe1", "--no-verify", "--out", out)
    assert result.returncode == 0, result.stderr
    assert ELLIPSIS not in result.stdout
    # every line fits, but the plan's summary line: one line, so that a log can grep it
    assert max(len(line) for line in result.stdout.splitlines()
               if not line.startswith("plan: ")) <= 80
    names = ["bytecomp plan", *load_plan(out).predicted_ms["baselines"]]
    assert any(len(name) > 40 for name in names)  # a name the table has to wrap
    shown = table_cells(result.stdout)
    assert shown == names
    for name in names:  # a spec is one word: on one line, as it is
        assert name.split()[0] in result.stdout


def test_the_compressors_table_at_80_columns_shows_names_and_parameters_whole(cli,
                                                                            monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = cli("compressors")
    assert result.returncode == 0, result.stderr
    assert ELLIPSIS not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert table_cells(result.stdout) == list(COMPRESSORS)
    for name in COMPRESSORS:
        for key, value in from_spec(name).values.items():
            assert re.search(rf"\b{key}={re.escape(str(value).lower())}\b",
                             result.stdout.lower()), (name, key)


def test_help_at_80_columns_shows_every_option_name_whole(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        result = cli(name, "--help")
        assert result.returncode == 0, result.stderr
        assert ELLIPSIS not in result.stdout, name
        for param in command.params:
            for option in [*param.opts, *param.secondary_opts]:
                if option.startswith("--"):
                    assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])",
                                     result.stdout), (name, option)


def test_a_fitted_table_never_cuts_a_word_with_an_ellipsis():
    from rich.console import Console
    from rich.table import Table

    from bytecomp.ui import Fitted

    names = ["threshold:threshold=0.001 on every tensor (allgather)", "fp32 DDP"]
    for width in (200, 80, 60, 30):
        table = Table(title="a title long enough to wrap at the narrower widths here")
        for column in ("strategy", "bucket cap MB", "iteration ms", "vs fp32 DDP"):
            table.add_column(column, justify="left" if column == "strategy" else "right")
        for name in names:
            table.add_row(name, "25", "4518.65", "0.18x")
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(Fitted(table))
        text = console.export_text()
        assert ELLIPSIS not in text, width
        assert max(len(line) for line in text.splitlines()) <= width
        shown = table_cells(text)
        if width >= 60:
            assert shown == names, (width, text)
        else:  # narrower than the longest word: it folds, every character still shown
            assert [cell.replace(" ", "") for cell in shown] == \
                [name.replace(" ", "") for name in names], (width, text)


# -- Chrome trace ---------------------------------------------------------------------------


def test_trace_events_carry_their_tensor_names_and_bytes(cli, tmp_path):
    out = tmp_path / "plan.yaml"
    assert cli("plan", CNN, "--cluster", "gbe1", "--no-verify", "--out", out).returncode == 0
    trace = tmp_path / "trace.json"
    result = cli("simulate", CNN, out, "--cluster", "gbe1", "--trace", trace)
    assert result.returncode == 0, result.stderr
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    sizes = dict(zip(load_profile(CNN).tensors.name, load_profile(CNN).tensors.bytes))
    plan = load_plan(out)
    grouped = [e for e in events if e["cat"] in ("encode", "collective", "decode", "d2h",
                                                 "h2d")]
    assert grouped and all("tensors" in e["args"] for e in grouped)
    seen = set()
    for event in (e for e in events if "group" in e["args"]):
        args = event["args"]
        assert args["tensor_bytes"] == [sizes[name] for name in args["tensors"]]
        assert args["bytes"] == sum(args["tensor_bytes"]) > 0
        assert args["strategy"] == event["name"]
        strategies = {plan.by_name()[name].option.label for name in args["tensors"]}
        assert len(strategies) == 1  # a group's tensors share their strategy
        seen.update(args["tensors"])
    collectives = {name for e in events if e["cat"] == "collective"
                   for name in e["args"]["tensors"]}
    assert collectives == set(plan.by_name())  # every tensor is exchanged, by name
    assert seen == set(plan.by_name())


def test_the_plan_summary_line_is_one_line_at_80_columns_piped(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = cli("plan", ROOT / "profiles" / "transformer", "--cluster", "gbe1", "--no-verify",
                 "--out", tmp_path / "plan.yaml")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("plan: ")]
    assert len(line) > 80 and line.count(" x ") >= 3  # a long one, whole
    following = result.stdout.splitlines()[result.stdout.splitlines().index(line) + 1]
    assert following.startswith("search: ")
