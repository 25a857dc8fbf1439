"""How ``bytecomp profile --budget`` is shared out between the profile's stages.

Each stage that measures the cluster gets at most a fixed share of the budget
(:data:`SHARES`): the sweeps and the executor's fixed costs together at most
:data:`CLUSTER_SHARE`, the training iterations and the gradient fidelity their own
shares; the convergence probe takes what is left, at least :data:`PROBE_SHARE` when
the others keep theirs. A stage's allowance is its share of the budget, whatever the
stages before it took: what they leave goes to the probe, which stops once its
factors have settled, so the budget is a cap, not a target. The sweeps and the
executor's rounds are sized to their allowance (:mod:`bytecomp.profiler.sweeps`);
the training iterations and the fidelity steps are counts (``--iterations``,
``--fidelity-iterations``), and a stage that overran its allowance says so in one
line naming the option that gives it more (:func:`overrun`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# of the budget, the most each stage may take
SHARES = {
    "training iterations": 0.10,
    "collective sweeps": 0.20,
    "compressor sweeps": 0.08,
    "aggregation sweeps": 0.04,
    "copy sweeps": 0.01,
    "executor fixed costs": 0.07,
    "gradient fidelity": 0.10,
}
CLUSTER_STAGES = ("collective sweeps", "compressor sweeps", "aggregation sweeps",
                  "copy sweeps", "executor fixed costs")
CLUSTER_SHARE = sum(SHARES[stage] for stage in CLUSTER_STAGES)  # 0.40
PROBE_SHARE = 1.0 - sum(SHARES.values())  # 0.40: what the others leave, at least
# the option that gives each stage more time than its share, beside --budget
MORE = {
    "training iterations": "fewer --iterations shorten it",
    "gradient fidelity": "fewer --fidelity-iterations shorten it",
}
OVERRUN = 1.2  # a stage this far past its allowance says so


def describe_split(budget_s: float, left_s: float | None = None) -> str:
    """The opening line's account of the split of what start-up left (``left_s``,
    default the whole budget)."""
    left = budget_s if left_s is None else left_s
    whole = "of it" if left_s is None else f"of the {left:.0f} s start-up left"
    return (f"{whole}, the sweeps and executor costs take at most "
            f"{100 * CLUSTER_SHARE:.0f}%, the training iterations and gradient fidelity "
            f"{100 * SHARES['training iterations']:.0f}% each, the probe the rest (at least "
            f"{100 * PROBE_SHARE:.0f}%)")


@dataclass(frozen=True)
class Allowance:
    """A stage's time: ``seconds`` from ``started`` (``time.time()``, every rank's own)."""

    seconds: float
    started: float

    @classmethod
    def of(cls, stage: str, budget_s: float | None, scale: float = 1.0) -> Allowance | None:
        """The allowance of ``stage`` from now (None without a budget); ``scale``
        stretches the shares (``--calibrate-only``: the cluster's stages are the whole
        job)."""
        if budget_s is None:
            return None
        return cls(SHARES[stage] * scale * budget_s, time.time())

    @property
    def deadline(self) -> float:
        return self.started + self.seconds

    def left(self) -> float:
        return self.deadline - time.time()


def agreed(flag: bool) -> bool:
    """Whether any rank says ``flag`` (collective: every rank calls it; one tiny
    allreduce), so that every rank takes the same branch."""
    if not dist.is_initialized():
        return flag
    value = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def overrun(stage: str, spent_s: float, allowed_s: float) -> str | None:
    """The line for a stage that took more than :data:`OVERRUN` times its allowance."""
    if spent_s <= OVERRUN * allowed_s:
        return None
    more = MORE.get(stage)
    return (f"{stage} took {spent_s:.0f} s of the {allowed_s:.0f} s its share of --budget "
            f"allows: a larger --budget gives it more" + (f"; {more}" if more else ""))
