"""Golden plans: what the planner chose for the shipped profiles and the search
benchmark's synthetic sets, recorded before a refactoring, so that one can show it
changed no plan.

``python tests/golden/plans.py --write`` records them (``plans.json`` beside this
file); ``--check`` plans every case again and compares (``tests/test_golden.py`` does
so for a sample). A case is
planned through the command line (the shipped profiles: every cluster config, both
objectives, the adaptive ladders) or through :class:`bytecomp.search.Planner` (the
synthetic sets of ``benchmarks/search.py``), and reduced to what decides the plan:
the bucket cap, every tensor's strategy and group, the predictions.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RECORD = HERE / "plans.json"

PROFILES = ["profiles/transformer", "profiles/cnn"] + [
    f"benchmarks/results/convergence/{run}/profile"
    for run in ("transformer-2x1-100mbit", "transformer-2x1-1gbit", "digits-2x1-100mbit",
                "digits-2x1-1gbit")]
CLUSTERS = [None, "gbe1", "gbe10", "v100-pcie-25g", "a100-ib200"]
LADDERS = {"benchmarks/results/convergence/transformer-2x1-100mbit/profile": ["powersgd", "topk"],
           "benchmarks/results/convergence/transformer-2x1-1gbit/profile": ["powersgd", "topk"],
           "benchmarks/results/convergence/digits-2x1-100mbit/profile": ["powersgd", "topk"],
           "benchmarks/results/convergence/digits-2x1-1gbit/profile": ["topk"]}


def profile_cases() -> list[dict]:
    """Command-line cases: (profile, cluster, extra arguments)."""
    cases = []
    for profile in PROFILES:
        for cluster in CLUSTERS:
            for objective in (None, "time"):
                args = ["--objective", objective] if objective else []
                cases.append({"profile": profile, "cluster": cluster, "args": args})
        for family in LADDERS.get(profile, []):
            cases.append({"profile": profile, "cluster": None, "args": ["--adaptive", family]})
    return cases


def case_name(case: dict) -> str:
    if "profile" in case:
        return " ".join([case["profile"], case["cluster"] or "profiled", *case["args"]])
    return f"{case['set']} {case['model']} {case['cluster']} {case['allowed']} " \
           f"{case.get('objective') or 'default'}"


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _entries(tensors: list[dict]) -> list[str]:
    """A plan's entries, one line each: name, compressor, place, scheme, group."""
    return [f"{t['name']} {t['compressor'] or 'none'} {t['place']} {t['collective']} "
            f"{t['group']}" for t in tensors]


def essentials(plan: dict) -> dict:
    """What decides a plan file, and its predictions (no provenance, no search time)."""
    out = {"bucket_cap_mb": plan["bucket_cap_mb"], "predicted_ms": _rounded(plan["predicted_ms"]),
           "evaluations": plan["search"].get("evaluations"),
           "algorithm": plan["search"].get("algorithm")}
    if "levels" in plan:
        out["adaptive"] = plan["adaptive"]
        out["levels"] = [{"setting": lv["setting"], "predicted_ms": _rounded(lv["predicted_ms"]),
                          "fidelity": _rounded(lv["fidelity"]), "gain": _rounded(lv["gain"]),
                          "tensors": _entries(lv["tensors"])} for lv in plan["levels"]]
    else:
        out["tensors"] = _entries(plan["tensors"])
        out["fidelity"] = _rounded(plan.get("fidelity"))
    return out


def plan_profile_case(case: dict) -> dict:
    """Plan a command-line case and return the plan's essentials."""
    import yaml

    from bytecomp.cli import main

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.yaml"
        argv = ["plan", str(ROOT / case["profile"]), "--out", str(out), "--no-verify", *case["args"]]
        if case["cluster"]:
            argv += ["--cluster", case["cluster"]]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                main(argv)
            except SystemExit as done:
                if done.code:
                    return {"error": done.code}
        return essentials(yaml.safe_load(out.read_text()))


def synthetic_cases() -> list[dict]:
    """benchmarks/search.py's classic and scale sets (their default searches)."""
    cases = []
    for model in ("MLP", "ResNet-50-like", "48-layer transformer"):
        for cluster in ("10G", "1G"):
            for allowed in ("one", "every"):
                for objective in (None, "time"):
                    cases.append({"set": "classic", "model": model, "cluster": cluster,
                                  "allowed": allowed, "objective": objective})
    for model in ("LSTM", "VGG-16", "GPT-2", "BERT-base", "ResNet-101"):
        for cluster in ("8x8 V100 10G", "8x8 V100 25G", "8x8 V100 100G", "4x8 A100 200G"):
            for allowed in ("one", "every"):
                cases.append({"set": "scale", "model": model, "cluster": cluster,
                              "allowed": allowed})
    return cases


def _benchmark():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import search as benchmark  # benchmarks/search.py

    return benchmark


def synthetic_search(case: dict):
    """The planner and the default search's result of a synthetic case."""
    from bytecomp.search import Planner
    from bytecomp.testing.synthetic import synthetic_profile

    benchmark = _benchmark()
    if case["set"] == "classic":
        shapes = dict(benchmark.CLASSIC_MODELS)[case["model"]]
        profile = benchmark.classic_profile(shapes, 10.0 if case["cluster"] == "10G" else 1.0)
        cluster = None
    else:
        shapes, backward = {name: (s, b) for name, s, b in benchmark.SCALE_MODELS}[case["model"]]
        profile = synthetic_profile(shapes, world_size=8, nodes=1, backward_ms=backward)
        cluster = {c.name: c for c in benchmark.clusters()}[case["cluster"]]
    specs = benchmark.ONE if case["allowed"] == "one" else None
    planner = Planner(profile, cluster, specs, objective=case.get("objective"))
    return planner, planner.search()


def _digest(labels: list[str]) -> dict:
    """An assignment as its composition and the sha256 of its labels in order."""
    import hashlib
    from collections import Counter

    return {"composition": dict(sorted(Counter(labels).items())),
            "sha256": hashlib.sha256("\n".join(labels).encode()).hexdigest()}


def plan_synthetic_case(case: dict) -> dict:
    planner, result = synthetic_search(case)
    problem = result.problem
    return {"cap_mb": result.cap_mb, "value": _rounded(result.value),
            "time_ms": _rounded(result.time_ms), "evaluations": result.evaluations,
            "algorithm": result.algorithm,
            "assignment": _digest([problem.options[o].label for o in result.assignment]),
            "baselines": {b.name: _rounded(b.value) for b in result.baselines}}


def plan_case(case: dict) -> dict:
    return plan_profile_case(case) if "profile" in case else plan_synthetic_case(case)


def all_cases() -> list[dict]:
    return profile_cases() + synthetic_cases()


def check() -> int:
    """Plan every recorded case again; print what differs. The exit code: the cases that
    differ."""
    sys.path.insert(0, str(HERE.parent))
    from test_golden import _same

    failed = 0
    for name, entry in json.loads(RECORD.read_text()).items():
        differences = _same(entry["plan"], plan_case(entry["case"]))
        print(("DIFFERS " if differences else "same    ") + name, *differences[:3], sep="\n  ")
        failed += bool(differences)
    return failed


def main() -> None:
    if "--check" in sys.argv:
        raise SystemExit(check())
    if "--write" not in sys.argv:
        raise SystemExit("usage: python tests/golden/plans.py --write | --check")
    record = {}
    for case in all_cases():
        record[case_name(case)] = {"case": case, "plan": plan_case(case)}
        print(case_name(case), flush=True)
    RECORD.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
