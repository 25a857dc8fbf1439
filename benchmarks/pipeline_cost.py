"""What bytecomp itself costs, from profile to plan, and what it buys.

For each task, on 2 nodes x 1 rank emulated at 100 Mbit/s (``bytecomp emulate``; needs
root), every command the one a user would type:

1. ``bytecomp profile`` with its defaults (the convergence probe takes what is left of
   ``--budget``, 240 s): wall-clock time, and the share of each stage (profile.yaml's
   ``stages_s``);
2. ``bytecomp profile --calibration DIR`` (the first profile's cluster tables reused):
   wall-clock time and its stages;
3. ``bytecomp plan`` with its defaults (the finalists train for at most
   ``--verify-budget``, 180 s): wall-clock time, the search's and the verification's
   shares, what the verification bought;
4. ``bytecomp plan --verify-steps N`` on the same profile, N the step count the earlier
   default chose (what 180 s afforded at the profile's iteration time for the finalists
   trained, from 50 to 200), to compare the choice with the earlier costs;
5. (``--accuracy``) ``bytecomp bench --train-steps N`` of both plans against fp32 DDP
   and PyTorch's hooks under the emulation: the default plan's time to fp32 DDP's final
   validation loss, and the other's (the choice is the same, or better in time to
   accuracy).

Targets: default profile at most 5 min, at most 2 min with calibration reuse; default
plan at most its budget + 20%. Results in ``OUT/summary.md`` with the load and steal of
the machine before and after each command (a busy machine's numbers say so).

    sudo python benchmarks/pipeline_cost.py --out benchmarks/results/pipeline_cost
    sudo python benchmarks/pipeline_cost.py --task charlstm --accuracy
"""

from __future__ import annotations

import argparse
import os
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
    "charlstm": "bench_factories:charlstm",
    "transformer": "transformer",
}
BANDWIDTH = "100mbit"
PROFILE_TARGET_S, CALIBRATED_TARGET_S, PLAN_OVER = 300.0, 120.0, 1.2
DEFAULT_VERIFY_BUDGET_S = 180.0


def timed(command: list[str], log: Path) -> dict:
    """Run ``command``; its wall-clock seconds and the machine's load around it."""
    before = snapshot()
    started = time.monotonic()
    run(command, log)
    seconds = time.monotonic() - started
    after = snapshot()
    steal = 100 * (after["steal_s"] - before["steal_s"]) / max(seconds * (os.cpu_count() or 1),
                                                                1e-9)
    return {"seconds": round(seconds, 1), "load_before": before["load1"],
            "load_after": after["load1"], "steal_percent": round(steal, 1)}


def stages(profile: Path) -> dict:
    meta = yaml.safe_load((profile / "profile.yaml").read_text())
    return {**meta.get("stages_s", {}), "probe steps": (meta.get("probe") or {}).get("ran_steps")}


def plan_facts(plan: Path) -> dict:
    data = yaml.safe_load(plan.read_text())  # a plan file's info fields are at its top
    verification = data.get("verification") or {}
    chosen = next((f["name"] for f in data.get("finalists", []) if f.get("chosen")), None)
    return {"chosen": chosen, "verification_s": verification.get("seconds"),
            "verification_steps": verification.get("steps")}


EARLIER = "plan --verify-steps (the earlier default)"


def earlier_steps(profile: Path, plan: Path) -> int:
    """The steps the earlier default trained: 180 s at the profile's iteration time per
    finalist trained (here those the default plan trained, with fp32 DDP), from 50 to
    200."""
    meta = yaml.safe_load((profile / "profile.yaml").read_text())
    step_s = meta["times"]["iteration"]["median_ms"] / 1000
    evidence = plan.with_name(plan.stem + ".finalists.csv")
    table = pd.read_csv(evidence) if evidence.exists() else None
    trained = int((table.factor_from.isin(["trained", "fp32"])).sum()) if table is not None \
        else 1
    return max(50, min(200, int(DEFAULT_VERIFY_BUDGET_S / max(1e-6, step_s * trained))))


def task(name: str, out: Path, args) -> list[dict]:
    spec = TASKS[name]
    folder = out / f"{name}-2x1-{BANDWIDTH}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    log = folder / "log.txt"
    emulate = [*BYTECOMP, "emulate", "--nodes", "2", "--bandwidth", BANDWIDTH, "--"]
    model = ["--model", spec]
    rows = []
    first, second = folder / "profile", folder / "profile-calibrated"
    machine = f"emulated 2x1 at {BANDWIDTH} on this project's CI machine"
    cost = timed([*emulate, *BYTECOMP, "profile", *model, "--out", str(first),
                  "--machine", machine], log)
    rows.append({"task": name, "command": "profile", **cost, **stages(first)})
    cost = timed([*emulate, *BYTECOMP, "profile", *model, "--out", str(second),
                  "--calibration", str(first), "--machine", machine], log)
    rows.append({"task": name, "command": "profile --calibration", **cost, **stages(second)})
    plans = {"default": folder / "plan.yaml", "steps": folder / "plan-earlier.yaml"}
    cost = timed([*BYTECOMP, "plan", str(first), "--out", str(plans["default"]), *model], log)
    rows.append({"task": name, "command": "plan", **cost, **plan_facts(plans["default"])})
    steps = earlier_steps(first, plans["default"])
    cost = timed([*BYTECOMP, "plan", str(first), "--out", str(plans["steps"]), *model,
                  "--verify-steps", str(steps)], log)
    rows.append({"task": name, "command": EARLIER, **cost, **plan_facts(plans["steps"]),
                 "verify_steps": steps})
    if args.accuracy:
        run([*emulate, *BYTECOMP, "bench", str(first), *model,
             *[flag for path in plans.values() for flag in ("--plan", str(path))],
             "--out", str(folder / "bench"), "--force", "--iterations", "6", "--no-every",
             "--train-steps", str(args.train_steps), "--target-fraction", "1",
             "--eval-every", str(args.eval_every)], log)
        table = pd.read_csv(folder / "bench" / "convergence.csv").set_index("strategy")
        for row in rows:
            if row["command"].startswith("plan"):
                key = "bytecomp plan" if row["command"] == "plan" else \
                    f"bytecomp plan: {plans['steps'].stem}"
                if key in table.index:
                    row["time_to_fp32_final_s"] = table.time_to_target_s[key]
        best = table.drop(index=[i for i in table.index if i.startswith("bytecomp")])
        rows.append({"task": name, "command": "best hand-picked baseline",
                     "chosen": best.time_to_target_s.idxmin(),
                     "time_to_fp32_final_s": best.time_to_target_s.min()})
    print(f"{folder.name}: done", flush=True)
    return rows


def markdown(table: pd.DataFrame) -> list[str]:
    def text(value) -> str:
        return "" if value is None or value != value else \
            f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return lines + ["| " + " | ".join(text(v) for v in row) + " |"
                    for row in table.itertuples(index=False)]


def verdicts(table: pd.DataFrame) -> list[str]:
    lines = []
    for name, rows in table.groupby("task", sort=False):
        rows = rows.set_index("command")
        checks = [("profile", PROFILE_TARGET_S), ("profile --calibration", CALIBRATED_TARGET_S),
                  ("plan", DEFAULT_VERIFY_BUDGET_S * PLAN_OVER)]
        for command, limit in checks:
            seconds = rows.seconds[command]
            lines.append(f"- {name}: `{command}` {seconds:.0f} s (target <= {limit:.0f} s: "
                         f"{'met' if seconds <= limit else 'MISSED'})")
        same = rows.chosen["plan"] == rows.chosen[EARLIER]
        lines.append(f"- {name}: the default plan chose {rows.chosen['plan']!r}; the earlier "
                     f"default (--verify-steps {rows.verify_steps[EARLIER]:.0f}) "
                     f"{rows.chosen[EARLIER]!r} "
                     f"({'the same' if same else 'different: compare time to accuracy'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pipeline_cost"))
    parser.add_argument("--task", action="append", choices=sorted(TASKS),
                        help="a task to run (repeatable; default: all)")
    parser.add_argument("--accuracy", action="store_true",
                        help="also train both plans and the baselines to fp32's final loss")
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--summarize", action="store_true",
                        help="only summarize OUT/pipeline_cost.csv again (plans re-read)")
    args = parser.parse_args()
    if args.summarize:
        table = pd.read_csv(args.out / "pipeline_cost.csv").astype(object)
        for index, row in table.iterrows():
            if str(row.command).startswith("plan"):
                name = "plan.yaml" if row.command == "plan" else "plan-earlier.yaml"
                facts = plan_facts(args.out / f"{row.task}-2x1-{BANDWIDTH}" / name)
                for key, value in facts.items():
                    table.loc[index, key] = value
        return write_summary(table, args)
    if os.geteuid() != 0:
        raise SystemExit("needs root: bytecomp emulate makes network namespaces")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for name in (args.task or list(TASKS)) for row in task(name, args.out, args)]
    write_summary(pd.DataFrame(rows), args)


def write_summary(table: pd.DataFrame, args) -> None:
    table = table.drop(columns=[c for c in ("search_ms",) if c in table.columns])
    table.to_csv(args.out / "pipeline_cost.csv", index=False)
    lines = ["# bytecomp's own cost, profile to plan", "",
             f"`python benchmarks/pipeline_cost.py {' '.join(sys.argv[1:])}`", "",
             *markdown(table), "", *verdicts(table)]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
