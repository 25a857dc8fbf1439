"""What the recipes share: the model a plan is made for, a learnable task, the options.

The model is bytecomp's built-in ``mlp:inputs=64,width=256,depth=3``, so a plan for it
comes from the README's three steps::

    bytecomp profile --model mlp:inputs=64,width=256,depth=3 --nproc 2 --quick --out profiles/mlp64
    bytecomp plan profiles/mlp64 --cluster my-cluster.yaml --out plan.yaml

The task needs no download: a fixed random teacher labels Gaussian inputs; each rank
draws step ``s``'s batch from a generator seeded by (rank, s).
"""

from __future__ import annotations

import argparse
import json

import torch

from bytecomp.training.workloads import load_workload

MODEL = "mlp:inputs=64,width=256,depth=3"
INPUTS, CLASSES = 64, 10


def parser(description: str, plan_required: bool = True) -> argparse.ArgumentParser:
    """The options every recipe takes (a recipe adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--plan", required=plan_required, help="a plan for " + MODEL)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=64)
    return parser


def options(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The options, range-checked (a bad one: one line and exit 2)."""
    args = parser.parse_args()
    if not 1 <= args.steps <= 10**6 or not 0 < args.lr <= 10 or not 1 <= args.batch_size <= 4096:
        parser.error("--steps must be 1..1e6, --lr in (0, 10], --batch-size 1..4096")
    return args


def model() -> torch.nn.Module:
    """The model, with the same weights on every rank (seeded)."""
    return load_workload(MODEL, seed=0).model


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch on ``rank``: inputs and the teacher's labels."""
    teacher = torch.Generator().manual_seed(12345)
    weights = torch.randn(INPUTS, CLASSES, generator=teacher)
    draw = torch.Generator().manual_seed(1_000_003 * rank + step)
    inputs = torch.randn(size, INPUTS, generator=draw)
    return inputs, (inputs @ weights).argmax(dim=1)


def report(recipe: str, losses: list[float], runner) -> None:
    """One JSON line: the recipe, its first and last losses, what the plan sent."""
    summary = runner.stats.summary()
    print(json.dumps({"recipe": recipe, "steps": summary["steps"],
                      "first_loss": losses[0], "last_loss": losses[-1],
                      "bytes_vs_fp32": summary["bytes_vs_fp32"],
                      "runs_as": type(getattr(runner, "runner", runner)).__name__,
                      "phase": getattr(runner, "phase", None)}), flush=True)
