"""``bytecomp.autotune`` from step 0: a plain training script with one added line, against
fp32 DDP and PyTorch's fp16 and PowerSGD hooks, to fp32 DDP's final validation loss, on
cells of the convergence matrix (``benchmarks/convergence_matrix.py``: its tasks, their
recipes and its emulated 2-node clusters).

Each strategy is one run of the same plain training loop (one process a rank, launched
by ``bytecomp emulate`` on the cell's cluster): the task's model built under seed 0 (the
same initial weights in every run), the recipe's optimizer and schedule, step ``s``'s
batch on rank ``r`` drawn under the seed (0, r, s) as ``bytecomp bench`` draws it (the
same batches for every strategy), ``DistributedDataParallel(model, bucket_cap_mb=25)``
as the matrix's bench builds it (``BUCKET_CAP_MB``: one bucket for these models). The
strategies differ in one place only:

* ``fp32 DDP``: DDP as it is;
* ``fp16 hook``: ``ddp.register_comm_hook(None, fp16_compress_hook)``;
* ``PowerSGD hook``: PyTorch's ``powerSGD_hook`` at the matrix's rank (4, error
  feedback, warm start, ``start_powerSGD_iter=2``: what ``bytecomp bench`` trains);
* ``bytecomp.autotune``: ``tuner = bytecomp.autotune(ddp, plan_out=...)``, its default
  settings (the plan saved in the cell's folder): it measures fp32 DDP, plans in a
  child process beside the job, runs the runtime trial and keeps one candidate, all
  inside the run;
* ``fp32 DDP, again``: fp32 DDP a second time, last: two identical strategies run apart
  by the whole cell, the time's noise floor (and the machine's drift over the cell).

fp32 DDP trains N steps (``--steps``, 600 as in the matrix): its validation loss there
is the target. The others train 1.5N steps. Time is wall-clock from step 0 on (the
measuring, planning and trial phases included), the slowest rank's: each step's
duration is the gap between the end of the step before and its own end, less what the
benchmark itself does between steps (drawing the batch, copying the weights). The loop
has no pause: the weights are copied every ``--eval-every`` steps (rank 0, in memory)
and evaluated on the task's fixed validation batches after the run, so no evaluation
stalls a step the tuner times. Per strategy and step: the time since step 0, the step's
duration and, for autotune, its phase and level (``curves.csv``).

Targets, evaluated in summary.md on the cells present (the missing ones named):

* autotune's time to fp32's final loss is at most 1.05x the best of fp32 DDP, the fp16
  hook and the PowerSGD hook in every cell (a gap inside the time's noise floor, fp32
  DDP's two runs apart, is a tie: met);
* it is at least 10% ahead of that best baseline, outside the noise floor, in at least
  2 cells;
* a step of the measuring phase is at most 5% slower than fp32 DDP's: the median step
  of autotune's measuring phase against fp32 DDP's median over the same steps (fp32's
  two runs' gap on those steps reported beside it).

Cells (``DEFAULT_CELLS``, cheap ones that cover the issue): bow-sgd (the sparse
embedding) and charlm-adam at 100 Mbit/s, digits-sgd at 1 Gbit/s (where fp32 DDP is
the best baseline: autotune must not cost), and charlstm-sgd at 100 Mbit/s, the
costliest of them (where the matrix's plan was ahead of every baseline). The runs of a
cell follow one another (a plain script each, nothing interleaved): the machine's drift
between them is in the noise floor, fp32 DDP's first and last run. Any other cell of the matrix runs with
``--cell``. Each cell is its own command writing its own folder under ``--out``
(``curves.csv``, the tuner's log, its plan, ``cell.txt`` with the duration, the load
and steal before and after, and the settings); the expected duration is printed before
a cell starts (its last run, else the estimate in ``EXPECTED_MIN``). ``--summarize``
rebuilds summary.md from the cells present and names the missing ones. ``--steps``
shortens a cell in proportion; ``--smoke`` runs the matrix's tiny models for a few
steps (the driver end to end, about a minute a cell; no figures).

Needs root (network namespaces).

    python benchmarks/autotune.py --list
    python benchmarks/autotune.py --cell bow-sgd-2x1-100mbit
    python benchmarks/autotune.py                      # every cell of DEFAULT_CELLS
    python benchmarks/autotune.py --smoke --cell bow-sgd-2x1-100mbit --out /tmp/autotune-smoke
    python benchmarks/autotune.py --summarize
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from bytecomp.training.convergence import steps_to, time_at

sys.path.insert(0, str(Path(__file__).parent))
from convergence import BYTECOMP, run  # noqa: E402
from convergence_matrix import LAYOUTS, SMOKE_SPECS, TASKS, all_cells  # noqa: E402
from machine_load import load, snapshot  # noqa: E402

SCRIPT = Path(__file__).resolve()
DEFAULT_CELLS = ["bow-sgd-2x1-100mbit", "charlm-adam-2x1-100mbit", "digits-sgd-2x1-1gbit",
                 "charlstm-sgd-2x1-100mbit"]
STEPS, SMOKE_STEPS = 600, 60  # fp32 DDP's steps: its loss there is the target
EVAL_EVERY, SMOKE_EVAL_EVERY = 25, 10
LONGER = 1.5  # every other strategy trains this many times fp32's steps
POWERSGD_RANK = 4  # the matrix's profiles' powersgd:rank=4: its PowerSGD hook's rank
DATA_SEED = 0
# DDP's cap, given as bytecomp bench gives the profile's (25 MiB): given, it also caps DDP's
# first bucket (left out, that one is 1 MiB), so these models' gradients are one bucket,
# as in the matrix's training. On two buckets PyTorch's powerSGD_hook issues a bucket's
# second allreduce from the first one's callback, in another order on each rank: gloo
# aborts (charlstm-sgd: "Received data size doesn't match expected size"; see
# bytecomp/runtime/native.py's one_bucket)
BUCKET_CAP_MB = 25
VALIDATION_BATCHES = 8  # as bytecomp bench evaluates
PLAN_OUT = "autotune-plan.yaml"
CURVES = "curves.csv"
FP32, FP16, POWERSGD, AUTOTUNE = "fp32 DDP", "fp16 hook", "PowerSGD hook", "bytecomp.autotune"
AGAIN = "fp32 DDP, again"
# (key on the rank's command line, name, steps as a multiple of N), in the order they run
STRATEGIES = [("fp32", FP32, 1.0), ("fp16", FP16, LONGER), ("powersgd", POWERSGD, LONGER),
              ("autotune", AUTOTUNE, LONGER), ("fp32-again", AGAIN, 1.0)]
BASELINES = [FP32, FP16, POWERSGD]
WITHIN, AHEAD, AHEAD_CELLS, MEASURING = 1.05, 1.10, 2, 1.05  # the targets
# a cell's minutes at --steps 600 on 2 cores, before any run of it is recorded: the
# strategies' steps measured in a 10-step run of the default cells (fp32 DDP 273, 208,
# 8 and 637 ms; PowerSGD 48, 45, 14, 144 ms), fp32 twice x 600 steps, the others 900
# (autotune at fp32's step for its first 200), plus about 1.5 min of launching 5 runs;
# the other cells scaled from the matrix's step times. Replaced by the cell's own
# cell.txt once it ran
EXPECTED_MIN = {"bow-sgd-2x1-100mbit": 11, "charlm-adam-2x1-100mbit": 9,
                "digits-sgd-2x1-1gbit": 2.5, "charlstm-sgd-2x1-100mbit": 24,
                "bow-sgd-2x1-1gbit": 4, "charlm-adam-2x1-1gbit": 4, "digits-sgd-2x1-100mbit": 3,
                "charlstm-sgd-2x1-1gbit": 8, "hetero-adam-2x1-100mbit": 35,
                "hetero-adam-2x1-1gbit": 10, "charlm-adam-2x2-100mbit": 15}
LAUNCH_MIN = 1.5  # of a cell's minutes: the runs' start-up, whatever the steps
SMOKE_MIN = 1.0


# ------------------------------------------------------------------------- one rank's run
def plain_training(run_name: str, spec: str, optimizer: str | None, steps: int,
                   eval_every: int, folder: Path) -> None:
    """One strategy's run on this rank (``run_name``: a key of :data:`STRATEGIES`): the
    plain training loop every strategy shares, ``bytecomp.autotune`` one added line. What
    it measured goes to ``folder/runs/<run_name>.json`` (rank 0)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel

    import bytecomp
    from bytecomp.training.workloads import load_workload

    dist.init_process_group("gloo")
    workload = load_workload(spec, optimizer=optimizer)  # seed 0: the same initial weights
    model = workload.model
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    optim = workload.make_optimizer(model.parameters())
    scheduler = workload.make_scheduler(optim)
    strategy = run_name.removesuffix("-again")
    tuner = None
    if strategy == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif strategy == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                       start_powerSGD_iter=2, min_compression_rate=2,
                                       use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    elif strategy == "autotune":
        tuner = bytecomp.autotune(ddp, plan_out=str(folder / PLAN_OUT))  # the one added line
    record = Record(model, tuner, steps, eval_every)
    for step in range(1, steps + 1):
        with record.paused():
            inputs, target = _batch(workload, step)
        workload.loss(ddp(*inputs), target).backward()
        optim.step()
        optim.zero_grad()
        if scheduler is not None:
            scheduler.step()
        record.step(step)
    record.finish(workload, run_name, spec, folder)


class Record:
    """What the benchmark measures of a run, outside the loop's own work: the time since
    step 0 after each step (pauses for the benchmark's own work left out), autotune's
    phase and level, and rank 0's copies of the weights every ``eval_every`` steps."""

    def __init__(self, model, tuner, steps: int, eval_every: int) -> None:
        import torch.distributed as dist

        self.model, self.tuner, self.steps, self.eval_every = model, tuner, steps, eval_every
        self.rank = dist.get_rank()
        self.elapsed: list[float] = []
        self.phases: list[str] = []
        self.levels: list[int] = []
        self.snapshots: dict[int, dict] = {}
        self._copy(0)
        dist.barrier()  # every rank starts step 0 together
        self.began = time.perf_counter()
        self.left_out = 0.0
        self.wall = time.time()

    @contextlib.contextmanager
    def paused(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.left_out += time.perf_counter() - started

    def _copy(self, step: int) -> None:
        if self.rank == 0:
            self.snapshots[step] = {name: value.detach().clone()
                                    for name, value in self.model.state_dict().items()}

    def step(self, step: int) -> None:
        self.elapsed.append(time.perf_counter() - self.began - self.left_out)
        if self.tuner is not None:
            self.phases.append(self.tuner.phase)
            self.levels.append(int(self.tuner.level))
        if step % self.eval_every == 0 or step == self.steps:
            with self.paused():
                self._copy(step)

    def finish(self, workload, strategy: str, spec: str, folder: Path) -> None:
        """The slowest rank's times, the tuner closed, then rank 0 evaluates the copies
        and writes the run's record."""
        import torch
        import torch.distributed as dist

        elapsed = torch.tensor(self.elapsed, dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        log, stats = [], {}
        if self.tuner is not None:
            log = list(self.tuner.log)
            with contextlib.suppress(Exception):  # figures for the record only
                stats = self.tuner.stats.summary()
            self.tuner.close()
        dist.barrier()
        dist.destroy_process_group()
        if self.rank != 0:
            return
        batches = workload.validation(workload.batch_size, VALIDATION_BATCHES)
        if batches is None:
            raise SystemExit(f"{spec} has no validation data")
        curve = []
        self.model.eval()
        with torch.no_grad():
            for step, weights in sorted(self.snapshots.items()):
                self.model.load_state_dict(weights)
                losses = [float(workload.loss(self.model(*_inputs(x)), y)) for x, y in batches]
                curve.append((step, math.fsum(losses) / len(losses)))
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        (folder / "runs" / f"{strategy}.json").write_text(json.dumps({
            "strategy": strategy, "spec": spec, "steps": self.steps,
            "elapsed_s": elapsed.tolist(), "phases": self.phases, "levels": self.levels,
            "curve": curve, "log": log, "stats": stats,
            "wall_s": time.time() - self.wall}))


def _inputs(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _batch(workload, step: int):
    """Step ``step``'s batch on this rank, the same for every strategy (drawn as
    ``bytecomp bench`` draws it, the strategy's own random state left as it was)."""
    import torch
    import torch.distributed as dist

    state = torch.get_rng_state()
    torch.manual_seed(DATA_SEED * 1_000_003 + dist.get_rank() * 7_919 + step)
    try:
        inputs, target = workload.make_batch(workload.batch_size)
    finally:
        torch.set_rng_state(state)
    return _inputs(inputs), target


def rank_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="one strategy's run, on every rank")
    parser.add_argument("--rank-run", required=True, choices=[key for key, _, _ in STRATEGIES])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--optimizer")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--eval-every", type=int, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    args = parser.parse_args(argv)
    plain_training(args.rank_run, args.spec, args.optimizer, args.steps, args.eval_every,
                   args.folder)


# ---------------------------------------------------------------------------- the driver
def parse_cell(name: str) -> tuple[str, str, str]:
    """(task, layout, bandwidth) of a matrix cell's name."""
    task, layout, bandwidth = name.rsplit("-", 2)
    return task, layout, bandwidth


def default_steps(args) -> int:
    return args.steps if args.steps is not None else SMOKE_STEPS if args.smoke else STEPS


def default_eval_every(args) -> int:
    return args.eval_every if args.eval_every is not None else \
        SMOKE_EVAL_EVERY if args.smoke else EVAL_EVERY


def current_settings(args) -> str:
    return f"{'--smoke ' if args.smoke else ''}--steps {default_steps(args)} " \
           f"--eval-every {default_eval_every(args)}"


def cell_record(folder: Path) -> dict[str, str]:
    """cell.txt's lines as key: value (empty where there is none)."""
    record = folder / "cell.txt"
    if not record.exists():
        return {}
    pairs = (line.split(": ", 1) for line in record.read_text().splitlines() if ": " in line)
    return {key: value for key, value in pairs}


def expected_minutes(name: str, out: Path, args) -> tuple[float, str]:
    """The cell's expected minutes at these settings and where the figure comes from."""
    record = cell_record(out / name)
    if record.get("settings") == current_settings(args) and "minutes" in record:
        return float(record["minutes"]), "its last run"
    if args.smoke:
        return SMOKE_MIN, "an estimate for --smoke"
    base = EXPECTED_MIN.get(name, 15)
    return LAUNCH_MIN + (base - LAUNCH_MIN) * default_steps(args) / STEPS, \
        f"an estimate at --steps {default_steps(args)}"


def task_flags(task: str) -> list[str]:
    """The matrix's profile flags of ``task`` that the training loop takes (its optimizer)."""
    flags = TASKS[task][1]
    if len(flags) not in (0, 2) or (flags and flags[0] != "--optimizer"):
        raise SystemExit(f"{task}: profile flags {flags} are not an --optimizer alone: this "
                         f"benchmark trains only the recipe and its --optimizer")
    return list(flags)


def cell(name: str, out: Path, args) -> Path:
    """Train every strategy of one cell, one run after another on its emulated cluster;
    files in out/<cell>/."""
    task, layout, bandwidth = parse_cell(name)
    steps, eval_every = default_steps(args), default_eval_every(args)
    minutes, source = expected_minutes(name, out, args)
    print(f"{name}: starting, about {minutes:.1f} min ({source}); {load()}", flush=True)
    before, before_text = snapshot(), load()
    started = time.monotonic()
    spec = SMOKE_SPECS[task] if args.smoke else TASKS[task][0]
    flags = task_flags(task)
    folder = (out / name).resolve()
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    for stale in [*(folder / "runs").glob("*.json"), folder / CURVES, folder / "cell.txt",
                  folder / PLAN_OUT, folder / "autotune.log"]:
        stale.unlink(missing_ok=True)
    log = folder / "log.txt"
    log.write_text("")
    emulate = [*BYTECOMP, "emulate", "--nodes", "2", "--ranks-per-node", str(LAYOUTS[layout]),
               "--bandwidth", bandwidth, "--"]
    runs = {}
    for key, strategy, factor in STRATEGIES:
        count = math.ceil(factor * steps)
        print(f"{name}: {strategy}: {count} steps of {spec} on 2 x {LAYOUTS[layout]} ranks "
              f"at {bandwidth}", flush=True)
        began = time.monotonic()
        run([*emulate, sys.executable, str(SCRIPT), "--rank-run", key, "--spec", spec,
             *flags, "--steps", str(count), "--eval-every", str(eval_every),
             "--folder", str(folder)], log)
        runs[strategy] = json.loads((folder / "runs" / f"{key}.json").read_text())
        record = runs[strategy]
        print(f"{name}: {strategy}: {record['elapsed_s'][-1]:.1f} s of training "
              f"({(time.monotonic() - began) / 60:.1f} min with start-up), final validation "
              f"loss {record['curve'][-1][1]:.4f}", flush=True)
        for line in record["log"]:
            print(f"{name}:   autotune: {line}", flush=True)
    write_curves(runs, folder)
    (folder / "autotune.log").write_text("".join(f"{line}\n" for line in runs[AUTOTUNE]["log"]))
    minutes = (time.monotonic() - started) / 60
    after = snapshot()
    (folder / "cell.txt").write_text(
        f"cell: {name}\ncommand: python benchmarks/autotune.py --cell {name} "
        f"{current_settings(args)}\nsettings: {current_settings(args)}\n"
        f"model: {spec}{' ' + ' '.join(flags) if flags else ''}\n"
        f"strategies: " + ", ".join(f"{strategy} {math.ceil(factor * steps)} steps"
                                    for _, strategy, factor in STRATEGIES) + "\n"
        f"autotune: bytecomp.autotune(ddp, plan_out={PLAN_OUT!r}), its other settings at "
        f"their defaults\nminutes: {minutes:.1f}\nbefore: {before_text}\nafter: {load()}\n"
        f"steal: {after['steal_s'] - before['steal_s']:.1f} s during the cell\n"
        f"load1: {before['load1']:.2f} before, {after['load1']:.2f} after\n")
    print(f"{name}: done in {minutes:.1f} min", flush=True)
    return folder


def write_curves(runs: dict[str, dict], folder: Path) -> None:
    """One row per strategy and step: the time since step 0, the step's duration, the
    validation loss where evaluated, autotune's phase and level."""
    rows = []
    for strategy, record in runs.items():
        elapsed = [0.0, *record["elapsed_s"]]
        losses = dict((int(step), loss) for step, loss in record["curve"])
        phases, levels = record["phases"], record["levels"]
        for step, seconds in enumerate(elapsed):
            rows.append({"strategy": strategy, "step": step, "elapsed_s": seconds,
                         "step_ms": 1000 * (seconds - elapsed[step - 1]) if step else math.nan,
                         "phase": phases[step - 1] if step and phases else "",
                         "level": levels[step - 1] if step and levels else math.nan,
                         "validation_loss": losses.get(step, math.nan)})
    pd.DataFrame(rows).to_csv(folder / CURVES, index=False)


# ------------------------------------------------------------------------------ summary
def strategies_of(folder: Path) -> dict[str, pd.DataFrame]:
    table = pd.read_csv(folder / CURVES, keep_default_na=False, na_values=["", "nan", "NaN"])
    return {name: group.sort_values("step").reset_index(drop=True)
            for name, group in table.groupby("strategy", sort=False)}


def _curve(group: pd.DataFrame) -> list[tuple[int, float]]:
    rated = group.dropna(subset=["validation_loss"])
    return [(int(s), float(loss)) for s, loss in zip(rated.step, rated.validation_loss)]


def _step_ms(group: pd.DataFrame) -> list[float]:
    return [float(ms) for ms in group[group.step >= 1].step_ms]


def cell_facts(folder: Path) -> dict:
    """One cell's figures: every strategy's time to fp32's final loss, the noise floor,
    the measuring phase against fp32 DDP, autotune's phases and the cell's record."""
    runs = strategies_of(folder)
    if FP32 not in runs:
        raise SystemExit(f"{folder}/{CURVES} has no {FP32} run")
    fp32 = _curve(runs[FP32])
    steps, target = fp32[-1]
    rows = []
    for name in [s for _, s, _ in STRATEGIES if s in runs]:
        group, curve = runs[name], _curve(runs[name])
        times = _step_ms(group)
        reached = steps_to(curve, target)
        rows.append({"cell": folder.name, "strategy": name, "steps": len(times),
                     "median_step_ms": statistics.median(times) if times else math.nan,
                     "steps_to_target": math.nan if reached is None else reached,
                     "time_to_target_s": math.nan if reached is None else
                     time_at(times, reached), "final_loss": curve[-1][1]})
    table = pd.DataFrame(rows).set_index("strategy", drop=False)
    seconds = table.time_to_target_s
    facts: dict = {"table": table, "steps": steps, "target": target,
                   "record": cell_record(folder), "name": folder.name}
    first, again = seconds.get(FP32, math.nan), seconds.get(AGAIN, math.nan)
    facts["fp32_runs"] = (first, again)
    facts["time_floor"] = abs(first - again) / min(first, again) \
        if min(first, again) > 0 else math.nan
    if AUTOTUNE in runs:
        facts.update(_autotune_facts(runs, folder))
    return facts


def _autotune_facts(runs: dict[str, pd.DataFrame], folder: Path) -> dict:
    auto = runs[AUTOTUNE]
    trained = auto[auto.step >= 1]
    spans, phase_list = [], list(trained.phase)
    for step, phase in zip(trained.step, phase_list):
        if spans and spans[-1][0] == phase:
            spans[-1][2] = int(step)
        else:
            spans.append([phase, int(step), int(step)])
    phase = set(trained[trained.phase == "measure"].step)
    # compared on the steps fp32 DDP ran too (it runs N, autotune 1.5N)
    measured = phase & set(runs[FP32].step) if FP32 in runs else phase
    facts: dict = {"phases": spans, "phase_ms": {
        phase: float(group.step_ms.median())
        for phase, group in trained.groupby("phase", sort=False)},
                   "log": (folder / "autotune.log").read_text().splitlines()
                   if (folder / "autotune.log").exists() else []}

    def median_on(name: str) -> float:
        group = runs.get(name)
        if group is None:
            return math.nan
        values = list(group[group.step.isin(measured)].step_ms.dropna())
        return statistics.median(values) if values else math.nan

    facts["measuring"] = {"steps": (min(measured), max(measured)) if measured else None,
                          "phase": (min(phase), max(phase)) if phase else None, "autotune_ms": median_on(AUTOTUNE),
                          "fp32_ms": median_on(FP32), "again_ms": median_on(AGAIN)}
    return facts


def evaluate(facts_of: list[dict], missing: list[str]) -> tuple[list[str], list[str]]:
    """Each cell's lines, then the targets over the cells present."""
    lines, within, ahead, measuring = [], [], [], []
    for facts in facts_of:
        table, name, record = facts["table"], facts["name"], facts["record"]
        lines.append(f"- **{name}**: target {facts['target']:.4f} (fp32 DDP's validation loss "
                     f"at step {facts['steps']}); " +
                     (f"{record.get('minutes', '?')} min, {record.get('settings', '?')}; "
                      f"before: {record.get('before', '?')}; after: {record.get('after', '?')}; "
                      f"steal {record.get('steal', '?')}" if record else "no cell.txt"))
        first, again = facts["fp32_runs"]
        floor = facts["time_floor"]
        lines.append(f"  - time's noise floor: fp32 DDP run twice, {first:.3g} s and "
                     f"{again:.3g} s to the target: {100 * floor:.1f}% apart" if floor == floor
                     else "  - time's noise floor: unknown (fp32 DDP's second run is missing "
                     "or did not reach the target)")
        if AUTOTUNE not in table.index:
            lines.append("  - no autotune run in this cell")
            continue
        lines.append("  - autotune's phases (steps): " + ", ".join(
            f"{phase or '?'} {a}-{b}" for phase, a, b in facts["phases"]))
        lines += [f"    - {line}" for line in facts["log"]]
        lines.append("  - autotune's median step by phase: " + ", ".join(
            f"{phase} {ms:.2f} ms" for phase, ms in facts["phase_ms"].items())
            + f" (fp32 DDP's median step {table.median_step_ms[FP32]:.2f} ms)")
        seconds = table.time_to_target_s[AUTOTUNE]
        baselines = {b: table.time_to_target_s[b] for b in BASELINES if b in table.index
                     and table.time_to_target_s[b] == table.time_to_target_s[b]}
        if seconds != seconds:
            lines.append(f"  - autotune did not reach fp32's final loss in "
                         f"{table.steps[AUTOTUNE]} steps (final "
                         f"{table.final_loss[AUTOTUNE]:.4f}): MISSED")
            within.append(False)
        elif baselines:
            best = min(baselines, key=lambda b: baselines[b])
            ratio = seconds / baselines[best]
            tie = floor == floor and abs(ratio - 1) <= floor
            met = tie or ratio <= WITHIN
            within.append(met)
            ahead.append(ratio <= 1 / AHEAD and not tie)
            verdict = "a tie: inside the noise floor, met" if tie else \
                "met" if met else "MISSED"
            lines.append(f"  - autotune reached it in {seconds:.3g} s (step "
                         f"{table.steps_to_target[AUTOTUNE]:.0f}); best baseline {best} "
                         f"{baselines[best]:.3g} s: {ratio:.2f}x ({verdict}; target <= "
                         f"{WITHIN:.2f}x{'; 10% ahead' if ahead[-1] else ''})")
        measure = facts["measuring"]
        if measure["steps"] is None:
            lines.append("  - no step of autotune's run was in the measuring phase (within "
                         "fp32 DDP's steps)")
        else:
            ratio = measure["autotune_ms"] / measure["fp32_ms"]
            noise = abs(measure["again_ms"] / measure["fp32_ms"] - 1)
            measuring.append(ratio <= MEASURING)
            shown = "" if measure["steps"] == measure["phase"] else \
                f" (of its {measure['phase'][0]}-{measure['phase'][1]}: those fp32 DDP ran)"
            lines.append(f"  - measuring phase, steps {measure['steps'][0]}-"
                         f"{measure['steps'][1]}{shown}: median step {measure['autotune_ms']:.2f} ms "
                         f"against fp32 DDP's {measure['fp32_ms']:.2f} ms on the same steps: "
                         f"{100 * (ratio - 1):+.1f}% ({'met' if measuring[-1] else 'MISSED'}; "
                         f"target <= +{100 * (MEASURING - 1):.0f}%"
                         + (f"; fp32 DDP's two runs {100 * noise:.1f}% apart there)"
                            if noise == noise else ")"))
    cells = len(facts_of)
    where = " (on the cells present)" if missing else ""
    targets = [
        f"- autotune at most {WITHIN:.2f}x the best of fp32 DDP, the fp16 hook and the "
        f"PowerSGD hook in every cell: {sum(within)} of {cells} "
        f"({'met' if within and all(within) and len(within) == cells else 'MISSED'})" + where,
        f"- at least {100 * (AHEAD - 1):.0f}% ahead of the best baseline, outside the noise "
        f"floor, in at least {AHEAD_CELLS} cells: {sum(ahead)} of {cells} ("
        + ("met" if sum(ahead) >= AHEAD_CELLS else
           "not yet: too few on the cells present" if missing else "MISSED") + ")" + where,
        f"- a measuring-phase step at most {100 * (MEASURING - 1):.0f}% slower than fp32 "
        f"DDP's (median): {sum(measuring)} of {cells} "
        f"({'met' if measuring and all(measuring) and len(measuring) == cells else 'MISSED'})"
        + where]
    return lines, targets


def markdown(table: pd.DataFrame) -> list[str]:
    """The strategies as a markdown table (nan: did not reach fp32's final loss)."""
    def text(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(text(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    return lines


def summarize(out: Path, args, argv: list[str]) -> str:
    """summary.md (and results.csv) from the cells under ``out``; the missing default
    cells named, the targets evaluated on what is present."""
    folders = sorted(p for p in out.iterdir() if (p / CURVES).exists()) if out.is_dir() else []
    if not folders:
        raise SystemExit(f"no cell under {out} has been run (python benchmarks/autotune.py "
                         f"--cell NAME; --list shows them)")
    present = {f.name for f in folders}
    missing = [name for name in DEFAULT_CELLS if name not in present]
    others = [f.name for f in folders if f.name not in DEFAULT_CELLS]
    facts_of = [cell_facts(folder) for folder in folders]
    table = pd.concat([f["table"] for f in facts_of], ignore_index=True)
    table.to_csv(out / "results.csv", index=False)
    settings = sorted({cell_record(f).get("settings", "unknown") for f in folders})
    cell_lines, targets = evaluate(facts_of, missing)
    text = ["# bytecomp.autotune from step 0: time to fp32 DDP's final validation loss", "",
            f"`python benchmarks/autotune.py {' '.join(argv)}` "
            f"({time.strftime('%Y-%m-%d %H:%M')}; cells: {', '.join(sorted(present))})", "",
            f"Cells: {len(present & set(DEFAULT_CELLS))} of {len(DEFAULT_CELLS)} present"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; also present: {', '.join(others)}" if others else "")
            + f"; run at {' and '.join(f'`{s}`' for s in settings)}"
            + (" (cells at different settings: not comparable)" if len(settings) > 1 else "")
            + ". Each cell runs alone: `sudo python benchmarks/autotune.py --cell NAME`; "
              "`--list` shows them.", "",
            *markdown(table[["cell", "strategy", "steps", "median_step_ms", "steps_to_target",
                             "time_to_target_s", "final_loss"]]), "",
            "## Cells", "", *cell_lines, "", "## Targets", "",
            *([] if not missing else
              [f"Evaluated on the {len(folders)} cells present; the targets hold only once "
               f"every cell is measured ({len(missing)} missing: {', '.join(missing)}).", ""]),
            *targets, ""]
    (out / "summary.md").write_text("\n".join(text))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--rank-run" in argv:
        rank_main(argv)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/autotune"))
    parser.add_argument("--cell", action="append", choices=all_cells(),
                        help=f"run this cell (repeatable; default: {', '.join(DEFAULT_CELLS)})")
    parser.add_argument("--steps", type=int,
                        help=f"fp32 DDP's steps to its final loss, N (default {STEPS}, "
                             f"--smoke {SMOKE_STEPS}); the others train {LONGER}N")
    parser.add_argument("--eval-every", type=int,
                        help=f"steps between validation points (default {EVAL_EVERY}, "
                             f"--smoke {SMOKE_EVAL_EVERY})")
    parser.add_argument("--smoke", action="store_true",
                        help="the matrix's tiny models, few steps: the driver end to end")
    parser.add_argument("--summarize", action="store_true",
                        help="only rebuild summary.md from the cells under --out")
    parser.add_argument("--list", action="store_true",
                        help="list the cells, which exist under --out, their expected time")
    args = parser.parse_args(argv)
    if args.list:
        for name in [*DEFAULT_CELLS, *(c for c in all_cells() if c not in DEFAULT_CELLS)]:
            minutes, source = expected_minutes(name, args.out, args)
            record = cell_record(args.out / name)
            state = "missing" if not (args.out / name / CURVES).exists() else \
                "done" if record.get("settings") == current_settings(args) else "stale"
            print(f"{name:28} {'default' if name in DEFAULT_CELLS else 'extra':8} {state:8} "
                  f"about {minutes:.1f} min ({source})")
        return
    if default_steps(args) < 1 or default_eval_every(args) < 1:
        raise SystemExit("--steps and --eval-every must be at least 1")
    if not args.summarize:
        if os.geteuid() != 0:
            raise SystemExit("needs root: bytecomp emulate makes network namespaces "
                             "(sudo python benchmarks/autotune.py ...)")
        # the user factory of charlstm-sgd is importable in every rank
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(SCRIPT.parent), os.environ.get("PYTHONPATH")]))
        chosen = args.cell or DEFAULT_CELLS
        expected = [expected_minutes(name, args.out, args) for name in chosen]
        print(f"{len(chosen)} cell(s): " + ", ".join(
            f"{name} about {minutes:.1f} min ({source})"
            for name, (minutes, source) in zip(chosen, expected))
            + f"; about {sum(m for m, _ in expected):.0f} min in all. Shorter: --steps N "
              f"(now {default_steps(args)}; a cell's time is about in proportion), --smoke "
              f"(tiny models, about {SMOKE_MIN:.0f} min a cell), --cell NAME (one cell)",
            flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        for name in chosen:
            cell(name, args.out, args)
    print(summarize(args.out, args, argv))


if __name__ == "__main__":
    main()
