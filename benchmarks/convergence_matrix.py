"""Time to fp32 DDP's final validation loss, a matrix of tasks x emulated clusters: the
default plan (finalists verified by measured steps, the runtime trial) and the
``--static`` plan against fp32 DDP and PyTorch's fp16 and PowerSGD hooks.

Tasks, each profiled with its own recipe as a user would:

* ``charlm-adam``: the char transformer with Adam (the built-in recipe);
* ``digits-sgd``: the digits convnet with SGD and momentum (``--optimizer``);
* ``charlstm-sgd``: a recurrent language model on real text through a user factory
  (``bench_factories:charlstm``: SGD, momentum 0.9, rate 1, clipping at 1);
* ``hetero-adam``: a transformer with a 16384-row embedding beside many small
  tensors (the heterogeneous case where per-tensor plans have room to win);
* ``bow-sgd``: the ``bow`` bag-of-words classifier, a 20000-row embedding of which a
  batch touches a few percent beside dense layers, with its recipe (SGD, momentum).

Cells: every task on 2 nodes x 1 rank (``bytecomp emulate``) at 100 Mbit/s and 1
Gbit/s, and ``charlm-adam`` on 2 nodes x 2 ranks at 100 Mbit/s between the nodes and
loopback inside them (a hierarchical cluster: the profile measures both links and
the search offers two-level exchanges). Per cell: ``bytecomp profile`` (with the
convergence probe), ``bytecomp plan`` (the default: finalists trained and chosen by
measured steps, a runtime trial where they cannot be separated) and ``bytecomp plan
--static``, then one ``bytecomp bench --train-steps
1.5N --target-fraction 0.6667 --no-every --reference-seed 1`` (fp32 DDP a second time,
on another data order): every strategy trains 1.5N steps from the same weights on the same batches,
interleaved step by step on the shaped links; the target is fp32 DDP's validation
loss after N steps (its final loss; N = ``--steps``, 600), so a strategy has 1.5x
fp32's steps to reach it.

Noise floors, per cell, in summary.md:

* time: the default and the static plan (the same plan where no runtime trial runs)
  finish some way apart; a plan against a baseline closer than that is a tie, neither
  a win nor a loss;
* loss: fp32 DDP on a second data order ends some way from fp32 DDP at step N; a
  plan that comes within that of fp32's final loss has reached it (its time to that
  loss is reported where it misses the exact one).

Also per cell: whether fp32's loss had flattened by step N (it fell at most 3% over
the last quarter, the rule ``bytecomp plan``'s verification stops by), the runtime
trial's share of the run (its warm-up and trial steps over the 1.5N steps), the
compute-only bound (fp32 step / compute-only step) and, for the 2 x 2 cell, its
compute-only step against the 2 x 1 cell's of the same task and link: 4 ranks on a
machine's cores can compute much slower than 2, and then the cell measures another
balance of compute and communication than a real 2 x 2 cluster; the summary says so.

Targets, evaluated in summary.md:

* the default plan reaches fp32's final loss (within the loss's noise floor) in
  every cell;
* its time to that loss is at most 1.05x the best of the three hand-picked baselines
  (fp32 DDP, fp16 hook, PowerSGD hook; a tie counts as met), and at least 10% ahead
  of it (outside the time's noise floor) in at least 3 cells;
* at 100 Mbit/s it is at least 2.5x sooner than fp32 DDP in every cell whose
  compute-only bound allows 3x.

The matrix runs in pieces: each cell is its own command (``--cell NAME``, or the
``--task``/``--bandwidth``/``--layout`` filters) writing its own folder under
``--out``, with its duration, load and steal recorded in ``cell.txt``; the expected
duration is printed before a cell starts (the last run of that cell, else the
estimate in ``EXPECTED_MIN``). ``--summarize`` rebuilds summary.md from whatever
cells exist and names the missing ones; the targets are evaluated only when every
cell is there. Savings that cost no noise: where the default plan has no runtime trial
the static plan is the same plan, so it is copied, not planned again (bench still
trains both side by side: their gap is then two identical strategies', the time's
noise floor itself).

Needs root (network namespaces).

    python benchmarks/convergence_matrix.py --list
    python benchmarks/convergence_matrix.py --cell bow-sgd-2x1-100mbit
    python benchmarks/convergence_matrix.py --task bow-sgd --bandwidth 100mbit
    python benchmarks/convergence_matrix.py --summarize
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from bytecomp.plan_file import load_plan
from bytecomp.training.convergence import (
    Training,
    flat,
    last_quarter,
    loss_at,
    reference_name,
    steps_to,
    time_at,
)

sys.path.insert(0, str(Path(__file__).parent))
from convergence import BYTECOMP, emulated_profile, run  # noqa: E402
from machine_load import load  # noqa: E402

TASKS = {  # name: (model spec, profile flags)
    "charlm-adam": ("transformer:layers=2,width=128,heads=4,seq_len=64,vocab=256", []),
    "digits-sgd": ("digits", ["--optimizer", "sgd:lr=0.05,momentum=0.9"]),
    "charlstm-sgd": ("bench_factories:charlstm", []),
    "hetero-adam": ("transformer:layers=2,width=64,heads=4,seq_len=64,vocab=16384", []),
    "bow-sgd": ("bow", []),
}
# --smoke: the same tasks, tiny (the driver end to end in a minute or two a cell)
SMOKE_SPECS = {
    "charlm-adam": "transformer:layers=1,width=32,heads=2,seq_len=16,vocab=64",
    "digits-sgd": "digits:width=4",
    "charlstm-sgd": "bench_factories:charlstm",
    "hetero-adam": "transformer:layers=1,width=16,heads=2,seq_len=16,vocab=2048",
    "bow-sgd": "bow:vocab=2000,width=8,hidden=16",
}
BANDWIDTHS = ["100mbit", "1gbit"]
LAYOUTS = {"2x1": 1, "2x2": 2}  # nodes x ranks per node: ranks per node
# (task, layout, bandwidth): every task on 2 x 1 at both rates, and the hierarchical cell
CELLS = [(task, "2x1", bandwidth) for task in TASKS for bandwidth in BANDWIDTHS] + \
    [("charlm-adam", "2x2", "100mbit")]
STEPS = 600  # fp32 DDP's steps to its final loss, at least: every strategy trains 1.5x
FLAT_FALL = 0.03  # fp32's loss has flattened: it fell at most this over the last quarter
REFERENCE_SEED = 1  # the second data order of fp32 DDP (the run's own is 0)
COMPRESSORS = ["fp16", "int8", "topk:ratio=0.01", "powersgd:rank=4", "efsignsgd"]
BASELINES = ["fp32 DDP", "fp16 hook", "PowerSGD hook"]
DEFAULT, STATIC = "bytecomp plan", "bytecomp plan: plan-static"
REFERENCE = "fp32 DDP, 2nd data order"
COMPUTE_ONLY = "compute only (no communication)"
WITHIN, AHEAD = 1.05, 1.10  # the targets: at most 1.05x the best baseline, 10% ahead
# 4 ranks computing this much slower than 2 on the same machine: the 2 x 2 cell's
# balance of compute and communication is not a 2 x 2 cluster's
CROWDED = 1.5
# a cell's minutes on 2 quiet cores where no run of it is recorded yet: the bow-sgd
# 100 Mbit/s cell took 19 (900 steps a strategy, two plans); the others are scaled from
# it by their fp32 step (an estimate, replaced by the cell's own cell.txt once it ran)
EXPECTED_MIN = {"2x1-100mbit": 30, "2x1-1gbit": 20, "2x2-100mbit": 45}


def cell_name(task: str, layout: str, bandwidth: str) -> str:
    return f"{task}-{layout}-{bandwidth}"


def all_cells() -> list[str]:
    return [cell_name(*c) for c in CELLS]


def expected_minutes(task: str, layout: str, bandwidth: str, out: Path) -> tuple[float, str]:
    """The cell's expected minutes and where the figure comes from."""
    record = out / cell_name(task, layout, bandwidth) / "cell.txt"
    if record.exists():
        for line in record.read_text().splitlines():
            if line.startswith("minutes: "):
                return float(line.split()[1]), "its last run"
    return EXPECTED_MIN[f"{layout}-{bandwidth}"], "an estimate"


def settings_of(folder: Path) -> str | None:
    """The settings a cell's folder was run with (cell.txt's command), None where it
    predates cell.txt (an earlier form of the matrix)."""
    record = folder / "cell.txt"
    if not record.exists():
        return None
    for line in record.read_text().splitlines():
        if line.startswith("command: "):
            return line.split("--cell ", 1)[-1].split(" ", 1)[-1]
    return None


def current_settings(args) -> str:
    return f"{'--smoke ' if args.smoke else ''}--steps {args.steps}"


def cells_lines(folders: list[Path], missing: list[str], args) -> list[str]:
    """Which cells the summary has, at which settings, and which are missing."""
    stale = [f.name for f in folders if settings_of(f) != current_settings(args)]
    return [f"Cells: {len(folders)} of {len(all_cells())} present"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; run at other settings than `{current_settings(args)}` (an earlier "
               f"form of the matrix, or other flags): {', '.join(stale)}" if stale else "")
            + ". Each cell runs alone: `sudo python benchmarks/convergence_matrix.py "
              "--cell NAME`; `--list` shows them."]


def cell(task: str, layout: str, bandwidth: str, out: Path, args) -> Path:
    """Profile, plan twice (once where no runtime trial runs), bench and train one task
    on one cluster; files in out/<cell>/, its duration, load and steal in cell.txt."""
    minutes, source = expected_minutes(task, layout, bandwidth, out)
    print(f"{cell_name(task, layout, bandwidth)}: starting, about {minutes:.0f} min "
          f"({source}{'; --smoke is far shorter' if args.smoke else ''}); "
          f"{load()}", flush=True)
    before = load()
    spec, flags = TASKS[task]
    spec = SMOKE_SPECS[task] if args.smoke else spec
    steps = args.steps
    started = time.monotonic()
    smoke = ["--quick", "--probe-steps", "4", "--iterations", "2"] if args.smoke \
        else ["--iterations", "6"]
    profile, emulate, log = emulated_profile(
        out / cell_name(task, layout, bandwidth), bandwidth,
        ["--model", spec, *flags, *smoke,
         *[flag for c in COMPRESSORS for flag in ("--compressor", c)]], args.reuse_profiles,
        ranks_per_node=LAYOUTS[layout])
    folder = profile.parent
    plans = [folder / "plan.yaml", folder / "plan-static.yaml"]
    model = ["--model", spec]  # a factory is built only when named (bytecomp.model_spec)
    verify = ["--verify-steps", "4"] if args.smoke else []
    # plan spawns the finalists' ranks on this machine, up to its cores; a profile of more
    # ranks (2 x 2 on 2 cores) trains them on the emulated cluster's ranks instead, as a
    # user would on the profiled nodes
    where = emulate if LAYOUTS[layout] > 1 else []
    run([*where, *BYTECOMP, "plan", str(profile), "--out", str(plans[0]), *model, *verify],
        log)
    default = load_plan(plans[0])
    if default.adaptive is None or not default.adaptive.trial:
        # no runtime trial: --static would write this same plan; bench trains the copy
        # beside it, so the pair measures two identical strategies (the noise floor)
        shutil.copyfile(plans[0], plans[1])
        with open(log, "a") as stream:
            stream.write("# the default plan has no runtime trial: plan-static.yaml is a "
                         "copy of plan.yaml\n")
    else:
        run([*where, *BYTECOMP, "plan", str(profile), "--out", str(plans[1]), "--static",
             *model, *verify], log)
    run([*emulate, *BYTECOMP, "bench", str(profile), *model,
         *[flag for path in plans for flag in ("--plan", str(path))],
         "--out", str(folder / "bench"), "--force", "--no-every",
         "--iterations", "3" if args.smoke else "6",
         "--train-steps", str(int(steps * 1.5)), "--target-fraction", f"{1 / 1.5:.6f}",
         "--eval-every", str(args.eval_every), "--reference-seed", str(REFERENCE_SEED)], log)
    minutes = (time.monotonic() - started) / 60
    (folder / "cell.txt").write_text(
        f"cell: {folder.name}\ncommand: python benchmarks/convergence_matrix.py --cell "
        f"{folder.name}{' --smoke' if args.smoke else ''} --steps {steps}\n"
        f"minutes: {minutes:.1f}\nbefore: {before}\nafter: {load()}\n")
    print(f"{folder.name}: done in {minutes:.1f} min", flush=True)
    return folder


def _short(name: str) -> str:
    """A strategy's name in the matrix: one PowerSGD hook a cell, whatever its rank."""
    if name.startswith("PowerSGD hook"):
        return "PowerSGD hook"
    return REFERENCE if name == reference_name(REFERENCE_SEED) else name


def training(folder: Path) -> Training:
    """The cell's training, read back from bench's curves.csv, steps.csv and levels.csv
    (the default plan's trial levels), named as in the matrix."""
    bench = folder / "bench"
    curves = pd.read_csv(bench / "curves.csv")
    steps = pd.read_csv(bench / "steps.csv")
    levels = pd.read_csv(bench / "levels.csv") if (bench / "levels.csv").exists() else None
    return Training(
        {_short(name): list(zip(group.step, group.validation_loss))
         for name, group in curves.groupby("strategy", sort=False)},
        {_short(name): list(group.ms) for name, group in steps.groupby("strategy", sort=False)},
        {} if levels is None else
        {_short(name): list(zip(group.step, group.level, group.gain))
         for name, group in levels.groupby("strategy", sort=False)})


def rows(folder: Path) -> pd.DataFrame:
    """The strategies of one cell: steps and time to fp32's final loss, final loss."""
    table = pd.read_csv(folder / "bench" / "convergence.csv")
    table["strategy"] = [_short(name) for name in table.strategy]
    table = table.set_index("strategy")
    names = [n for n in [*BASELINES, DEFAULT, STATIC, REFERENCE] if n in table.index]
    cell = table.loc[names, ["steps_to_target", "time_to_target_s", "target_loss",
                             "final_loss"]].copy()
    cell.insert(0, "cell", folder.name)
    facts = cell_facts(folder)
    cell["compute_bound"] = facts["compute_bound"]
    return cell.reset_index()


def cell_facts(folder: Path) -> dict:
    """What the cell's targets are judged with: the noise floors of time and loss, fp32's
    flatness at step N, the runtime trial's share, the compute-only step and bound, and
    each strategy's time to fp32's final loss within the loss's floor."""
    timing = pd.read_csv(folder / "bench" / "bench.csv").set_index("strategy")
    convergence = pd.read_csv(folder / "bench" / "convergence.csv")
    convergence["strategy"] = [_short(name) for name in convergence.strategy]
    convergence = convergence.set_index("strategy")
    run = training(folder)
    total = len(run.step_ms["fp32 DDP"])
    steps = round(total / 1.5)  # N: the target is fp32's loss there
    fp32 = [(s, loss) for s, loss in run.curves["fp32 DDP"] if s <= steps]
    target = float(convergence.target_loss.iloc[0])
    facts: dict = {"steps": steps, "total": total, "target": target,
                   "compute_ms": float(timing.measured_ms[COMPUTE_ONLY]),
                   "compute_bound": float(timing.measured_ms["fp32 DDP"] /
                                          timing.measured_ms[COMPUTE_ONLY]),
                   "flat": flat(fp32, steps, FLAT_FALL),
                   "last_quarter": last_quarter(fp32, steps)}
    # the loss: how far fp32 on a second data order ends from fp32, at step N
    facts["reference_loss"] = loss_at(run.curves[REFERENCE], steps) \
        if REFERENCE in run.curves else math.nan
    facts["loss_floor"] = abs(facts["reference_loss"] - target)
    within = {}
    for name in (*BASELINES, DEFAULT, STATIC):
        if name not in run.curves:
            continue
        reached = steps_to(run.curves[name], target + facts["loss_floor"]) \
            if facts["loss_floor"] == facts["loss_floor"] else None
        within[name] = math.nan if reached is None else \
            time_at(run.typical_ms(name), reached)
    facts["within_floor_s"] = within
    # the time: how far the default and the static plan finish apart
    default, static = (convergence.time_to_target_s.get(name, math.nan)
                       for name in (DEFAULT, STATIC))
    facts["time_floor"] = abs(default - static) / min(default, static) \
        if min(default, static) > 0 else math.nan  # NaN where either missed (or at step 0)
    plan = load_plan(folder / "plan.yaml")
    adaptive = plan.adaptive
    trial = adaptive is not None and bool(adaptive.trial)
    facts["trial"] = trial
    facts["trial_share"] = (adaptive.trial_steps + adaptive.trial_warmup) / total \
        if trial and adaptive is not None else 0.0
    return facts


def evaluate(table: pd.DataFrame, folders: list[Path]) -> list[str]:
    """The targets over every cell, met or not, with each cell's noise floors."""
    lines, ahead = [], 0
    by_name = {folder.name: folder for folder in folders}
    for name, cell in table.groupby("cell", sort=False):
        facts = cell_facts(by_name[name])
        cell = cell.set_index("strategy")
        lines.append(f"- **{name}**: target {facts['target']:.4f} (fp32 DDP at step "
                     f"{facts['steps']} of {facts['total']}; its loss fell "
                     f"{100 * facts['last_quarter']:.1f}% over the last quarter: "
                     f"{'flat' if facts['flat'] else 'NOT flat'}, rule <= "
                     f"{100 * FLAT_FALL:g}%)")
        lines += _noise_lines(facts)
        lines += _hierarchy_lines(name, facts, by_name)
        plan = cell.loc[DEFAULT]
        time_s, how = plan.time_to_target_s, "fp32's final loss"
        if time_s != time_s:
            time_s, how = facts["within_floor_s"].get(DEFAULT, math.nan), \
                "fp32's final loss within the loss's noise floor"
        if time_s != time_s:
            lines.append("  - the default plan did not reach fp32's final loss, nor come "
                         "within the noise floor of it: MISSED")
            continue
        baselines = {}
        for baseline in BASELINES:
            seconds = cell.time_to_target_s.get(baseline, math.nan)
            if seconds != seconds:  # judged as the plan is: within the loss's floor
                seconds = facts["within_floor_s"].get(baseline, math.nan)
            if seconds == seconds:
                baselines[baseline] = seconds
        lines.append(f"  - the default plan reached {how} in {time_s:.3g} s")
        if baselines:
            best = min(baselines, key=lambda b: baselines[b])
            ratio = time_s / baselines[best]
            tie = abs(ratio - 1) <= facts["time_floor"]
            ahead += ratio <= 1 / AHEAD and not tie
            verdict = "a tie: inside the time's noise floor, met" if tie else \
                ("met" if ratio <= WITHIN else "MISSED")
            lines.append(f"  - best baseline {best} {baselines[best]:.3g} s: {ratio:.2f}x "
                         f"({verdict}; target <= {WITHIN:.2f}x)")
        fp32 = baselines.get("fp32 DDP", math.nan)
        if name.endswith("100mbit") and fp32 == fp32:
            speedup = fp32 / time_s
            allowed = facts["compute_bound"] >= 3
            verdict = ("met" if speedup >= 2.5 else "MISSED") if allowed else \
                "not required: compute-only bound below 3x"
            lines.append(f"  - vs fp32 DDP at 100 Mbit/s: {speedup:.2f}x (compute-only bound "
                         f"{facts['compute_bound']:.1f}x; {verdict}, target >= 2.5x)")
    cells = table.cell.nunique()
    lines.append(f"- at least 10% ahead of the best baseline, outside the noise floor, in "
                 f"{ahead} of {cells} cells ({'met' if ahead >= 3 else 'MISSED'}, target >= 3)")
    return lines


def _noise_lines(facts: dict) -> list[str]:
    """A cell's noise floors and its runtime trial's share of the run."""
    lines = []
    if facts["time_floor"] == facts["time_floor"]:
        lines.append(f"  - time's noise floor: the default and the static plan finished "
                     f"{100 * facts['time_floor']:.1f}% apart ("
                     f"{'a runtime trial ran, so the plans differ in it' if facts['trial'] else 'the same plan: no runtime trial'})")
    else:
        lines.append("  - time's noise floor: unknown (the default or the static plan did "
                     "not reach the target)")
    if facts["loss_floor"] == facts["loss_floor"]:
        lines.append(f"  - loss's noise floor: fp32 DDP on a second data order at step "
                     f"{facts['steps']}: {facts['reference_loss']:.4f}, "
                     f"{facts['loss_floor']:.4f} from fp32's {facts['target']:.4f} "
                     f"({100 * facts['loss_floor'] / facts['target']:.2f}%); a plan within "
                     f"that of it has reached it")
    share = facts["trial_share"]
    lines.append(f"  - runtime trial (its warm-up and trial steps): "
                 f"{100 * min(share, 1):.1f}% of the {facts['total']} steps" +
                 ("" if facts["trial"] else " (none ran)") +
                 (" (it is longer than the run)" if share > 1 else ""))
    return lines


def _hierarchy_lines(name: str, facts: dict, by_name: dict[str, Path]) -> list[str]:
    """For a cell of more than one rank a node: its compute-only step against the 2 x 1
    cell's of the same task and link, and whether it is measurable as a cluster."""
    task, _, rest = name.rpartition("-2x")
    if not rest or rest.startswith("1-"):
        return []
    twin = by_name.get(f"{task}-2x1-{rest.partition('-')[2]}")
    if twin is None:
        return [f"  - compute-only step {facts['compute_ms']:.1f} ms; no 2 x 1 cell of "
                f"{task} on this link to compare it with (run it too)"]
    ratio = facts["compute_ms"] / cell_facts(twin)["compute_ms"]
    verdict = (f"4 ranks share the machine's {os.cpu_count()} cores: they compute "
               f"{ratio:.2f}x slower than 2, so communication is a smaller share of the "
               f"step than on a real 2 x 2 cluster and compression's gain is understated"
               ) if ratio > CROWDED else "comparable to 2 ranks' compute"
    return [f"  - compute-only step {facts['compute_ms']:.1f} ms against the 2 x 1 cell's "
            f"{cell_facts(twin)['compute_ms']:.1f} ms: {ratio:.2f}x ({verdict})"]


def markdown(table: pd.DataFrame) -> list[str]:
    """The matrix as a markdown table (NaN: did not reach the loss)."""
    def text(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(text(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/convergence_matrix"))
    parser.add_argument("--task", action="append", choices=sorted(TASKS))
    parser.add_argument("--bandwidth", action="append", choices=BANDWIDTHS)
    parser.add_argument("--layout", action="append", choices=sorted(LAYOUTS),
                        help="nodes x ranks per node (2x2: the hierarchical cell)")
    parser.add_argument("--steps", type=int, default=STEPS,
                        help="fp32 DDP's steps to its final loss (every strategy trains 1.5x)")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--reuse-profiles", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models, short runs: the driver end to end, no figures")
    parser.add_argument("--summarize", action="store_true",
                        help="only summarize the cells already under --out")
    parser.add_argument("--cell", action="append", choices=all_cells(),
                        help="run this cell (repeatable; default: every cell the filters "
                             "leave)")
    parser.add_argument("--list", action="store_true",
                        help="list the cells, which exist under --out, their expected time")
    args = parser.parse_args()
    if args.list:
        for task, layout, bandwidth in CELLS:
            name = cell_name(task, layout, bandwidth)
            minutes, source = expected_minutes(task, layout, bandwidth, args.out)
            folder = args.out / name
            state = "missing" if not (folder / "bench" / "convergence.csv").exists() else \
                "done" if settings_of(folder) == current_settings(args) else "stale"
            print(f"{name:28} {state:8} about {minutes:.0f} min ({source})")
        return
    if args.steps < 1 or args.eval_every < 1:
        raise SystemExit("--steps and --eval-every must be at least 1")
    if not args.summarize and os.geteuid() != 0:
        raise SystemExit("needs root: bytecomp emulate makes network namespaces")
    # the user factory of charlstm-sgd is importable in every rank and every command
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parent.resolve()), os.environ.get("PYTHONPATH")]))
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [(task, layout, bandwidth) for task, layout, bandwidth in CELLS
              if task in (args.task or TASKS) and layout in (args.layout or LAYOUTS)
              and bandwidth in (args.bandwidth or BANDWIDTHS)
              and (not args.cell or cell_name(task, layout, bandwidth) in args.cell)]
    if not args.summarize:
        if not chosen:
            raise SystemExit("no cell of the matrix matches --task, --layout and --bandwidth")
        for task, layout, bandwidth in chosen:
            cell(task, layout, bandwidth, args.out, args)
    folders = sorted(p for p in args.out.iterdir() if (p / "bench" / "convergence.csv").exists())
    if not folders:
        raise SystemExit(f"no cell under {args.out} has been run")
    missing = [name for name in all_cells() if name not in {f.name for f in folders}]
    table = pd.concat([rows(folder) for folder in folders], ignore_index=True)
    table.to_csv(args.out / "matrix.csv", index=False)
    text = ["# Time to fp32 DDP's final validation loss", "",
            f"`python benchmarks/convergence_matrix.py {' '.join(sys.argv[1:])}` "
            f"({time.strftime('%Y-%m-%d %H:%M')}; cells: {', '.join(f.name for f in folders)})",
            "", *cells_lines(folders, missing, args), "",
            *markdown(table), "", "## Targets", "",
            *([] if not missing else
              [f"Evaluated on the {len(folders)} cells present; the matrix's targets hold "
               f"only once every cell is measured ({len(missing)} missing).", ""]),
            *evaluate(table, folders), ""]
    (args.out / "summary.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
