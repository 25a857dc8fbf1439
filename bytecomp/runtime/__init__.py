"""The executor: a DDP communication hook that runs a plan."""

from bytecomp.runtime.executor import Executor, Stats, apply_plan

__all__ = ["Executor", "Stats", "apply_plan"]
