"""What bytecomp itself costs, from profile to plan, and what it buys.

For each link (2 nodes x 1 rank emulated by ``bytecomp emulate``, 100 Mbit/s and
1 Gbit/s; needs root), with a fresh per-user cache of cluster tables
(``BYTECOMP_CACHE_DIR`` in the link's folder), every command the one a user would type:

1. ``bytecomp profile`` of the first task with its defaults (``--budget`` 240): it
   measures the cluster and keeps its tables in the cache. Wall-clock time, each stage
   (profile.yaml's ``stages_s``), the probe's share of the time and its steps;
2. ``bytecomp profile`` of every other task with its defaults: the cluster's tables
   come from the cache;
3. for each task, a full-sweep reference: ``bytecomp profile --no-cache --budget
   REFERENCE_BUDGET_S``, whose sweeps' shares of the larger budget reach the sizes and
   rounds of a sweep that is not held to 240 s;
4. ``bytecomp plan`` of both profiles of each task (defaults);
5. ``bytecomp bench --train-steps N`` of both plans against fp32 DDP and PyTorch's hooks
   under the emulation: each plan's time to fp32 DDP's final validation loss and its
   predicted-vs-measured step error.

Targets (issue 61): the default profile within ``--budget`` + 20% + one probe step;
the probe at least 40% of the profile's time and at least 30 steps; a profile with the
cache at most 40% of the first's time; the plan from the default profile as good as
the reference's in time to fp32's final loss (within 5%), its step error no worse
(within 2 points). Results in ``OUT/summary.md`` and ``OUT/pipeline_cost.csv``, with
the load and steal of the machine around each command (a busy machine's numbers say
so). Needs a quiet machine.

    sudo python benchmarks/pipeline_cost.py --out benchmarks/results/pipeline_cost
    sudo python benchmarks/pipeline_cost.py --bandwidth 100mbit --task charlstm
    sudo python benchmarks/pipeline_cost.py --profiles-only --bandwidth 100mbit \
        --out benchmarks/results/pipeline_cost-profiles-100mbit  # steps 1-2 alone
    python benchmarks/pipeline_cost.py --dry-run      # the commands, none run

Each link is its own piece (``--bandwidth``, its own ``--out``), so the whole
measurement (about an hour a link: the references' 1,200 s profiles dominate) runs in
pieces; ``--profiles-only`` measures steps 1 and 2 (the budget, the probe's share, the
cache) in minutes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from convergence import BYTECOMP, run  # noqa: E402
from machine_load import snapshot  # noqa: E402

TASKS = {  # name: model spec (a factory is named to plan and bench: bytecomp.model_spec)
    "charlstm": "bench_factories:charlstm",  # 1.18M parameters in 11 tensors
    "transformer": "transformer:layers=3,width=192,heads=4,seq_len=64,vocab=256",  # 1.45M
}
BANDWIDTHS = ("100mbit", "1gbit")
BUDGET_S, OVER, PROBE_SHARE, PROBE_STEPS, CACHED_SHARE = 240.0, 1.2, 0.4, 30, 0.4
REFERENCE_BUDGET_S = 1200.0
SAME_TIME, SAME_ERROR = 1.05, 0.02


class Runner:
    """Runs (or, dry, prints) each command, with its wall-clock seconds and the load."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry

    def timed(self, command: list[str], log: Path, env: dict[str, str]) -> dict:
        if self.dry:
            print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(command))
            return {"seconds": float("nan")}
        os.environ.update(env)
        before = snapshot()
        started = time.monotonic()
        run(command, log)
        seconds = time.monotonic() - started
        after = snapshot()
        cores = os.cpu_count() or 1
        steal = 100 * (after["steal_s"] - before["steal_s"]) / max(seconds * cores, 1e-9)
        return {"seconds": round(seconds, 1), "load_before": before["load1"],
                "load_after": after["load1"], "steal_percent": round(steal, 1)}


def profile_facts(profile: Path) -> dict:
    """The stages, the probe's seconds and steps, one probe step's seconds and where the
    cluster's tables came from."""
    meta = yaml.safe_load((profile / "profile.yaml").read_text())
    probe = meta.get("probe") or {}
    strategies = len(meta.get("compressor_specs") or []) + 1
    step_s = meta["times"]["iteration"]["median_ms"] / 1000 * strategies
    sources = set((meta.get("calibration") or {}).get("tables", {}).values())
    return {**{f"stage {k}": v for k, v in (meta.get("stages_s") or {}).items()},
            "probe_s": probe.get("seconds"), "probe_steps": probe.get("ran_steps"),
            "probe_settled": probe.get("settled"), "probe_step_s": round(step_s, 3),
            "tables": "cache" if (meta.get("calibration") or {}).get("cache") else
            "/".join(sorted(sources)) or "measured"}


def bench_facts(bench: Path) -> dict[str, dict]:
    """Per plan (``bytecomp plan`` and ``bytecomp plan: <stem>``): time to fp32's final
    loss and the predicted-vs-measured step error."""
    times = pd.read_csv(bench / "convergence.csv").set_index("strategy")
    steps = pd.read_csv(bench / "bench.csv").set_index("strategy")
    return {name: {"time_to_fp32_final_s": times.time_to_target_s.get(name),
                   "step_error": steps.error.get(name)}
            for name in steps.index if name.startswith("bytecomp plan")}


def link(bandwidth: str, out: Path, args, runner: Runner) -> list[dict]:
    folder = out / f"2x1-{bandwidth}"
    if folder.exists() and not runner.dry:
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "log.txt"
    env = {"BYTECOMP_CACHE_DIR": str(folder / "cache")}
    emulate = [*BYTECOMP, "emulate", "--nodes", "2", "--bandwidth", bandwidth, "--"]
    machine = ["--machine", f"emulated 2x1 at {bandwidth} on this project's CI machine"]
    rows = []
    for order, name in enumerate(args.task or list(TASKS)):
        model = ["--model", TASKS[name]]
        profiles = {"default": folder / f"{name}-profile",
                    "reference": folder / f"{name}-profile-reference"}
        command = "profile" if order == 0 else "profile (cache)"
        cost = runner.timed([*emulate, *BYTECOMP, "profile", *model, "--out",
                             str(profiles["default"]), *machine], log, env)
        rows.append({"link": bandwidth, "task": name, "command": command, **cost,
                     **({} if runner.dry else profile_facts(profiles["default"]))})
        if args.profiles_only:  # the budget, the probe's share and the cache alone
            print(f"{folder.name} {name}: profiled", flush=True)
            continue
        cost = runner.timed([*emulate, *BYTECOMP, "profile", *model, "--out",
                             str(profiles["reference"]), "--no-cache", "--budget",
                             f"{REFERENCE_BUDGET_S:g}", *machine], log, env)
        rows.append({"link": bandwidth, "task": name, "command": "profile (reference)",
                     **cost, **({} if runner.dry else profile_facts(profiles["reference"]))})
        plans = {kind: folder / f"{name}-plan-{kind}.yaml" for kind in profiles}
        for kind, profile in profiles.items():
            cost = runner.timed([*BYTECOMP, "plan", str(profile), "--out", str(plans[kind]),
                                 *model], log, env)
            rows.append({"link": bandwidth, "task": name, "command": f"plan ({kind})", **cost})
        bench = folder / f"{name}-bench"
        runner.timed([*emulate, *BYTECOMP, "bench", str(profiles["default"]), *model,
                      *[flag for path in plans.values() for flag in ("--plan", str(path))],
                      "--out", str(bench), "--force", "--iterations", "6", "--no-every",
                      "--train-steps", str(args.train_steps), "--target-fraction", "1",
                      "--eval-every", str(args.eval_every)], log, env)
        if not runner.dry:
            facts = bench_facts(bench)
            names = {"default": "bytecomp plan",
                     "reference": f"bytecomp plan: {plans['reference'].stem}"}
            for row in rows[-2:]:
                kind = row["command"][len("plan ("):-1]
                row.update(facts.get(names[kind], {}))
        print(f"{folder.name} {name}: done", flush=True)
    return rows


def markdown(table: pd.DataFrame) -> list[str]:
    def text(value) -> str:
        return "" if value is None or value != value else \
            f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return lines + ["| " + " | ".join(text(v) for v in row) + " |"
                    for row in table.itertuples(index=False)]


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def verdicts(table: pd.DataFrame) -> list[str]:
    """The issue's targets, one line each."""
    lines = []
    first = None
    for (bandwidth, name), rows in table.groupby(["link", "task"], sort=False):
        rows = rows.set_index("command")
        default = "profile" if "profile" in rows.index else "profile (cache)"
        seconds = rows.seconds[default]
        limit = BUDGET_S * OVER + rows.probe_step_s[default]
        lines.append(f"- {bandwidth} {name}: `{default}` {seconds:.0f} s (target <= "
                     f"{limit:.0f} s: {_met(seconds <= limit)})")
        share = rows.probe_s[default] / seconds
        steps = rows.probe_steps[default]
        lines.append(f"- {bandwidth} {name}: probe {100 * share:.0f}% of the profile, "
                     f"{steps:.0f} steps (targets >= {100 * PROBE_SHARE:.0f}%, >= "
                     f"{PROBE_STEPS}: {_met(share >= PROBE_SHARE and steps >= PROBE_STEPS)})")
        if default == "profile":
            first = seconds
        elif first is not None:
            lines.append(f"- {bandwidth} {name}: with the cache {seconds:.0f} s, "
                         f"{100 * seconds / first:.0f}% of the first profile's (target <= "
                         f"{100 * CACHED_SHARE:.0f}%: {_met(seconds <= CACHED_SHARE * first)})")
        if "time_to_fp32_final_s" in rows and {"plan (default)", "plan (reference)"} <= \
                set(rows.index):
            new, ref = (rows.time_to_fp32_final_s[f"plan ({k})"] for k in ("default",
                                                                             "reference"))
            err_new, err_ref = (abs(rows.step_error[f"plan ({k})"]) for k in ("default",
                                                                               "reference"))
            lines.append(f"- {bandwidth} {name}: time to fp32's final loss {new:.1f} s, the "
                         f"reference's plan {ref:.1f} s; step error {100 * err_new:.1f}%, "
                         f"the reference's {100 * err_ref:.1f}% "
                         f"({_met(new <= SAME_TIME * ref and err_new <= err_ref + SAME_ERROR)})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pipeline_cost"))
    parser.add_argument("--task", action="append", choices=sorted(TASKS),
                        help="a task to run (repeatable; default: all, the first "
                             "profiled without the cache)")
    parser.add_argument("--bandwidth", action="append", choices=BANDWIDTHS,
                        help="a link to emulate (repeatable; default: both)")
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--profiles-only", action="store_true",
                        help="only the default profiles (the first task's without the "
                             "cache, the others' with it): the budget, probe and cache "
                             "targets, minutes instead of an hour a link")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands, run none (no root needed)")
    parser.add_argument("--summarize", action="store_true",
                        help="only summarize OUT/pipeline_cost.csv again")
    args = parser.parse_args()
    if args.summarize:
        return write_summary(pd.read_csv(args.out / "pipeline_cost.csv"), args)
    runner = Runner(args.dry_run)
    if os.geteuid() != 0 and not args.dry_run:
        raise SystemExit("needs root: bytecomp emulate makes network namespaces")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
    out = args.out if not args.dry_run else Path(os.environ.get("TMPDIR", "/tmp")) / "dry"
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for bandwidth in (args.bandwidth or list(BANDWIDTHS))
            for row in link(bandwidth, out, args, runner)]
    if not args.dry_run:
        write_summary(pd.DataFrame(rows), args)


def write_summary(table: pd.DataFrame, args) -> None:
    table.to_csv(args.out / "pipeline_cost.csv", index=False)
    lines = ["# bytecomp's own cost, profile to plan", "",
             f"`python benchmarks/pipeline_cost.py {' '.join(sys.argv[1:])}`", "",
             *markdown(table), "", *verdicts(table)]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
