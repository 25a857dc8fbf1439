"""``bytecomp bench``'s ranks: measured iteration times of a plan and the baselines, and
the model's prediction error; with a ConvergenceConfig, their time to a target validation
loss (the command's orchestration is :mod:`bytecomp.commands.bench`).

>>> from bytecomp.bencher import BenchConfig
>>> from bytecomp.commands.bench import run_bench
>>> run_bench(BenchConfig(profile="profiles/cnn", plan="plan.yaml", out="bench"), nproc=2)
"""

from __future__ import annotations

from bytecomp.bencher.runner import BenchConfig
from bytecomp.training.convergence import ConvergenceConfig

__all__ = ["BenchConfig", "ConvergenceConfig"]
