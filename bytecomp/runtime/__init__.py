"""The executor: a DDP communication hook that runs a plan.

In three parts: :mod:`~bytecomp.runtime.native` (which of PyTorch's own hooks a plan
is, and running it so), :mod:`~bytecomp.runtime.adaptive` (an adaptive plan's
agreement between the ranks and its moves between levels) and
:mod:`~bytecomp.runtime.executor` (bytecomp's hook: groups, launches, futures, state);
:mod:`~bytecomp.runtime.apply` checks a plan and picks which runs it;
:mod:`~bytecomp.runtime.hook` does the same at the first bucket, for a hook registered
by someone else (``comm_hook``).
Importing it loads torch, yaml and the plan format, never the profiler, the
models, the simulator or the search, so a training job stays light.
"""

from bytecomp.runtime.apply import apply_plan
from bytecomp.runtime.executor import Executor
from bytecomp.runtime.hook import PlanHook, comm_hook
from bytecomp.runtime.native import NativeRun
from bytecomp.runtime.state import Stats

__all__ = ["Executor", "NativeRun", "PlanHook", "Stats", "apply_plan", "comm_hook"]
