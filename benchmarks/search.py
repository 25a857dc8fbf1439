"""Search time and plan quality on synthetic profiles.

Two sets (``--set``):

* ``classic`` (the default, as before issue 18): 10 tensors (a 5-layer MLP), 161
  (ResNet-50's parameters) and 1,500 (a 48-layer transformer), profiled
  synthetically on 2 nodes x 4 GPUs (GPU-like compression speeds, host offload
  available) with 10 Gbit/s and 1 Gbit/s links, with a fidelity table
  (``synthetic_gain``) and a convergence probe (steps factors: fp16 1.0, PowerSGD
  1.2, top-k 2.5, the rest 1.5). For each: one compressor allowed (topk; the fp16
  and PowerSGD hooks' methods stay candidates, as by default) and every
  compressor allowed, under the default objective (effective time, minimum
  fidelity 0.75) and under ``--objective time``. Search time is the median of
  ``--repeats`` runs of ``Planner.search``. Targets: under 100 ms at 161 tensors
  and under 2 s at 1,500 with one compressor; the plan never predicted worse than
  any baseline it may use on its objective; the gap to the lower bound reported.
* ``scale`` (issue 18): GPU-like profiles of five model sizes, LSTM (10
  tensors), VGG-16 (32), GPT-2 small (148), BERT-base (199), ResNet-101 (314) and a
  GAN-like pair of residual conv nets (296 small tensors),
  planned with ``--cluster`` for 8 x 8 V100 (NVLink; the network at 10, 25 and
  100 Gbit/s) and 4 x 8 A100 (``a100-ib200``), with one compressor allowed
  (top-k 1%; the fp16 and PowerSGD hooks' methods stay candidates, as by
  default) and with every compressor. For each: the default search (time: the
  median of ``--repeats`` runs; its plan), a long search (``--long-seconds`` of
  annealing, 60 by default), and the lower bound. Targets: the default within 2%
  of the long search on every instance, a median gap to the lower bound of at
  most 10%, the default search under 300 ms at 314 tensors; and, on a 48-layer
  transformer (1,500 tensors), under 2 s. ``--long-from TABLE`` takes the long
  searches' results from an earlier run's markdown table instead of running them
  (40 minutes at 60 s each).

``--long-evaluations 40000`` makes the long search ``--algorithm local`` with 40,000
evaluations and no margin instead; ``--clusters`` and ``--allowed`` pick instances.

* ``exact``: the small problems, where the default search tries to prove its plan
  optimal and ``--algorithm exact`` proves it or stops at its cap (``--exact-cap``
  seconds, 10 by default): the scale set's LSTM (10 tensors) on its four clusters and
  the classic set's MLP (10 tensors) on its two links, one compressor and every
  compressor, and the shipped cnn profile (20 tensors) on its profiled cluster and on
  gbe1. For each: the default search (median time of ``--repeats``, whether proven),
  then the exact search (time, proven or the caps it searched through, its plan
  against the default's).

* ``real``: per-tensor lists of real architectures in ready order, each tensor ready
  after the backward time its layers take on a V100 (from their FLOPs and the bytes
  they move; ``bytecomp/testing/architectures.py`` says how): VGG-16 (32 tensors),
  ResNet-101 (314), BERT-base pretraining (206), GPT-2 small (148), a U-GAT-IT-like
  pair of generators and discriminators (208, most of them small) and a 2-layer LSTM
  language model (11), planned for the shipped ``v100-nvlink-100g`` and
  ``v100-pcie-25g`` (8 x 8) with one compressor (top-k 1%) and with every compressor,
  by iteration time (a profile without fidelity) and by effective time (the synthetic
  fidelity table: the default objective of a profile that measured gains).
  For each: the default search (median time of ``--repeats``; its plan, lower bound
  and the gap it prints, whether it proved its plan optimal); with
  ``--long-evaluations N`` the long search (``--algorithm local``, N evaluations, no
  margin) and, on problems of at most 30 tensors, ``--algorithm exact`` (``--exact-cap``
  seconds). The default run (no long search) takes about 20 s; ``--long-evaluations
  40000`` about 3 minutes (measured on 2 cores beside others' jobs; each results file
  has its command, its duration and the load).

* ``small``: Planner set-up and search in process CPU time (a shared machine inflates
  the wall clock, not it), median of ``--repeats``: the scale set's LSTM (10 tensors)
  on its four clusters, top-k and every compressor, then 161 and 1,500 tensors; each
  plan against the best compressor on every tensor (every searchable option, at the
  plan's and the profiled cap).

    python benchmarks/search.py [--set classic|scale|exact|real|small] [--repeats 3] [--long-seconds 60]
                                [--long-evaluations 40000] [--clusters "8x8 V100 25G"]
                                [--long-from benchmarks/results/search-scale.md]
                                [--models LSTM VGG-16 ...] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bytecomp.buckets import cap_label
from bytecomp.costs.clusters import load_cluster
from bytecomp.search import Planner
from bytecomp.search.planner import EXACT_AUTO_TENSORS
from bytecomp.search.settings import BaselineKind
from bytecomp.testing.architectures import REAL, real_profile
from bytecomp.testing.synthetic import (
    bert_shapes,
    gan_shapes,
    gpt2_shapes,
    lstm_shapes,
    mlp_shapes,
    resnet50_shapes,
    resnet101_shapes,
    synthetic_profile,
    transformer_shapes,
    vgg16_shapes,
)

# (name, shapes, backward ms): GPU-like backward passes of 10 to 400 ms
SCALE_MODELS = [("LSTM", lstm_shapes(), 10.0), ("VGG-16", vgg16_shapes(), 100.0),
                ("GPT-2", gpt2_shapes(), 400.0), ("BERT-base", bert_shapes(), 200.0),
                ("ResNet-101", resnet101_shapes(), 150.0), ("GAN-like", gan_shapes(), 60.0)]
LARGE_MODEL = ("48-layer transformer", transformer_shapes(), 400.0)
CLASSIC_MODELS = [("MLP", mlp_shapes(5, 1024)), ("ResNet-50-like", resnet50_shapes()),
                  ("48-layer transformer", transformer_shapes())]
ONE = ["topk:ratio=0.01"]
LONG_EVALUATIONS = 10**9  # the long search: as many as --long-seconds allows


def v100(inter_gbps: float):
    cluster = load_cluster("v100-nvlink-100g")
    return replace(cluster, name=f"8x8 V100 {inter_gbps:g}G",
                   inter=replace(cluster.inter, bandwidth_gbps=inter_gbps))


def clusters():
    return [v100(10.0), v100(25.0), v100(100.0), replace(load_cluster("a100-ib200"),
                                                         name="4x8 A100 200G")]


def timed(profile, cluster, specs, repeats: int, budget_s: float | None = None):
    """The median search time of ``repeats`` searches, the last result, its planner, and
    whether every repeat gave the same plan (the search is deterministic)."""
    times, results, planner = [], [], None
    for _ in range(repeats):
        planner = Planner(profile, cluster, specs)
        results.append(planner.search(budget_s=budget_s))
        times.append(results[-1].search_ms)
    same = all((r.assignment, r.cap_mb, r.value) ==
               (results[0].assignment, results[0].cap_mb, results[0].value) for r in results)
    return statistics.median(times), results[-1], planner, same


def scale_row(name, shapes, backward_ms, cluster, allowed, specs, args) -> dict:
    profile = synthetic_profile(shapes, world_size=8, nodes=1, backward_ms=backward_ms)
    search_ms, default, planner, same = timed(profile, cluster, specs, args.repeats)
    row = {"model": name, "tensors": len(shapes), "cluster": cluster.name, "allowed": allowed,
           "options": len(planner.searchable), "search_ms": search_ms,
           "plan_ms": default.value, "cap": cap_label(default.cap_mb),
           "evaluations": default.evaluations, "same": same,
           "bound_ms": default.lower_bound_ms}
    if args.earlier is not None:
        if (name, cluster.name, allowed) in args.earlier:
            long_ms, long_evaluations = args.earlier[(name, cluster.name, allowed)]
            row.update(long_ms=long_ms, long_evaluations=long_evaluations)
    elif args.long_evaluations:  # the reference: a local search of N evaluations
        long = Planner(profile, cluster, specs).search(algorithm="local", min_gain=0.0,
                                                       evaluations=args.long_evaluations)
        row.update(long_ms=long.value, long_evaluations=long.evaluations,
                   bound_ms=max(default.lower_bound_ms, long.lower_bound_ms))
    elif args.long_seconds > 0:
        long = Planner(profile, cluster, specs).search(evaluations=LONG_EVALUATIONS,
                                                       budget_s=args.long_seconds)
        row.update(long_ms=long.value, long_evaluations=long.evaluations,
                   bound_ms=max(default.lower_bound_ms, long.lower_bound_ms))
    best = min(default.baselines, key=lambda b: b.value)
    row.update(fp32_ms=default.baseline(BaselineKind.FP32_DDP).value,
               best_baseline=f"{best.name} ({best.value:.2f})")
    return row


def earlier_long_searches(path: str) -> tuple[str, dict]:
    """The long searches of an earlier ``--markdown`` table of the scale set: its header
    for them, and (model, cluster, allowed) -> (plan ms, evaluations)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.startswith("|")]
    if len(lines) < 3:
        raise ValueError("no table")
    headers = [cell.strip() for cell in lines[0].strip("|").split("|")]
    column = next(i for i, h in enumerate(headers) if h.endswith(" s search ms"))
    found = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        found[(cells[0], cells[2], cells[3])] = (float(cells[column]),
                                                 int(cells[column + 1].replace(",", "")))
    return headers[column], found


def scale(args, console: Console) -> list[str]:
    long_header = f"{args.long_seconds:g} s search ms" if not args.long_evaluations else \
        f"{args.long_evaluations:,}-evaluation search ms"
    if args.long_from:
        try:
            header, args.earlier = earlier_long_searches(args.long_from)
        except (OSError, ValueError, IndexError, StopIteration):
            sys.exit(f"search.py: {args.long_from} is not a scale-set table with long "
                     f"searches (from --markdown)")
        long_header = f"{header} ({Path(args.long_from).name})"
        missing = [(name, cluster.name, allowed) for name, _, _ in SCALE_MODELS
                   if not args.models or name in args.models for cluster in clusters()
                   if not args.clusters or cluster.name in args.clusters
                   for allowed in ("top-k", "all")
                   if not args.allowed or allowed == args.allowed
                   if (name, cluster.name, allowed) not in args.earlier]
        for row in missing:  # (a model added since that table: no long search to compare)
            console.print(f"search.py: {args.long_from} has no row for {' / '.join(row)}")
    headers = ["model", "tensors", "cluster", "allowed", "options", "search ms", "evaluations",
               "same plan each repeat", "plan ms", "cap", long_header,
               "its evaluations", "default vs long", "lower bound ms", "gap", "gap of long",
               "fp32 DDP ms", "best baseline"]
    rows = []
    for name, shapes, backward_ms in SCALE_MODELS:
        if args.models and name not in args.models:
            continue
        for cluster in clusters():
            if args.clusters and cluster.name not in args.clusters:
                continue
            for allowed, specs in (("top-k", ONE), ("all", None)):
                if args.allowed and allowed != args.allowed:
                    continue
                row = scale_row(name, shapes, backward_ms, cluster, allowed, specs, args)
                rows.append(row)
                console.print(_line(row))
    large = []
    if not args.models or LARGE_MODEL[0] in args.models:
        name, shapes, backward_ms = LARGE_MODEL
        profile = synthetic_profile(shapes, world_size=8, nodes=1, backward_ms=backward_ms)
        for allowed, specs in (("top-k", ONE), ("all", None)):
            search_ms, result, _, same = timed(profile, v100(100.0), specs, args.repeats)
            large.append((allowed, search_ms, result, same))
    return _scale_report(rows, large, headers, args, console, long_header)


def _line(row: dict) -> str:
    long = row.get("long_ms")
    return (f"{row['model']} on {row['cluster']}, {row['allowed']}: {row['search_ms']:.0f} ms, "
            f"plan {row['plan_ms']:.2f}" + (f", long {long:.2f}" if long else "")
            + f", bound {row['bound_ms']:.2f}")


def _scale_report(rows, large, headers, args, console, long_header) -> list[str]:
    table = Table(title=f"search at scale (synthetic GPU-like profiles), default search time: "
                        f"median of {args.repeats}")
    for header in headers:
        table.add_column(header)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    gaps, longs = [], []
    for row in rows:
        long = row.get("long_ms")
        gap = row["plan_ms"] / row["bound_ms"] - 1
        gaps.append(gap)
        if long:
            longs.append(row["plan_ms"] / long - 1)
        cells = [row["model"], str(row["tensors"]), row["cluster"], row["allowed"],
                 str(row["options"]), f"{row['search_ms']:.0f}", f"{row['evaluations']:,}",
                 "yes" if row["same"] else "NO", f"{row['plan_ms']:.2f}",
                 row["cap"], f"{long:.2f}" if long else "-",
                 f"{row['long_evaluations']:,}" if long else "-",
                 f"{100 * (row['plan_ms'] / long - 1):+.2f}%" if long else "-",
                 f"{row['bound_ms']:.2f}", f"{100 * gap:.1f}%",
                 f"{100 * (long / row['bound_ms'] - 1):.1f}%" if long else "-",
                 f"{row['fp32_ms']:.2f}", row["best_baseline"]]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    summary = []
    if rows:
        summary.append(f"median gap to the lower bound: {100 * statistics.median(gaps):.1f}% "
                       f"(worst {100 * max(gaps):.1f}%)")
    if longs:
        summary.append(f"default vs {long_header.replace(' search ms', ' search')}: worst "
                       f"{100 * max(longs):+.2f}%"
                       f", median {100 * statistics.median(longs):+.2f}%")
    by_size: dict[int, list[float]] = {}
    for row in rows:
        by_size.setdefault(row["tensors"], []).append(row["search_ms"])
    for tensors, times in sorted(by_size.items()):
        summary.append(f"default search at {tensors} tensors: {min(times):.0f}-{max(times):.0f} ms")
    for allowed, search_ms, result, same in large:
        summary.append(f"default search at {len(result.problem.tensors)} tensors (48-layer "
                       f"transformer, 8x8 V100 100G, {allowed}): {search_ms:.0f} ms, plan "
                       f"{result.value:.2f} ms, lower bound {result.lower_bound_ms:.2f} ms, "
                       f"{result.evaluations:,} evaluations, same plan each repeat: "
                       f"{'yes' if same else 'NO'}")
    for line in summary:
        console.print(line)
    return lines + [""] + summary


FACTORS = {"fp16": 1.0, "powersgd:rank=4": 1.2, "topk:ratio=0.01": 2.5}


def classic_profile(shapes, bandwidth: float):
    """The classic set's synthetic profile: 2 nodes x 4 GPUs, with fidelity and a probe."""
    profile = synthetic_profile(shapes, world_size=8, nodes=2, bandwidth_gbps=bandwidth,
                                fidelity=True)
    probed = list(dict.fromkeys(profile.compressors["spec"]))
    return synthetic_profile(shapes, world_size=8, nodes=2, bandwidth_gbps=bandwidth,
                             fidelity=True, probe={spec: FACTORS.get(spec, 1.5)
                                                   for spec in probed if spec != "none"})


def run(shapes, bandwidth: float, specs, repeats: int, objective: str) -> dict:
    profile = classic_profile(shapes, bandwidth)
    times, result = [], None
    for _ in range(repeats):
        planner = Planner(profile, None, specs, objective=objective)
        result = planner.search()
        times.append(result.search_ms)
    fp32 = result.baseline(BaselineKind.FP32_DDP)
    best = min(result.baselines, key=lambda b: b.value)
    return {"tensors": len(shapes), "options": len(planner.searchable),
            "search_ms": statistics.median(times), "algorithm": result.algorithm,
            "plan": result.value, "fidelity": result.fidelity, "fp32": fp32.value,
            "best_baseline": best.name, "best_baseline_value": best.value,
            "lower_bound_ms": result.lower_bound_ms, "gap": result.gap,
            "never_worse": all(result.value <= b.value + 1e-9
                               for b in result.baselines if _may_use(planner, b))}


def _may_use(planner: Planner, baseline) -> bool:
    """Whether the search could choose this baseline's options: with one compressor allowed
    the plan compresses with it or not at all (Espresso's rule), so the hooks' baselines
    (fp16, PowerSGD) are outside its space and not a bar it must clear."""
    options = planner.problem.options
    allowed = set(planner.specs) | {options[i].spec for i in planner.searchable}
    return all(not options[i].compressed or options[i].spec in allowed
               for i in baseline.assignment)


def classic(args, console: Console) -> list[str]:
    """The classic set: main's table (fidelity and a probe, both objectives)."""
    headers = ["model", "tensors", "link", "allowed", "objective", "options", "search ms",
               "algorithm", "plan", "fidelity", "fp32 DDP", "best baseline", "lower bound ms",
               "gap", "<= every baseline it may use"]
    table = Table(title=f"search on synthetic profiles (2 nodes x 4 GPUs), median of "
                        f"{args.repeats}")
    for header in headers:
        table.add_column(header, justify="left" if header in (
            "model", "allowed", "algorithm", "best baseline", "link", "objective") else "right")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for bandwidth in (10.0, 1.0):
        for name, shapes in CLASSIC_MODELS:
            for allowed, specs in (("topk", ONE), ("all", None)):
                for objective in ("effective", "time"):
                    row = run(shapes, bandwidth, specs, args.repeats, objective)
                    unit = "ms" if objective == "time" else "eff. ms"
                    cells = [name, str(row["tensors"]), f"{bandwidth:g} Gbit/s", allowed,
                             objective, str(row["options"]), f"{row['search_ms']:.0f}",
                             row["algorithm"], f"{row['plan']:.2f} {unit}",
                             f"{row['fidelity']:.3f}", f"{row['fp32']:.2f}",
                             f"{row['best_baseline']} ({row['best_baseline_value']:.2f})",
                             f"{row['lower_bound_ms']:.2f}", f"{100 * row['gap']:.1f}%",
                             "yes" if row["never_worse"] else "NO"]
                    table.add_row(*cells)
                    lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return lines


def exact_instances():
    """(name, profile, cluster or None, allowed, specs) of the exact set."""
    from bytecomp.profile_store import load_profile

    root = Path(__file__).resolve().parents[1]
    lstm = synthetic_profile(lstm_shapes(), world_size=8, nodes=1, backward_ms=10.0)
    for cluster in clusters():
        for allowed, specs in (("top-k", ONE), ("all", None)):
            yield "LSTM", lstm, cluster, allowed, specs
    for bandwidth in (10.0, 1.0):
        mlp = classic_profile(mlp_shapes(5, 1024), bandwidth)
        for allowed, specs in (("top-k", ONE), ("all", None)):
            yield f"MLP {bandwidth:g} Gbit/s", mlp, None, allowed, specs
    cnn = load_profile(root / "profiles" / "cnn")
    for cluster in (None, load_cluster("gbe1")):
        yield "cnn (shipped)", cnn, cluster, "all", None


def exact(args, console: Console) -> list[str]:
    """The exact set (see the module docstring)."""
    headers = ["model", "tensors", "cluster", "allowed", "options", "default ms",
               "default proven", "default plan", "exact s", "exact proven",
               "exact plan", "exact vs default"]
    table = Table(title=f"exact search on small problems (default: median of {args.repeats}; "
                        f"exact: cap {args.exact_cap:g} s)")
    for header in headers:
        table.add_column(header)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    load = os.getloadavg()[0]  # a shared machine: what else ran is part of the figures
    for name, profile, cluster, allowed, specs in exact_instances():
        search_ms, default, planner, _ = timed(profile, cluster, specs, args.repeats)
        found = Planner(profile, cluster, specs).search(algorithm="exact",
                                                        budget_s=args.exact_cap)
        proven = "yes" if found.exact else "no (" + next(
            (note.split(" before")[0] for note in found.notes if note.startswith("exact")),
            "stopped") + ")"
        cells = [name, str(len(planner.problem.tensors)),
                 cluster.name if cluster else "profiled", allowed,
                 str(len(planner.searchable)), f"{search_ms:.0f}",
                 "yes" if default.exact else "no", f"{default.value:.3f}",
                 f"{found.search_ms / 1000:.2f}", proven, f"{found.value:.3f}",
                 f"{100 * (found.value / default.value - 1):+.2f}%"]
        table.add_row(*cells)
        console.print(" | ".join(cells))
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    summary = f"load average (1 minute) {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    console.print(summary)
    return lines + ["", summary]


REAL_CLUSTERS = ("v100-nvlink-100g", "v100-pcie-25g")


def real_instances(models=None, cluster_names=None, allowed_only=None, objectives=None):
    """(name, net, profile, cluster, allowed, specs, objective) of the real set, in its
    order; ``models``, ``cluster_names``, ``allowed_only``, ``objectives`` pick a part.
    Objective ``time``: a profile without a fidelity table (iteration time alone);
    ``effective``: with the synthetic one, so the default objective is effective time
    with its minimum fidelity, as on a profile that measured gains."""
    for name, generator in REAL:
        if models and name not in models:
            continue
        net = generator()
        for objective in ("time", "effective"):
            if objectives and objective not in objectives:
                continue
            profile = real_profile(net, fidelity=objective == "effective")
            for cluster_name in REAL_CLUSTERS:
                if cluster_names and cluster_name not in cluster_names:
                    continue
                cluster = load_cluster(cluster_name)
                for allowed, specs in (("top-k", ONE), ("all", None)):
                    if allowed_only and allowed != allowed_only:
                        continue
                    yield name, net, profile, cluster, allowed, specs, objective


def real_row(name, net, profile, cluster, allowed, specs, objective, args) -> dict:
    """One instance of the real set: the default search, and with ``--long-evaluations``
    the long search and (small problems) the exact search."""
    search_ms, default, planner, same = timed(profile, cluster, specs, args.repeats)
    row = {"model": name, "tensors": len(planner.problem.tensors), "cluster": cluster.name,
           "allowed": allowed, "objective": default.objective.name, "options": len(planner.searchable), "search_ms": search_ms,
           "backward_ms": sum(net.ms), "plan_ms": default.value,
           "cap": cap_label(default.cap_mb), "evaluations": default.evaluations, "same": same,
           "bound_ms": default.lower_bound_ms, "printed": default.gap_text(),
           "proven": default.exact, "exact": None}
    if args.long_evaluations:
        long = Planner(profile, cluster, specs).search(algorithm="local", min_gain=0.0,
                                                       evaluations=args.long_evaluations)
        row.update(long_ms=long.value, long_evaluations=long.evaluations)
        if row["tensors"] <= EXACT_AUTO_TENSORS and not default.exact:
            found = Planner(profile, cluster, specs).search(algorithm="exact",
                                                            budget_s=args.exact_cap)
            row["exact"] = (found.exact, found.value, found.search_ms / 1000)
    fp32 = default.baseline(BaselineKind.FP32_DDP)
    row["fp32_ms"] = fp32.value if fp32 else math.nan
    assert row["objective"] == objective  # the profile's table decides it
    return row


def real(args, console: Console) -> list[str]:
    """The real set (see the module docstring)."""
    started, load = time.perf_counter(), os.getloadavg()[0]
    long_header = f"{args.long_evaluations:,}-evaluation search ms" if args.long_evaluations \
        else "long search ms (none run)"
    headers = ["model", "tensors", "backward ms", "cluster", "allowed", "objective", "options",
               "search ms", "evaluations", "same plan each repeat", "plan ms", "cap",
               long_header, "default vs long", "lower bound ms", "printed",
               "exact proved optimal", "fp32 DDP ms"]
    table = Table(title=f"search on real architectures' shapes (V100 backward times from "
                        f"FLOPs), default search time: median of {args.repeats}")
    for header in headers:
        table.add_column(header)
    lines = [f"`{' '.join(['python', *sys.argv])}`", "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    gaps = []
    for instance in real_instances(args.models, args.clusters, args.allowed, args.objectives):
        row = real_row(*instance, args)
        long = row.get("long_ms")
        if long:
            gaps.append((row["plan_ms"] / long - 1, f"{row['model']} / {row['cluster']} / "
                                                    f"{row['allowed']} / {row['objective']}"))
        exact = row["exact"]
        proved = "yes (default search)" if row["proven"] else "-" if exact is None else \
            (f"yes ({exact[2]:.1f} s, plan {exact[1]:.2f})" if exact[0] else
             f"no ({args.exact_cap:g} s cap, plan {exact[1]:.2f})")
        cells = [row["model"], str(row["tensors"]), f"{row['backward_ms']:.1f}",
                 row["cluster"], row["allowed"], row["objective"], str(row["options"]),
                 f"{row['search_ms']:.0f}", f"{row['evaluations']:,}",
                 "yes" if row["same"] else "NO", f"{row['plan_ms']:.2f}", row["cap"],
                 f"{long:.2f}" if long else "-",
                 f"{100 * (row['plan_ms'] / long - 1):+.2f}%" if long else "-",
                 f"{row['bound_ms']:.2f}", row["printed"], proved, f"{row['fp32_ms']:.2f}"]
        console.print(" | ".join(cells))
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    summary = []
    if gaps:
        worst = max(gaps)
        summary.append(f"default vs long: worst {100 * worst[0]:+.2f}% ({worst[1]}), median "
                       f"{100 * statistics.median(g for g, _ in gaps):+.2f}%, above 1%: "
                       f"{sum(g > 0.01 for g, _ in gaps)} of {len(gaps)}")
    summary.append(f"{time.perf_counter() - started:.0f} s in all; load average (1 minute) "
                   f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    for line in summary:
        console.print(line)
    return lines + [""] + summary


def cpu_timed(profile, cluster, specs, repeats: int):
    """Medians over ``repeats`` of the process CPU time (``time.process_time``: a busy,
    shared machine inflates the wall clock, not this) of building the Planner and of its
    search, in ms, the last result and its Planner."""
    setups, searches, result, planner = [], [], None, None
    for _ in range(repeats):
        started = time.process_time()
        planner = Planner(profile, cluster, specs)
        built = time.process_time()
        result = planner.search()
        searches.append(1000 * (time.process_time() - built))
        setups.append(1000 * (built - started))
    return statistics.median(setups), statistics.median(searches), result, planner


def small(args, console: Console) -> list[str]:
    """The ``small`` set (issue 66): the scale set's 10-tensor LSTM on its four clusters,
    top-k and every compressor, then 161 (ResNet-50) and 1,500 tensors (48-layer
    transformer, 8x8 V100 100G, top-k): Planner set-up and search in process CPU time,
    median of ``--repeats``; whether the plan was proven optimal, its evaluations, and
    the plan against each compressor on every tensor at every cap (never worse)."""
    started, load = time.perf_counter(), os.getloadavg()[0]
    headers = ["model", "tensors", "cluster", "allowed", "options", "set-up CPU ms",
               "search CPU ms", "evaluations", "proven", "plan ms", "best uniform ms"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    instances = [("LSTM", lstm_shapes(), 10.0, cluster, allowed, specs)
                 for cluster in clusters() for allowed, specs in (("top-k", ONE), ("all", None))]
    instances += [("ResNet-50-like", resnet50_shapes(), 150.0, v100(100.0), "top-k", ONE),
                  (*LARGE_MODEL, v100(100.0), "top-k", ONE)]
    for name, shapes, backward_ms, cluster, allowed, specs in instances:
        profile = synthetic_profile(shapes, world_size=8, nodes=1, backward_ms=backward_ms)
        setup_ms, search_ms, result, planner = cpu_timed(profile, cluster, specs, args.repeats)
        problem = result.problem
        uniform = min(problem.evaluate(problem.uniform(i), cap)
                      for i in range(len(planner.searchable)) for cap in
                      sorted({result.cap_mb, planner.profile.bucket_cap_mb}))
        cells = [name, str(len(shapes)), cluster.name, allowed, str(len(planner.searchable)),
                 f"{setup_ms:.1f}", f"{search_ms:.1f}", f"{result.evaluations:,}",
                 "yes" if result.exact else "no", f"{result.value:.4f}", f"{uniform:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
        console.print(" ".join(cells))
    summary = [f"{time.perf_counter() - started:.0f} s in all; process CPU time, median of "
               f"{args.repeats}; load average (1 minute) {load:.2f} at the start, "
               f"{os.getloadavg()[0]:.2f} at the end"]
    console.print(summary[0])
    return lines + [""] + summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("classic", "scale", "exact", "real", "small"),
                        default="classic")
    parser.add_argument("--exact-cap", type=float, default=10.0,
                        help="exact set: the exact search's time cap in seconds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-seconds", type=float, default=60.0,
                        help="annealing budget of the long search (0: none)")
    parser.add_argument("--long-evaluations", type=int, default=0,
                        help="scale set: the long search is --algorithm local with this many "
                        "evaluations and no margin (e.g. 40000) instead of --long-seconds")
    parser.add_argument("--clusters", nargs="*", help="only these clusters (scale and real sets), "
                        "e.g. '8x8 V100 25G'")
    parser.add_argument("--allowed", choices=("top-k", "all"), help="only this choice "
                        "of compressors (scale set)")
    parser.add_argument("--long-from", help="scale set: the long searches' results from this "
                        "earlier --markdown table instead of running them")
    parser.add_argument("--models", nargs="*", help="only these models (scale and real sets)")
    parser.add_argument("--objectives", nargs="*", choices=("time", "effective"),
                        help="only these objectives (real set)")
    parser.add_argument("--markdown", help="also write the table as markdown here")
    args = parser.parse_args()
    args.earlier = None
    console = Console(width=220)
    lines = {"scale": scale, "classic": classic, "exact": exact,
             "real": real, "small": small}[args.set](args, console)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
