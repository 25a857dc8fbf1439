"""Whether a change leaves every plan file as it was: ``bytecomp plan --no-verify`` for every
shipped profile and cluster (the profiled one and each shipped config), once with the code
of a base revision and once with this checkout's, and the two files compared whole, less
what differs on every run (``created``, the search's clock time ``search.time_ms``).

    python tests/golden/same_plans.py --base REV

checks out REV in a temporary git worktree, runs its code from there (this venv's
packages), and prints one line per plan and a summary; exit 1 if any plan differs, with
its diff. ``tests/golden/plans.py --check`` compares what decides a plan for more cases;
this compares the files a user gets.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ["profiles/cnn", "profiles/transformer"]
CLUSTERS = [None, "gbe1", "gbe10", "v100-pcie-25g", "v100-nvlink-100g", "a100-ib200"]
# Runs bytecomp's command line from the folder given first, not from the editable install
# (whose finder would otherwise answer ``import bytecomp`` before sys.path is searched).
RUNNER = ("import sys; code = sys.argv.pop(1); "
          "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
          "getattr(f, '__module__', '')]; sys.path.insert(0, code); "
          "from bytecomp.cli import main; sys.argv[0] = 'bytecomp'; main()")


def plan_text(code: Path, profile: str, cluster: str | None, out: Path) -> str:
    """The plan file made by the code under ``code``, less ``created`` and the clock time."""
    args = [sys.executable, "-c", RUNNER, str(code), "plan", str(ROOT / profile), "--no-verify",
            "--out", str(out), *(["--cluster", cluster] if cluster else [])]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{code}: plan {profile} {cluster}: {done.stderr.strip()[-500:]}")
    plan = yaml.safe_load(out.read_text())
    plan.pop("created", None)
    plan.get("search", {}).pop("time_ms", None)
    return yaml.safe_dump(plan, sort_keys=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with")
    args = parser.parse_args()
    differ = 0
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        args.base], check=True)
        try:
            for profile in PROFILES:
                for cluster in CLUSTERS:
                    name = f"{profile} {cluster or 'profiled'}"
                    before = plan_text(base, profile, cluster, Path(scratch) / "before.yaml")
                    after = plan_text(ROOT, profile, cluster, Path(scratch) / "after.yaml")
                    same = before == after
                    differ += not same
                    print(f"{'same' if same else 'DIFFERS'}  {name}")
                    if not same:
                        print("".join(difflib.unified_diff(
                            before.splitlines(True), after.splitlines(True), args.base,
                            "this checkout")))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)
    total = len(PROFILES) * len(CLUSTERS)
    print(f"{total - differ} of {total} plan files the same as at {args.base}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
