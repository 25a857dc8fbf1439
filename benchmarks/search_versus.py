"""Default search time of this checkout against another revision, side by side.

Times the scale set's default searches (``benchmarks/search.py --set scale``'s
profiles and clusters; ResNet-101 by default), or the classic set's for a classic
model (``--models ResNet-50-like``: one compressor and every one, both objectives, at
10 and 1 Gbit/s), with this checkout's bytecomp and
with a revision's (checked out in a temporary git worktree), in child processes
that alternate between the two for ``--rounds`` rounds, so that both see the same
machine; each child reports each instance's median of ``--repeats`` searches.
Prints, per instance, the median over rounds for each side, their ratio, and
whether both found the same plan value. ``--least`` takes the least time over
every round and repeat instead of medians: on a machine whose speed drifts
(steal, neighbours), noise only adds time, so the least is the steadier
estimate of what a search costs.

    python benchmarks/search_versus.py --against d07cb81 [--models ResNet-101] [--least]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(models: list[str], repeats: int) -> None:
    """In a child process: time the default searches with whichever bytecomp is first on
    the path (``search.py``, beside this file, brings the scale set's and the classic
    set's profiles and clusters), and print {instance: [median ms, plan value, least ms]}
    as JSON."""
    import search as sets

    from bytecomp.search import Planner
    from bytecomp.testing.synthetic import synthetic_profile

    out = {}
    for model, shapes in sets.CLASSIC_MODELS:
        if model not in models:
            continue
        for bandwidth in (10.0, 1.0):
            profile = sets.classic_profile(shapes, bandwidth)
            for allowed, specs in (("top-k", sets.ONE), ("all", None)):
                for objective in ("effective", "time"):
                    results = [Planner(profile, None, specs, objective=objective).search()
                               for _ in range(repeats)]
                    out[f"{model} {bandwidth:g}G {allowed} {objective}"] = [
                        statistics.median(r.search_ms for r in results), results[-1].value,
                        min(r.search_ms for r in results)]
    for model, shapes, backward_ms in sets.SCALE_MODELS:
        if model not in models:
            continue
        profile = synthetic_profile(shapes, world_size=8, nodes=1, backward_ms=backward_ms)
        for cluster in sets.clusters():
            for allowed, specs in (("top-k", sets.ONE), ("all", None)):
                results = [Planner(profile, cluster, specs).search() for _ in range(repeats)]
                out[f"{model} {cluster.name} {allowed}"] = [
                    statistics.median(r.search_ms for r in results), results[-1].value,
                    min(r.search_ms for r in results)]
    print(json.dumps(out))


def known_models() -> list[str]:
    """benchmarks/search.py's scale and classic models' names."""
    import search as sets

    return [name for name, _, _ in sets.SCALE_MODELS] + [name for name, _ in sets.CLASSIC_MODELS]


def run_side(tree: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--repeats",
               str(args.repeats), "--models", *args.models]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:  # e.g. a revision whose bytecomp lacks what search.py imports
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"search_versus: the search failed in {tree}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1", help="the revision to compare with")
    parser.add_argument("--models", nargs="+", default=["ResNet-101"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--least", action="store_true",
                        help="the least time of every round and repeat, not medians")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.models, args.repeats)
        return
    known = known_models()
    unknown = sorted(set(args.models) - set(known))
    if unknown:
        raise SystemExit(f"search_versus: unknown model {', '.join(unknown)}; choose from "
                         f"{', '.join(known)}")
    with tempfile.TemporaryDirectory() as folder:
        other = Path(folder) / "other"
        added = subprocess.run(["git", "worktree", "add", "--detach", "-q", str(other),
                                args.against], cwd=ROOT, capture_output=True, text=True)
        if added.returncode != 0:
            raise SystemExit(f"search_versus: cannot check out {args.against!r}: "
                             f"{added.stderr.strip().splitlines()[-1]}")
        try:
            runs: dict[str, list[dict]] = {"this": [], "other": []}
            for round_ in range(args.rounds):
                sides = [("other", other), ("this", ROOT)]
                for name, tree in sides if round_ % 2 == 0 else reversed(sides):
                    runs[name].append(run_side(tree, args))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT,
                           check=False)
    if args.least:
        print(f"default search ms, this checkout vs {args.against}: the least of "
              f"{args.rounds} alternating rounds x {args.repeats} searches per instance")
    else:
        print(f"default search ms, this checkout vs {args.against}: median over {args.rounds} "
              f"alternating rounds of each instance's median of {args.repeats} searches")
    print(f"{'instance':42s} {args.against:>10s} {'this':>8s} {'ratio':>7s}  same plan value")
    for instance in runs["this"][0]:
        if args.least:
            this = min(run[instance][2] for run in runs["this"])
            theirs = min(run[instance][2] for run in runs["other"])
        else:
            this = statistics.median(run[instance][0] for run in runs["this"])
            theirs = statistics.median(run[instance][0] for run in runs["other"])
        same = abs(runs["this"][0][instance][1] - runs["other"][0][instance][1]) < 1e-9
        print(f"{instance:42s} {theirs:10.0f} {this:8.0f} {theirs / this:6.2f}x  "
              f"{'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
