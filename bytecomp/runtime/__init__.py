"""The executor: a DDP communication hook that runs a plan.

Importing it loads torch, yaml and the plan format, never the profiler, the
models, the simulator or the search, so a training job stays light.
"""

from bytecomp.runtime.executor import Executor, apply_plan
from bytecomp.runtime.state import Stats

__all__ = ["Executor", "Stats", "apply_plan"]
