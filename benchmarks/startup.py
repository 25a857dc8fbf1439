"""How long ``bytecomp plan`` takes on the shipped transformer profile against how long
``python -c "import torch"`` takes, side by side: whole processes, timed from start to
exit, interleaved (every other round in reverse order) so that noise hits both alike,
after one untimed run of each. Target: the plan within 1.5x of the import.

The plan runs with ``--no-verify``: by default ``bytecomp plan`` also trains its
finalists on spawned ranks (minutes of training, which needs torch), while this
measures what planning itself costs: start-up, loading the profile, fitting, the search
and writing the plan. It runs the environment's own ``bytecomp`` script (beside
``sys.executable``; ``python -m bytecomp`` where there is none) and prints the medians,
their ratio, the median of the rounds' ratios, every time, and the load before and after.

    python benchmarks/startup.py [--runs 7] [--cluster gbe1] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import load

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "transformer"
TARGET = 1.5  # the plan's time at most this many times the import's


def bytecomp_command() -> list[str]:
    """The environment's ``bytecomp`` console script, else ``python -m bytecomp``."""
    script = Path(sys.executable).with_name("bytecomp")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bytecomp"]


def timed(command: list[str]) -> float:
    """Seconds from start to exit of ``command`` (which must succeed)."""
    start = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"startup.py: {' '.join(command)} failed "
                         f"({result.returncode}):\n{result.stderr}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each command")
    parser.add_argument("--cluster", default="gbe1")
    parser.add_argument("--markdown", help="also write the table as markdown here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory() as scratch:
        plan = [*bytecomp_command(), "plan", str(PROFILE), "--cluster", args.cluster,
                "--no-verify", "--out", str(Path(scratch) / "plan.yaml")]
        commands = {f"{Path(sys.executable).name} -c \"import torch\"":
                    [sys.executable, "-c", "import torch"],
                    f"bytecomp plan profiles/transformer --cluster {args.cluster} "
                    f"--no-verify": plan}
        names = list(commands)
        before = load()
        print(f"before: {before}", flush=True)
        for command in commands.values():  # untimed: caches warm for both alike
            timed(command)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.runs):
            for name in names if round_ % 2 == 0 else names[::-1]:
                times[name].append(timed(commands[name]))
        after = load()
    (torch_name, plan_name), medians = names, {name: statistics.median(times[name])
                                               for name in names}
    ratio = medians[plan_name] / medians[torch_name]
    per_round = statistics.median(p / t for p, t in zip(times[plan_name], times[torch_name]))
    verdict = "within" if ratio <= TARGET else "NOT within"
    lines = [f"{args.runs} interleaved run(s) of each (whole processes, start to exit, after "
             f"one untimed run of each); plan: {' '.join(bytecomp_command())}", "",
             "| command | median s | runs s |", "|---|---:|---|"]
    lines += [f"| {name} | {medians[name]:.3f} | "
              f"{', '.join(f'{t:.3f}' for t in times[name])} |" for name in names]
    lines += ["", f"plan / import torch: {ratio:.2f}x (median of the rounds' ratios "
                  f"{per_round:.2f}x): {verdict} the {TARGET:g}x target"]
    print("\n".join(lines))
    print(f"after: {after}")
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write("\n".join([f"before: {before}", "", *lines, "", f"after: {after}"])
                         + "\n")


if __name__ == "__main__":
    main()
