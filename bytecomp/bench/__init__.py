"""``bytecomp bench``: measured iteration times of a plan and the baselines, and the
model's prediction error; with a ConvergenceConfig, their time to a target validation
loss.

>>> run_bench(BenchConfig(profile="profiles/cnn", plan="plan.yaml", out="bench"), nproc=2)
"""

from __future__ import annotations

from pathlib import Path

import torch

from bytecomp.bench.runner import BenchConfig, bench_rank
from bytecomp.files import check_new_directory
from bytecomp.launch import run_job
from bytecomp.plan import load_plan
from bytecomp.profile.convergence import ConvergenceConfig
from bytecomp.profile.store import load_profile


def _rank(config: BenchConfig, nodes: int, ranks_per_node: int) -> None:
    bench_rank(config)


def run_bench(config: BenchConfig, nproc: int | None = None, timeout_s: float = 600) -> Path:
    """Benchmark on ``nproc`` spawned ranks or on this torchrun (or emulate) job."""
    load_profile(config.profile)  # bad files fail here, once, before any rank starts
    for plan in [config.plan, *config.other_plans]:
        load_plan(plan)
    out = check_new_directory(config.out, config.force)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    run_job(_rank, (config,), nproc, backend, timeout_s)
    return out


__all__ = ["BenchConfig", "ConvergenceConfig", "run_bench"]
