"""Regenerate the parts of the docs that are made from the code, the commands' output and
the benchmark results, so that they cannot go stale.

    python docs/generate.py           # rewrite every generated block and benchmarks/results/INDEX.md
    python docs/generate.py --check   # write nothing; list what is stale, exit 1 if anything is

A generated block in a Markdown file sits between two comments; the text between them is
replaced on every run and never edited by hand::

    <!-- BEGIN GENERATED: options plan -->
    ...
    <!-- END GENERATED -->

Kinds of block:

- ``options COMMAND``: the options table of ``bytecomp COMMAND`` (names, values, default,
  the help text), read from the typer app;
- ``api NAME [NAME ...]``: the signature and docstring of each dotted name
  (``bytecomp.apply_plan``, ``bytecomp.runtime.state.Stats.log_every``);
- ``sample plan`` / ``sample plan-head`` / ``sample simulate``: the output of
  ``bytecomp plan profiles/transformer --cluster gbe1 --no-verify`` (whole, or its first
  rows and the plan line) and of ``bytecomp simulate`` on that plan, run now;
- ``quote FILE``: a results file's first Markdown table, copied as it is.

``benchmarks/results/INDEX.md`` is written whole: every file under benchmarks/results/, the
command that makes it, and the commit and date that added it and last changed it (from
git). ``tests/test_docs.py`` checks that every generated block equals what this script
writes now (the search time in a sample's ``search:`` line may differ) and that the index
lists every file.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"
BLOCK = re.compile(r"(<!-- BEGIN GENERATED: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- END GENERATED -->)",
                   flags=re.DOTALL)
SAMPLE_COLUMNS = "100"  # the terminal width the samples are printed at
SAMPLE_PROFILE = "profiles/transformer"
SAMPLE_CLUSTER = "gbe1"
# The figure of a sample that differs from run to run: the search's own time.
VOLATILE = re.compile(r"(search: [^\n]*?)\b\d+(?:\.\d+)? ms\b|(time_ms: )\d+(?:\.\d+)?")


def markdown_files() -> list[Path]:
    """The README and every page under docs/ (history included)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


# ---------------------------------------------------------------- command options

def _command(name: str):
    import typer.main

    from bytecomp.cli import app

    group = typer.main.get_command(app)
    return group.commands[name]


def _value(param) -> str:
    """What an option takes, in words (typer's own click or click's parameters)."""
    if getattr(param, "is_flag", False):
        return "flag"
    kind = getattr(param, "type", None)
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is not None:
        if getattr(annotation, "__origin__", None) is list:
            annotation = annotation.__args__[0]
        name = getattr(annotation, "__name__", str(annotation))
    else:
        name = getattr(kind, "name", "text")
    words = {"int": "integer", "integer range": "integer", "float": "number",
             "float range": "number", "str": "text", "string": "text"}.get(name, name)
    low = getattr(param, "min", getattr(kind, "min", None))
    high = getattr(param, "max", getattr(kind, "max", None))
    bounds = [f">= {low}" for _ in [0] if low is not None] + \
             [f"<= {high}" for _ in [0] if high is not None]
    if bounds:
        words += " " + " and ".join(bounds)
    if getattr(param, "multiple", False):
        words += ", repeatable"
    return words


def _default(param) -> str:
    if getattr(param, "is_flag", False):
        if param.secondary_opts:
            return f"`{param.opts[0]}`" if param.default else f"`{param.secondary_opts[0]}`"
        return "off"
    if param.required:
        return "required"
    default = param.default
    if default is None or default == () or default == []:
        return "see text" if "default" in (param.help or "").lower() else "none"
    if default == "":
        return '`""`'
    return f"`{default}`"


def _help(param) -> str:
    text = " ".join((param.help or "").split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _argument(param) -> str:
    name = param.metavar or param.name.upper()
    name = name if param.required else f"[{name}]"
    return name + ("..." if param.nargs == -1 else "")


def options_block(name: str) -> str:
    command = _command(name)
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option"]
    usage = " ".join(["bytecomp", name, "[OPTIONS]" if options else "",
                      *(_argument(p) for p in arguments)]).replace("  ", " ")
    if name == "emulate":
        usage += " -- COMMAND [ARGS]..."
    lines = ["```text", usage, "```", ""]
    if arguments:
        lines += ["| argument | what it is |", "|---|---|"]
        for param in arguments:
            required = "" if param.required else " (optional)"
            lines.append(f"| `{param.metavar or param.name.upper()}`{required} | {_help(param)} |")
        lines.append("")
    lines += ["| option | value | default | what it does |", "|---|---|---|---|"]
    for param in options:
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        lines.append(f"| {names} | {_value(param)} | {_default(param)} | {_help(param)} |")
    lines.append("| `--help` | flag | off | Print the options and exit. |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- API reference

def _resolve(dotted: str):
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def _annotation(text) -> str:
    if text is inspect.Parameter.empty:
        return ""
    return text if isinstance(text, str) else inspect.formatannotation(text)


def _signature(name: str, obj) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    parts = []
    star_done = False
    for parameter in signature.parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if parameter.kind is parameter.VAR_POSITIONAL:
            star_done = True
        prefix = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        text = prefix + parameter.name
        annotation = _annotation(parameter.annotation)
        if annotation:
            text += f": {annotation}"
        if parameter.default is not parameter.empty:
            default = parameter.default
            shown = "<factory>" if repr(default).startswith("<factory>") else repr(default)
            text += f" = {shown}" if annotation else f"={shown}"
        parts.append(text)
    returns = _annotation(signature.return_annotation)
    text = f"{name}({', '.join(parts)})"
    return text + (f" -> {returns}" if returns and returns != "None" else "")


ROLE = re.compile(r":(?:func|meth|class|attr|data|mod|exc|obj):`~?([^`<]*?)(?: <[^>]*>)?`")


def _inline(text: str) -> str:
    def role(match):
        target = match.group(1)
        whole = match.group(0)
        return f"`{target.split('.')[-1] if ':`~' in whole else target}`"

    text = ROLE.sub(role, text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def docstring_markdown(doc: str) -> str:
    """A docstring's reST, as the Markdown these pages use: inline literals and roles,
    doctest and ``::`` blocks as code blocks, ``*`` bullets as ``-``."""
    out: list[str] = []
    lines = doc.splitlines()
    index = 0
    literal_next = False
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith(">>>"):
            block = []
            while index < len(lines) and lines[index].lstrip().startswith((">>>", "...")):
                block.append(lines[index].lstrip()[4:])
                index += 1
            out += ["```python", *block, "```"]
            continue
        if literal_next and line.strip() and line.startswith((" ", "\t")):
            block = []
            while index < len(lines) and (not lines[index].strip()
                                          or lines[index].startswith((" ", "\t"))):
                block.append(lines[index])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            out += ["```python", *(b[indent:] for b in block), "```", ""]
            literal_next = False
            continue
        if line.rstrip().endswith("::"):
            literal_next = True
            stripped = line.rstrip()[:-2].rstrip()
            line = stripped + ":" if stripped else ""
        elif line.strip():
            literal_next = False
        bullet = re.match(r"^(\s*)\* ", line)
        if bullet:
            line = bullet.group(1) + "- " + line[bullet.end():]
        out.append(_inline(line))
        index += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def api_block(names: list[str]) -> str:
    sections = []
    for dotted in names:
        obj = _resolve(dotted)
        shown = dotted
        if inspect.isclass(obj):
            signature = _signature(shown, obj)
        elif callable(obj):
            signature = _signature(shown, obj)
        else:
            signature = shown
        doc = inspect.getdoc(obj) or ""
        if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):
            doc = ""  # a dataclass's generated docstring repeats its signature
        sections.append(f"#### `{dotted}`\n\n```python\n{signature}\n```\n\n"
                        + (docstring_markdown(doc) if doc else "(no docstring)\n"))
    return "\n".join(sections)


# ---------------------------------------------------------------- samples of output

@dataclass
class Samples:
    plan: str
    simulate: str
    plan_file: str  # the plan.yaml the plan sample wrote


_SAMPLES: Samples | None = None


def _run(arguments: list[str], cwd: Path) -> str:
    environment = {**os.environ, "COLUMNS": SAMPLE_COLUMNS, "TERM": "dumb", "NO_COLOR": "1"}
    environment.pop("FORCE_COLOR", None)
    done = subprocess.run([sys.executable, "-m", "bytecomp", *arguments], cwd=cwd,
                          env=environment, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"bytecomp {' '.join(arguments)} failed:\n{done.stdout}{done.stderr}")
    return "\n".join(line.rstrip() for line in done.stdout.splitlines()) + "\n"


def samples() -> Samples:
    """Run the sample commands once (about a second each)."""
    global _SAMPLES
    if _SAMPLES is None:
        with tempfile.TemporaryDirectory() as folder:
            work = Path(folder)
            profile = os.path.relpath(ROOT / SAMPLE_PROFILE, work)
            plan = _run(["plan", profile, "--cluster", SAMPLE_CLUSTER, "--no-verify",
                         "--out", "plan.yaml"], work)
            simulate = _run(["simulate", profile, "plan.yaml", "--cluster", SAMPLE_CLUSTER],
                            work)
            plan_file = (work / "plan.yaml").read_text()
        _SAMPLES = Samples(plan, simulate, plan_file)
    return _SAMPLES


def _flow(value) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return text[:-3].strip() if text.endswith("\n...") else text  # a scalar's document end


def plan_file_excerpt(text: str) -> str:
    """The plan file's fields that decide execution, and a few of its records, cut."""
    import yaml

    plan = yaml.safe_load(text)
    lines = [f"{key}: {_flow(plan[key])}" for key in
             ("format_version", "cluster", "objective") if key in plan]
    lines.append(f"model_fingerprint: {plan['model_fingerprint'][:12]}...")
    lines += [f"{key}: {_flow(plan[key])}" for key in
              ("world_size", "nodes", "ranks_per_node", "bucket_cap_mb", "exchange",
               "host_workers", "compressors") if key in plan]
    predicted = plan["predicted_ms"]
    lines.append(f"predicted_ms: {{plan: {predicted['plan']}, baselines: {{fp32 DDP: "
                 f"{predicted['baselines']['fp32 DDP']}, ...}}, speedup_vs_fp32: "
                 f"{predicted['speedup_vs_fp32']}}}")
    search = plan["search"]
    lines.append("search: {" + ", ".join(f"{k}: {search[k]}" for k in
                                          ("algorithm", "time_ms", "lower_bound_ms", "gap")
                                          if k in search) + ", ...}")
    lines.append("tensors:")
    lines += [f"- {_flow(entry)}" for entry in plan["tensors"][:2]]
    lines.append("- ...")
    return "\n".join(lines) + "\n"


PLAN_COMMAND = (f"bytecomp plan {SAMPLE_PROFILE} --cluster {SAMPLE_CLUSTER} --no-verify "
                f"--out plan.yaml")
SIMULATE_COMMAND = f"bytecomp simulate {SAMPLE_PROFILE} plan.yaml --cluster {SAMPLE_CLUSTER}"


def sample_block(kind: str) -> str:
    found = samples()
    if kind == "plan":
        return f"```console\n$ {PLAN_COMMAND}\n{found.plan}```\n"
    if kind == "simulate":
        return f"```console\n$ {SIMULATE_COMMAND}\n{found.simulate}```\n"
    if kind == "plan-file":
        return "```yaml\n" + plan_file_excerpt(found.plan_file) + "```\n"
    if kind == "plan-head":
        # the title, the header, the plan's row and PyTorch's hooks, then the plan's line
        lines = found.plan.splitlines()
        last_row = next(i for i, line in enumerate(lines) if "PowerSGD hook" in line)
        start = next(i for i, line in enumerate(lines) if line.startswith("plan: "))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("search: "))
        return "```console\n$ " + PLAN_COMMAND + "\n" + "\n".join(
            [*lines[:last_row + 1], "  ... (every compressor on every tensor)",
             *lines[start:end]]) + "\n```\n"
    raise ValueError(f"unknown sample {kind!r}")


# ---------------------------------------------------------------- quotes of results files

def first_table(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end]) + "\n"


def quote_block(path: str) -> str:
    return first_table((ROOT / path).read_text())


# ---------------------------------------------------------------- blocks

def render(spec: str) -> str:
    kind, *arguments = spec.split()
    if kind == "options":
        return options_block(arguments[0])
    if kind == "api":
        return api_block(arguments)
    if kind == "sample":
        return sample_block(arguments[0])
    if kind == "quote":
        return quote_block(arguments[0])
    raise ValueError(f"unknown generated block {spec!r}")


def regenerate(text: str) -> str:
    def replace(match):
        return match.group(1) + render(match.group("spec")) + match.group(4)

    return BLOCK.sub(replace, text)


def normalized(text: str) -> str:
    """``text`` without what differs from run to run (a sample's search time)."""
    return VOLATILE.sub(lambda m: f"{m.group(1)}<t> ms" if m.group(1) is not None
                        else f"{m.group(2)}<t>", text)


# ---------------------------------------------------------------- benchmarks/results/INDEX.md

@dataclass
class Set:
    pattern: str  # a regular expression over the path under benchmarks/results/
    title: str
    command: str
    what: str


# Every file under benchmarks/results/ belongs to the first set whose pattern matches it.
SETS = [
    Set(r"pipeline_cost/", "bytecomp's own cost, profile to plan",
        "sudo python benchmarks/pipeline_cost.py",
        "Per task on 2 x 1 emulated ranks at 100 Mbit/s: the default profile (`profile/`), "
        "the same with `--calibration` (`profile-calibrated/`), the default plan and the "
        "plan with the earlier default's step count, each with its finalists' evidence "
        "(`*.finalists.csv`, `*.curves.csv`, `*.curves.png`), and the log; `summary.md` "
        "and `pipeline_cost.csv` collect the times, stages and targets."),
    Set(r"pipeline_cost-profiles-100mbit/", "The profile inside its budget, 100 Mbit/s",
        "sudo python benchmarks/pipeline_cost.py --profiles-only --bandwidth 100mbit --out "
        "benchmarks/results/pipeline_cost-profiles-100mbit",
        "On 2 x 1 emulated ranks at 100 Mbit/s, quiet machine: the default profile of the "
        "charlstm factory (measuring the cluster into a fresh cache) and of a 1.45M-parameter "
        "transformer (the cluster's tables from that cache), each stage against its share "
        "of --budget 240, the probe's share and steps; the log and the profiles."),
    Set(r"convergence-bow/", "Time to fp32 DDP's final loss: the sparse-embedding cell",
        "sudo python benchmarks/convergence_matrix.py --task bow-sgd --bandwidth 100mbit "
        "--out benchmarks/results/convergence-bow",
        "The matrix's bow-sgd cell alone (a bag-of-words classifier, 20,000-row embedding "
        "beside dense layers, SGD; 2 x 1 emulated ranks at 100 Mbit/s; 900 steps, fp32's "
        "loss at step 600 the target, fp32 DDP also on a second data order): its profile, "
        "the default and static plans with their finalists' evidence, the bench, "
        "matrix.csv and summary.md with the cell's noise floors."),
    Set(r"autotune/", "bytecomp.autotune from step 0",
        "sudo python benchmarks/autotune.py",
        "Per cell of the convergence matrix (2 x 1 emulated ranks): each strategy's run "
        "(`runs/*.json`: times since step 0, phases, validation curve), `curves.csv`, the "
        "tuner's log and saved plan, `cell.txt` (duration, load, steal, settings) and the "
        "driver's log; `summary.md` and `results.csv` collect the cells present and name "
        "the missing ones."),
    Set(r"convergence_matrix/", "Time to fp32 DDP's final loss: the matrix",
        "sudo python benchmarks/convergence_matrix.py",
        "Four tasks x two emulated links: per cell the profile (`profile/`, by `bytecomp "
        "profile` with the convergence probe), the default and `--static` plans, the bench "
        "(`bench/`, by `bytecomp bench --no-every --train-steps 300 --target-fraction "
        "0.6667`) and its log; `summary.md` and `matrix.csv` collect the cells."),
    Set(r"convergence/", "Time to accuracy on two tasks, with adaptive plans",
        "sudo python benchmarks/convergence.py --reuse-profiles",
        "Per run the profile (`profile/`, by `sudo python benchmarks/convergence.py` without "
        "`--reuse-profiles`), the plans (default, `--objective time`, `--adaptive topk`, "
        "`--adaptive powersgd`), the bench and `time-to-accuracy.png`; `summary.md` "
        "collects the runs, `load.txt` the machine's load during each, "
        "`conv10-digits-summary.txt` an earlier run's summary (see history.md)."),
    Set(r"emulated-hetero/", "Emulated cluster: a heterogeneous transformer",
        'sudo python benchmarks/emulated.py --models "transformer:vocab=32768,width=128,'
        'seq_len=64" --shapes 2x1 --bandwidths 100mbit 300mbit 1gbit --also-min-gain-0 '
        '--max-mb 16 --out benchmarks/results/emulated-hetero',
        "Per run the profile, the plan, the bench and the log; `summary.md`, `summary.csv`."),
    Set(r"emulated-vision/", "Emulated cluster: resnet18",
        "sudo python benchmarks/emulated.py --models resnet18:image=64 --shapes 2x1 "
        "--out benchmarks/results/emulated-vision",
        "Per run the profile, the plan, the bench and the log; `summary.md`, `summary.csv`."),
    Set(r"emulated-cnn-min-gain-0\.md", "Emulated cluster: cnn before the --min-gain margin",
        "python benchmarks/emulated.py --models cnn --min-gain 0",
        "The cnn runs planned with `--min-gain 0`, kept for the margin's reason."),
    Set(r"emulated/", "Emulated cluster: cnn and transformer, 2 x 1 and 2 x 2",
        "sudo python benchmarks/emulated.py --also-min-gain-0",
        "Per run the profile, the plans (`plan.yaml`, `plan-min-gain-0.yaml`), the benches "
        "(`bench/`, `bench-min-gain-0/` where that plan differs) and the log; "
        "`summary.md`, `summary.csv`."),
    Set(r"executor-overhead-digits-", "Executor overhead on digits",
        "python benchmarks/executor_overhead.py --model digits --trials 3 --rounds 120",
        "bytecomp's hook against PyTorch's for the same exchange, the controller's and the "
        "runtime trial's cost per step (the command is in each file's header)."),
    Set(r"executor-overhead-transformer-", "Executor overhead on the char-level transformer",
        "python benchmarks/executor_overhead.py --model transformer:layers=2,width=128,"
        "heads=4,seq_len=64,vocab=256 --trials 3 --rounds N",
        "As above, on the time-to-accuracy transformer; N (30, 40 or 60) is in each file's "
        "header."),
    Set(r"gpu-executor-overhead-", "Executor overhead on a GPU",
        "python benchmarks/executor_overhead.py --device cuda",
        "The old and the new package alternated in one GPU lease."),
    Set(r"gpu-check-", "The CUDA path", "make gpu-check",
        "The `cuda` tests, GPU compressor throughput, a one-GPU profile -> plan -> simulate "
        "(`benchmarks/gpu_check.py`)."),
    Set(r"fidelity-metrics-", "Which gain predicts steps",
        "python benchmarks/fidelity_metrics.py --measured "
        "benchmarks/results/convergence/<run>/summary.csv [--task digits]",
        "Gains measured along an Adam run beside the steps each strategy needed."),
    Set(r"lowrank-products-", "Low-rank products on the CPU",
        "python benchmarks/lowrank_products.py", "PowerSGD's products as written and thin "
        "factor first."),
    Set(r"group-times-", "Group times: a mixed plan measured against its simulation",
        "sudo bytecomp emulate --nodes 2 --bandwidth 1gbit -- python "
        "benchmarks/group_times.py PROFILE PLAN --model bench_factories:charlstm --steps 40",
        "The convergence matrix's charlstm-sgd plan at 1 Gbit/s, run alone group by group "
        "against its simulated iteration, and measured in bytecomp bench beside the "
        "baselines (twice each, one run of bench)."),
    Set(r"search-scale-40k", "Search quality on the scale set against 40,000-evaluation searches",
        "python benchmarks/search.py --set scale --repeats 3 --long-evaluations 40000 "
        "--markdown benchmarks/results/search-scale-40k.md",
        "The default searches (6 models, 4 GPU cluster configs, top-k and every compressor) "
        "against a local search of 40,000 evaluations with no margin, and the lower bound."),
    Set(r"search-scale-times\.md", "Search time on the scale set",
        "python benchmarks/search.py --set scale --repeats 5 --long-from "
        "benchmarks/results/search-scale.md --markdown benchmarks/results/search-scale-times.md",
        "The default searches timed, against the stored 60 s searches of search-scale.md."),
    Set(r"search-scale\.md", "Search quality on the scale set",
        "python benchmarks/search.py --set scale --repeats 3 --long-seconds 60 --markdown "
        "benchmarks/results/search-scale.md",
        "Default searches against 60 s searches and the lower bound, 10-314 tensors."),
    Set(r"search-exact\.md", "Exact search on small problems",
        "python benchmarks/search.py --set exact --repeats 3 --markdown "
        "benchmarks/results/search-exact.md",
        "The default search and --algorithm exact (10 s cap) on the LSTM (10 tensors, 4 "
        "GPU cluster configs), the classic MLP (10 tensors, 2 links), one compressor and "
        "every compressor, and the shipped cnn (20 tensors): times, proven or not."),
    Set(r"search-real-40k", "Search quality on real architectures' shapes against "
        "40,000-evaluation searches",
        "python benchmarks/search.py --set real --repeats 3 --long-evaluations 40000 "
        "--markdown benchmarks/results/search-real-40k.md",
        "VGG-16, ResNet-101, BERT-base, GPT-2 small, a U-GAT-IT-like GAN pair and a 2-layer "
        "LSTM LM, each tensor ready after its layers' backward time from FLOPs on a V100, on "
        "v100-nvlink-100g and v100-pcie-25g, top-k or every compressor, by time or effective "
        "time: the default search against a local search of 40,000 evaluations, the printed "
        "bound and gap, and the exact search up to 30 tensors (10 s cap); the run's duration "
        "and load at the end."),
    Set(r"search-small\.md", "Search time on small problems, in process CPU time",
        "python benchmarks/search.py --set small --repeats 5 --markdown "
        "benchmarks/results/search-small.md",
        "Planner set-up and search in process CPU time (median of 5) on the 10-tensor LSTM "
        "shapes (4 GPU cluster configs, top-k or every compressor), 161 and 1,500 tensors, "
        "each plan against the best single option on every tensor; the load at the end."),
    Set(r"search(-\d{4}-\d\d-\d\d[a-z]?)?\.md", "Search time, classic set",
        "python benchmarks/search.py --repeats 5 --markdown FILE",
        "10, 161 and 1,500 tensors, one compressor or all, two links, both objectives."),
    Set(r"startup-", "Start-up: bytecomp plan against import torch",
        "python benchmarks/startup.py", "Whole processes timed, interleaved."),
    Set(r"INDEX\.md", "This index", "python docs/generate.py", "This file."),
]


UNDESCRIBED = Set(r"", "Not yet described", "unknown",
                  "Files no set of docs/generate.py's SETS describes: add one there, with the "
                  "command that makes them (tests/test_docs.py fails until then).")


def set_of(relative: str) -> Set:
    for found in SETS:
        if re.match(found.pattern, relative):
            return found
    return UNDESCRIBED


def result_files() -> list[str]:
    return sorted(str(path.relative_to(RESULTS)) for path in RESULTS.rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts)


def _git_history() -> dict[str, tuple[tuple[str, str], tuple[str, str]]]:
    """Per file under benchmarks/results/: (commit, date) that added it and that last
    changed it, from one walk over git's log."""
    done = subprocess.run(["git", "log", "--format=@%h %ad", "--date=format:%Y-%m-%d %H:%M",
                           "--name-only", "--", "benchmarks/results"], cwd=ROOT,
                          capture_output=True, text=True)
    history: dict[str, list[tuple[str, str]]] = {}
    current: tuple[str, str] | None = None
    for line in done.stdout.splitlines():
        if line.startswith("@"):
            commit, date = line[1:].split(" ", 1)
            current = (commit, date)
        elif line.strip() and current is not None:
            history.setdefault(line.strip(), []).append(current)
    prefix = "benchmarks/results/"
    return {name[len(prefix):]: (commits[-1], commits[0]) for name, commits in history.items()
            if name.startswith(prefix)}


def _link(relative: str) -> str:
    # ":" would make "transformer:vocab=..." read as a URL scheme
    target = relative.replace(" ", "%20").replace(":", "%3A")
    return f"[{relative}]({target})"


def index_text() -> str:
    history = _git_history()
    files = result_files()
    if "INDEX.md" not in files:
        files = sorted([*files, "INDEX.md"])
    groups: dict[str, list[str]] = {}
    for relative in files:
        groups.setdefault(set_of(relative).title, []).append(relative)
    lines = [
        "# Benchmark results: index",
        "",
        "Every file under `benchmarks/results/`, the command that makes it, and the commit "
        "and date (UTC) that added it and last changed it (from `git log`). The pages that "
        "read these files: [docs/benchmarks.md](../../docs/benchmarks.md) (current figures) "
        "and [docs/history.md](../../docs/history.md) (earlier runs). Written by `python "
        "docs/generate.py` (`make docs`); `tests/test_docs.py` checks that it lists every "
        "file. A file not yet committed shows \"not committed\".",
        "",
        "Sets:",
        "",
    ]
    ordered = [found for found in [*SETS, UNDESCRIBED] if found.title in groups]
    for found in ordered:
        anchor = re.sub(r"[^\w\- ]", "", found.title.lower()).replace(" ", "-")
        lines.append(f"- [{found.title}](#{anchor}) ({len(groups[found.title])} files)")
    lines.append("")
    for found in ordered:
        lines += [f"## {found.title}", "", f"Made by `{found.command}`. {found.what}", "",
                  "| file | added | last changed |", "|---|---|---|"]
        for relative in groups[found.title]:
            if relative == "INDEX.md":  # its own commit would change it again: not shown
                lines.append(f"| {_link(relative)} | - | - |")
                continue
            added, last = history.get(relative, (("not committed", ""), ("not committed", "")))
            added_text = f"{added[0]} {added[1]}".strip()
            last_text = "same" if last == added else f"{last[0]} {last[1]}".strip()
            lines.append(f"| {_link(relative)} | {added_text} | {last_text} |")
        lines.append("")
    return "\n".join(lines)


def indexed_files(text: str) -> set[str]:
    """The files an index lists (the link text of each table row)."""
    return set(re.findall(r"^\| \[([^\]]+)\]\(", text, flags=re.MULTILINE))


# ---------------------------------------------------------------- main

def stale() -> list[str]:
    """The files whose generated parts differ from what would be generated now."""
    found = []
    for path in markdown_files():
        text = path.read_text()
        if BLOCK.search(text) and normalized(regenerate(text)) != normalized(text):
            found.append(str(path.relative_to(ROOT)))
    if not INDEX.exists() or indexed_files(INDEX.read_text()) != set(result_files()) | {"INDEX.md"}:
        found.append(str(INDEX.relative_to(ROOT)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    arguments = parser.parse_args()
    if arguments.check:
        found = stale()
        for name in found:
            print(f"stale: {name}")
        sys.exit(1 if found else 0)
    for path in markdown_files():
        text = path.read_text()
        if not BLOCK.search(text):
            continue
        new = regenerate(text)
        if normalized(new) != normalized(text):
            path.write_text(new)
            print(f"wrote {path.relative_to(ROOT)}")
    text = index_text()
    if not INDEX.exists() or INDEX.read_text() != text:
        INDEX.write_text(text)
        print(f"wrote {INDEX.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
