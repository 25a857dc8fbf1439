"""Planning inside a running job (:func:`bytecomp.autotune`): what the job measured while it
trained becomes a profile, the library's planner searches it, and the plan's finalists
become the levels of a runtime trial the job then times.

The job's rank 0 runs :func:`main` on ``DIRECTORY`` in a child process on idle cores
(:data:`bytecomp.autotuner.tuner.CHILD`: the search never takes the GIL or a core from
training) once the ranks agreed on the measurements. It reads ``DIRECTORY/measurements.json`` (:data:`MEASUREMENTS`, written
by :mod:`bytecomp.autotuner.measure`), writes ``DIRECTORY/plan.yaml`` and exits 0, or
writes the reason in one line to ``DIRECTORY/error.txt`` and exits 1.

What the profile holds (:func:`profile_from_measurements`): the tensors in the order
their gradients were ready, with their buckets; the job's own bucket allreduces and the
probes of the other collectives at small sizes; each compressor's encode and decode on
real gradients; each compressor's gain on each tensor's real gradient (one step each, so
without the residuals error feedback builds up over steps). No convergence probe: the
in-job fidelity stands in for it (a candidate's steps factor is 1 / its fidelity).

The search is deterministic (a fixed number of evaluations, no wall-clock cap), so a run
resumed in the planning phase plans the same plan again.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan

MEASUREMENTS = "measurements.json"
PLAN = "plan.yaml"
ERROR = "error.txt"
FORMAT = 1
MAX_CANDIDATES = 4  # levels the trial times, fp32 DDP included: 5 turns each in 20 steps
TRIAL_WARMUP = 2  # steps after the handover before the turns (caches, the executor's threads)


def profile_from_measurements(measured: dict):
    """A :class:`~bytecomp.profile_store.Profile` of what the job measured (see the module
    docstring), checked as a profile directory is."""
    import pandas as pd

    from bytecomp.profile_store import FORMAT_VERSION, Profile, check_profile
    from bytecomp.profile_tables import TABLES

    try:
        if measured.get("format") != FORMAT:
            raise BytecompError(f"measurements format {measured.get('format')!r}, "
                                f"expected {FORMAT}")
        tensors = sorted(measured["tensors"], key=lambda row: row["ready_ms"])
        rows = [{"name": t["name"], "shape": "x".join(map(str, t["shape"])) or "1",
                 "numel": math.prod(t["shape"]), "dtype": t["dtype"],
                 "bytes": math.prod(t["shape"]) * t["element_size"],
                 "ready_ms": t["ready_ms"], "bucket": t["bucket"]} for t in tensors]
        world = measured["world_size"]
        collectives = [{"collective": c["collective"], "group": "world", "dtype": "float32",
                        "bytes": c["bytes"], "ranks": world, "time_ms": c["time_ms"],
                        "p10_ms": c["p10_ms"], "p90_ms": c["p90_ms"]}
                       for c in measured["collectives"]]
        device = measured["device"]
        compressors = [{"spec": c["spec"], "device": device, "numel": c["numel"],
                        "encode_ms": c["encode_ms"], "decode_ms": c["decode_ms"],
                        "payload_bytes": c["payload_bytes"]} for c in measured["compressors"]]
        fidelity = [{"tensor": f["tensor"], "spec": f["spec"], "gain": f["gain"],
                     "gain_p10": f["gain"], "gain_p90": f["gain"],
                     "norm_share": f["norm_share"]} for f in measured["fidelity"]]
        times = {key: {"median_ms": value, "p10_ms": value, "p90_ms": value}
                 for key, value in measured["times"].items()}
        model = measured["model"]
        meta = {"format_version": FORMAT_VERSION, "in_job": True,
                "model": {"name": model["name"], "spec": model["name"],
                          "fingerprint": model["fingerprint"],
                          "parameters": sum(row["numel"] for row in rows),
                          "tensors": len(rows)},
                "device": {"type": device, "name": measured["device_name"]},
                "backend": measured["backend"], "world_size": world,
                "nodes": measured["nodes"], "ranks_per_node": measured["ranks_per_node"],
                "batch_size": 1, "bucket_cap_mb": measured["bucket_cap_mb"],
                "iterations": measured["steps"], "times": times,
                "interference": {"fraction": 0.0}}
    except (KeyError, TypeError, AttributeError) as error:
        raise BytecompError(f"the job's measurements are incomplete ({error!r})") from None
    profile = Profile(meta, pd.DataFrame(rows, columns=list(TABLES["tensors"])),  # type: ignore[arg-type]  # checked below
                      pd.DataFrame(collectives, columns=list(TABLES["collectives"])),
                      pd.DataFrame(compressors, columns=list(TABLES["compressors"])),
                      fidelity=pd.DataFrame(fidelity, columns=list(TABLES["fidelity"])))
    return check_profile(profile)


def plan_in_job(measured: dict) -> Plan:
    """The plan the job runs next (see the module docstring): fp32 DDP where no candidate
    is predicted ``margin`` (the job's setting) sooner than it at or above the fidelity floor, else
    an adaptive plan whose levels are fp32 DDP and the best candidates, all timed by the
    runtime trial. The reason is in ``plan.search["autotune"]``."""
    from bytecomp.search import Planner, to_plan
    from bytecomp.search.finalists import shortlist
    from bytecomp.search.settings import SearchOptions, default_min_gain

    profile = profile_from_measurements(measured)
    # autotune's settings, declared and checked there (bytecomp.autotuner), as the job wrote
    # them; a candidate is timed where predicted ``margin`` sooner than fp32 DDP
    try:
        settings = measured["settings"]
        min_fidelity = float(settings["min_fidelity"])
        evaluations = int(settings["evaluations"])
        margin = float(settings["margin"])
        limit = int(settings.get("max_candidates", MAX_CANDIDATES))
    except (KeyError, TypeError, ValueError) as error:
        raise BytecompError(f"the job's planning settings are incomplete ({error!r})") \
            from None
    if not (0.0 <= min_fidelity <= 1.0 and 1 <= evaluations <= 10**6 and 2 <= limit <= 8
            and -1.0 <= margin <= 0.5):
        raise BytecompError("the job's planning settings are out of range")
    # without a compressor measured on every tensor, the gains are unknown: plan by time
    # (the search then has fp32 DDP alone, and says why it keeps it)
    objective = "effective" if profile.has_fidelity else "time"
    planner = Planner(profile, None, list(measured["specs"]) or ["none"], True, objective,
                      min_fidelity, "params", False)
    cap = float(measured["bucket_cap_mb"])  # DDP's buckets are built: the plan keeps its cap
    options = SearchOptions((cap,), "auto", None, default_min_gain(objective), evaluations)
    result = planner.search(options)
    static = to_plan(result, profile)
    finalists = [replace(f, cap_mb=cap, time_ms=planner.problem.simulate(
        f.assignment, cap).iteration_ms) for f in shortlist(planner, result, options,
                                                            slower=margin < 0)]
    fp32, others = finalists[0], finalists[1:]
    effective = {id(f): f.time_ms / (f.fidelity or 1.0) for f in finalists}
    floor_ok = [f for f in others if (f.fidelity or 1.0) >= min_fidelity]
    ahead = sorted((f for f in floor_ok if effective[id(f)] <= effective[id(fp32)] *
                    (1 - margin)), key=lambda f: effective[id(f)])[:limit - 1]
    if not profile.has_fidelity:
        floor_ok = ahead = []
    record = {"measured_steps": measured["steps"], "min_fidelity": min_fidelity,
              "evaluations": evaluations,
              "finalists": [{"name": f.name, "predicted_ms": round(f.time_ms, 4),
                             "fidelity": None if f.fidelity is None else round(f.fidelity, 6),
                             "effective_ms": round(effective[id(f)], 4),
                             "timed": f is fp32 or f in ahead,
                             "below_floor": (f.fidelity or 1.0) < min_fidelity}
                            for f in finalists]}
    if not ahead and not profile.has_fidelity:
        record["reason"] = ("keeps fp32 DDP: no compressor was measured on every tensor "
                            "within the share (a larger share= or measure_steps= measures "
                            "more)")
    elif not ahead:
        best = min(others, key=lambda f: effective[id(f)], default=None)
        record["reason"] = (
            "keeps fp32 DDP: no candidate is predicted "
            f"{100 * margin:.0f}% sooner at fidelity >= {min_fidelity:g}" +
            ("" if best is None else
             f" (best: {best.name}, {100 * (effective[id(best)] / effective[id(fp32)] - 1):+.1f}%"
             f"{', below the floor' if best not in floor_ok else ''})"))
    if not ahead:
        fp32_result = replace(result, assignment=list(fp32.assignment), cap_mb=cap,
                              time_ms=fp32.time_ms, fidelity=1.0)
        plan = to_plan(fp32_result, profile)
        plan.search["autotune"] = record
        return plan
    plan = _trial_plan(planner, result, static, [fp32, *ahead], cap)
    record["reason"] = (f"times {len(ahead) + 1} candidates predicted within reach: " +
                        ", ".join(f"{f.name} {effective[id(f)]:.1f} ms/fidelity"
                                  for f in [fp32, *ahead]))
    plan.search["autotune"] = record
    return plan


def _trial_plan(planner, result, static: Plan, members: list, cap: float) -> Plan:
    """An adaptive plan of ``members`` (fp32 DDP first) as levels, mildest first, every one
    a trial candidate, starting at fp32 DDP; each level's steps factor is 1 / its
    fidelity (the in-job stand-in for the convergence probe)."""
    from bytecomp.plan_file import FINALISTS
    from bytecomp.plan_types import MIN_TRIAL_PAIRS, Adaptive, Level
    from bytecomp.search.ladder import level_fidelities
    from bytecomp.search.plans import plan_entries
    from bytecomp.search.trials import TRIAL_STEPS, trial_agreement
    from bytecomp.search.verify import NEVER

    fp32 = members[0]
    members = [fp32] + sorted(members[1:], key=lambda f: (-(f.fidelity or 1.0), f.time_ms))
    results = [replace(result, assignment=list(f.assignment), cap_mb=cap, time_ms=f.time_ms)
               for f in members]
    gains, fidelities = level_fidelities(planner.profile, results)
    levels = [Level(f.name, plan_entries(planner.problem, f.assignment, cap),
                    round(f.time_ms, 4), None if fidelity is None else round(fidelity, 6),
                    None if gain is None else round(gain, 6),
                    round(1.0 / (f.fidelity or 1.0), 4))
              for f, gain, fidelity in zip(members, gains, fidelities)]
    trial = list(range(len(levels)))
    # threshold 0: the controller never steps back on the gain it measures. The in-job
    # gains are one step's, without residuals; what the executor measures of an error
    # feedback compressor, on the compensated gradient, reads lower, and stepping back on
    # it left bow-sgd's kept plan (41 ms a step) for a 244 ms level for the rest of the run
    adaptive = Adaptive(FINALISTS, threshold=0.0,
                        explore_every=NEVER, start=0,
                        agree_every=trial_agreement(fp32.time_ms, len(trial)),
                        trial=tuple(trial),
                        trial_steps=max(TRIAL_STEPS, MIN_TRIAL_PAIRS * len(trial)),
                        trial_warmup=TRIAL_WARMUP)
    return Plan(static.model_fingerprint, static.world_size, static.nodes,
                static.ranks_per_node, cap, levels[0].entries,
                {**static.predicted_ms, "levels": [level.predicted_ms for level in levels]},
                dict(static.search), dict(static.info), levels=levels, adaptive=adaptive,
                host_workers=static.host_workers)


def main(argv: list[str] | None = None) -> int:
    """``python -m bytecomp.search.in_job DIRECTORY``: plan what the job measured."""
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1:
        print("usage: python -m bytecomp.search.in_job DIRECTORY", file=sys.stderr)
        return 2
    directory = Path(arguments[0])
    from bytecomp.lifetime import die_with_parent

    die_with_parent(os.getppid())  # no planner outliving the job
    try:
        measured = json.loads((directory / MEASUREMENTS).read_text())
        if not isinstance(measured, dict):
            raise BytecompError(f"{MEASUREMENTS} is not a mapping")
        plan = plan_in_job(measured)
        plan.save(directory / PLAN)  # atomic: the job reads it once the child exits
    except (BytecompError, OSError, ValueError) as error:
        (directory / ERROR).write_text(f"{error}"[:2000] + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
