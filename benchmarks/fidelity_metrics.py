"""Which gradient-fidelity metric predicts the steps a compressor costs?

For each task, one process trains the workload with Adam (the convergence
bench's optimizer and learning rate, from the same initial weights) on fp32
gradients; at every step of a few windows each compressor (error feedback
carried from step to step, as in training) compresses every tensor's gradient,
and two gains are recorded per tensor:

* ``plain``: ``sqrt(1 - ||C(x) - x||^2 / ||x||^2)``, the profile's gain;
* ``adam``: the same on Adam's preconditioned coordinates, each divided by
  ``sqrt(v) + eps`` (Adam's second-moment estimate before the step), since
  Adam moves every coordinate by about its gradient over that scale: an error
  on a small coordinate costs as much as one on a large coordinate.

Gains compose over tensors weighted by parameters (``sqrt(sum share gain^2)``);
the hook rule (PowerSGD on matrices only) is composed too. With
``--measured summary.csv`` (``benchmarks/convergence.py``'s per-run table) each
strategy's measured steps to target beside its gains, and the Spearman rank
correlation of every metric with the steps (strategies that never reached the
target rank last).

    python benchmarks/fidelity_metrics.py --task digits \\
        --measured benchmarks/results/convergence/digits-2x1-1gbit/summary.csv
"""

from __future__ import annotations

import argparse
import math
import statistics
import zlib

import pandas as pd
import torch
from scipy.stats import spearmanr

from bytecomp.compress import ErrorFeedback, canonical, from_spec
from bytecomp.compress.local import roundtrip
from bytecomp.compress.lowrank import powersgd_compresses
from bytecomp.training.workloads import load_workload

CHARLM = "transformer:layers=2,width=128,heads=4,seq_len=64,vocab=256"
SPECS = ["fp16", "int8", "topk:ratio=0.01", "randomk:ratio=0.01", "dgc:ratio=0.01",
         "efsignsgd", "powersgd:rank=4", "acpsgd:rank=4"]
EPS = 1e-8


def gains(x: torch.Tensor, approx: torch.Tensor, scale: torch.Tensor | None) -> float:
    x, error = x.double(), (approx.double() - x.double())
    if scale is not None:
        x, error = x / scale, error / scale
    norm = float(x.pow(2).sum())
    return 1.0 if norm == 0 else math.sqrt(max(0.0, 1.0 - float(error.pow(2).sum()) / norm))


def measure(task: str, batch_size: int, windows: list[tuple[int, int]], lr: float, seed: int):
    """Per (window, metric, spec, tensor): the median gain over the window's steps."""
    workload = load_workload(task)
    model = workload.model
    batch_size = batch_size or workload.batch_size
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    compressors = {spec: from_spec(spec) for spec in SPECS}
    states = {(spec, n): {"salt": zlib.crc32(n.encode()), "shapes": [tuple(p.shape)]}
              for spec in SPECS for n, p in named}
    samples: dict[tuple, list[float]] = {}
    torch.manual_seed(seed)
    for step in range(1, windows[-1][1] + 1):
        inputs, target = workload.make_batch(batch_size)
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        loss = workload.loss(model(*inputs), target)
        loss.backward()
        window = next((w for w in windows if w[0] <= step <= w[1]), None)
        for spec, compressor in compressors.items():
            for name, param in named:
                flat = param.grad.reshape(-1)
                state = states[(spec, name)]
                residual = state.get("residual")
                x = flat + residual if isinstance(compressor, ErrorFeedback) and \
                    residual is not None else flat
                approx, _ = roundtrip(compressor, flat, state)
                if window is None:
                    continue
                adam = optimizer.state.get(param, {})
                scale = None
                if "exp_avg_sq" in adam:
                    steps = int(adam["step"])
                    v = adam["exp_avg_sq"].reshape(-1) / (1 - 0.999 ** steps)
                    scale = v.sqrt() + EPS
                samples.setdefault((window, "plain", spec, name), []).append(
                    gains(x, approx, None))
                if scale is not None:
                    samples.setdefault((window, "adam", spec, name), []).append(
                        gains(x, approx, scale))
        optimizer.step()
        optimizer.zero_grad()
    medians = {key: statistics.median(values) for key, values in samples.items()}
    return medians, {n: p.numel() for n, p in named}, {n: tuple(p.shape) for n, p in named}


def compose(medians, numel, shapes, window, metric) -> dict[str, float]:
    """Each strategy's params-weighted gain (the convergence summary's names)."""
    total = sum(numel.values())
    out = {}
    for spec in SPECS:
        def gain(name, spec=spec):
            return medians[(window, metric, spec, name)]
        out[f"{canonical(spec)} on every tensor"] = math.sqrt(
            sum(numel[n] / total * gain(n) ** 2 for n in numel))
        if spec.startswith("powersgd"):
            rank = from_spec(spec).values["rank"]
            out[f"PowerSGD hook (rank {rank})"] = math.sqrt(sum(
                numel[n] / total * (gain(n) ** 2 if powersgd_compresses(shapes[n], rank) else 1)
                for n in numel))
    out["fp32 DDP"] = 1.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=CHARLM)
    parser.add_argument("--batch-size", type=int, default=0, help="default: the workload's")
    parser.add_argument("--windows", default="3-12,100-109,250-259",
                        help="step ranges measured, e.g. 3-12,100-109")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measured", help="a convergence summary.csv to compare with")
    args = parser.parse_args()
    windows = [tuple(int(v) for v in part.split("-")) for part in args.windows.split(",")]
    medians, numel, shapes = measure(args.task, args.batch_size, windows, args.lr, args.seed)
    table = pd.DataFrame({f"{metric} {w[0]}-{w[1]}": compose(medians, numel, shapes, w, metric)
                          for w in windows for metric in ("plain", "adam")
                          if (w, metric, SPECS[0], next(iter(numel))) in medians})
    if args.measured:
        measured = pd.read_csv(args.measured).set_index("strategy")
        steps = measured.steps_to_target / measured.steps_to_target.loc["fp32 DDP"]
        table.insert(0, "steps vs fp32", steps.reindex(table.index))
        table.insert(1, "profile's gain", measured.predicted_fidelity.reindex(table.index))
    print(f"{args.task}: params-weighted gains, Adam lr {args.lr}")
    print(table.round(3).to_string())
    if args.measured:
        reached = table["steps vs fp32"].fillna(math.inf)
        for column in table.columns[1:]:
            rho = spearmanr(-table[column].fillna(0), reached).statistic
            print(f"Spearman of -({column}) with steps: {rho:.2f}")


if __name__ == "__main__":
    main()
