"""Search time and plan quality on synthetic profiles.

Models: 10 tensors (a 5-layer MLP), 161 (ResNet-50's parameters) and 1,500
(a 48-layer transformer), profiled synthetically on 2 nodes x 4 GPUs (GPU-like
compression speeds, host offload available) with 10 Gbit/s and 1 Gbit/s
links. For each: one compressor allowed (topk; the fp16 and PowerSGD hooks'
methods stay candidates, as by default) and every compressor allowed. Search
time is the median of ``--repeats`` runs of ``Planner.search`` (baselines,
greedy, local search, bound). Targets: under 100 ms at 161 tensors and under
2 s at 1,500 with one compressor; the plan never predicted slower than any
baseline; the gap to the lower bound reported.

    python benchmarks/search.py [--repeats 3] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import statistics

from rich.console import Console
from rich.table import Table

from bytecomp.search import Planner
from bytecomp.testing.synthetic import (
    mlp_shapes,
    resnet50_shapes,
    synthetic_profile,
    transformer_shapes,
)

MODELS = [("MLP", mlp_shapes(5, 1024)), ("ResNet-50-like", resnet50_shapes()),
          ("48-layer transformer", transformer_shapes())]


def run(shapes, bandwidth: float, specs, repeats: int) -> dict:
    profile = synthetic_profile(shapes, world_size=8, nodes=2, bandwidth_gbps=bandwidth)
    times, result = [], None
    for _ in range(repeats):
        planner = Planner(profile, None, specs)
        result = planner.search()
        times.append(result.search_ms)
    fp32 = next(b for b in result.baselines if b.name == "fp32 DDP")
    best = min(result.baselines, key=lambda b: b.time_ms)
    return {"tensors": len(shapes), "options": len(planner.searchable),
            "search_ms": statistics.median(times), "algorithm": result.algorithm,
            "plan_ms": result.time_ms, "fp32_ms": fp32.time_ms, "best_baseline": best.name,
            "best_baseline_ms": best.time_ms, "lower_bound_ms": result.lower_bound_ms,
            "gap": result.gap,
            "never_slower": all(result.time_ms <= b.time_ms + 1e-9 for b in result.baselines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", help="also write the table as markdown here")
    args = parser.parse_args()
    headers = ["model", "tensors", "link", "allowed", "options", "search ms", "algorithm",
               "plan ms", "fp32 DDP ms", "best baseline", "lower bound ms", "gap",
               "<= every baseline"]
    table = Table(title=f"search on synthetic profiles (2 nodes x 4 GPUs), median of "
                        f"{args.repeats}")
    for header in headers:
        table.add_column(header, justify="left" if header in ("model", "allowed", "algorithm",
                                                               "best baseline", "link") else "right")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for bandwidth in (10.0, 1.0):
        for name, shapes in MODELS:
            for allowed, specs in (("topk", ["topk:ratio=0.01"]), ("all", None)):
                row = run(shapes, bandwidth, specs, args.repeats)
                cells = [name, str(row["tensors"]), f"{bandwidth:g} Gbit/s", allowed,
                         str(row["options"]), f"{row['search_ms']:.0f}", row["algorithm"],
                         f"{row['plan_ms']:.2f}", f"{row['fp32_ms']:.2f}",
                         f"{row['best_baseline']} ({row['best_baseline_ms']:.2f})",
                         f"{row['lower_bound_ms']:.2f}", f"{100 * row['gap']:.1f}%",
                         "yes" if row["never_slower"] else "NO"]
                table.add_row(*cells)
                lines.append("| " + " | ".join(cells) + " |")
    Console(width=200).print(table)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
