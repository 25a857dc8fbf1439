"""The convergence probe: how many more steps each compressor costs, measured.

A compressor's gain (:mod:`bytecomp.profiler.fidelity`) says how much of one
step's gradient it keeps; it does not say how many steps training then needs.
Measured on a character-level transformer and a digits convnet (docs/benchmarks.md, time
to accuracy), PowerSGD kept 0.71 of the gradient and needed 1.2x fp32's steps
on one, and kept 0.89 and needed 1.4-1.6x on the other; int8 kept 0.9997 and
needed 1.05x. So the profile also trains: fp32 DDP and every compressor on
every tensor, from the same initial weights on the same batches, with the
workload's own recipe (its optimizer, its loss), ``steps`` steps each,
interleaved, with the loss on fixed evidence batches every ``eval_every`` steps:
the workload's validation batches, or held-out batches of its ``make_batch``
(:meth:`~bytecomp.training.workloads.Workload.evidence_batches`).

A compressor's *steps factor* is read off the two curves: at each evaluation
in the second half of the probe, the steps it took over the steps fp32 DDP
took to reach the same validation loss (linear between evaluations); the
median of those. 1 means no slower than fp32; a compressor that has not
learnt what fp32 had after its first evaluation gets ``MAX_FACTOR``. A probe
whose fp32 loss fell by less than ``MIN_IMPROVEMENT`` (random data a model cannot
learn, or too few steps) is no evidence: it records no factors, and says so.

Beside it, the probe records each compressor's *gain* over the same steps (the
second half), as the executor measures it while training (error feedback
running, every rank's, parameter-weighted: ``sqrt`` of the mean squared gain
over steps and ranks). The profile's fidelity table measures gains in a few
iterations at the start of training; on the transformer they fall as training
goes (PowerSGD rank 4: 0.71 in steps 3-12, 0.51 by step 100), so an adaptive
plan's controller, which compares the gain it measures with the level's, takes
the probe's as the gain that goes with the steps factor.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bytecomp.errors import BytecompError
from bytecomp.schema import MAX_STEPS_FACTOR as MAX_FACTOR  # "it does not learn"
from bytecomp.training.convergence import (
    ConvergenceConfig,
    improvement,
    steps_to,
    train_curves,
)

COLUMNS = ["spec", "steps_factor", "steps", "gain"]
MIN_IMPROVEMENT = 0.01  # fp32's loss must fall by this fraction for the probe to tell anything
# a budgeted probe stops once its factors have settled: fp32 DDP's loss fell by at most
# this over the last quarter of its steps, from SETTLED_LEAST steps on (the finalists'
# rule, bytecomp.search.verify): a budget is a cap, not a target
SETTLED_FALL = 0.03
SETTLED_LEAST = 30


@dataclass
class ProbeResult:
    """The probe's rows (one per spec; none when it told nothing), what it measured on,
    and how much fp32 DDP's loss fell over it (a fraction of its first loss)."""

    rows: list[dict]
    batches: str  # "validation" or "held-out training batches"
    improvement: float
    steps: int = 0  # trained
    planned: int = 0  # what its budget afforded (or the count it was given)
    stopped_by_budget: bool = False
    seconds: float = 0.0
    settled: bool = False  # it stopped early: fp32's loss had flattened

    @property
    def informative(self) -> bool:
        return self.improvement >= MIN_IMPROVEMENT


def check_reference(curve: list[tuple[int, float]], where: str) -> None:
    """fp32 DDP's validation curve is what every factor is read against: one that is not
    finite everywhere measures nothing, so it is an error, not a factor of 10."""
    bad = [step for step, loss in curve if not math.isfinite(loss)]
    if bad:
        raise BytecompError(f"in {where}, fp32 DDP's validation loss is not finite (at step "
                            f"{bad[0]}): the recipe diverges or its validation batches are "
                            f"broken, so no steps factor can be read")


@dataclass
class Trainee:
    """One strategy under probe: a DDP model, its optimizer and executor (None: DDP's own
    allreduce)."""

    name: str
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    executor: Any = None  # a bytecomp.runtime.Executor (not imported here: see run_probe)
    scheduler: Any = None  # the recipe's learning-rate scheduler, stepped after the optimizer

    @classmethod
    def of(cls, name: str, ddp: DistributedDataParallel, workload, executor=None) -> Trainee:
        """A trainee with the workload's recipe: its optimizer and scheduler over ``ddp``'s
        parameters."""
        optimizer = workload.make_optimizer(ddp.module.parameters())
        return cls(name, ddp, optimizer, executor, workload.make_scheduler(optimizer))


def steps_factor(curve: list[tuple[int, float]], reference: list[tuple[int, float]],
                 from_step: float) -> float:
    """Median over ``curve``'s evaluations at ``from_step`` and later of its step over the
    step at which ``reference`` reached the same loss."""
    ratios = []
    last = reference[-1][0]
    for step, loss in curve:
        if step < from_step or step <= 0:
            continue
        if not loss < float("inf"):
            ratios.append(MAX_FACTOR)
            continue
        reached = steps_to(reference, loss)
        if reached is None:  # better than the reference ever got: at least as fast
            ratios.append(min(1.0, step / last))
        else:
            ratios.append(MAX_FACTOR if reached <= 0 else min(MAX_FACTOR, step / reached))
    return statistics.median(ratios) if ratios else MAX_FACTOR


def run_probe(workload, device: torch.device, batch_size: int, bucket_cap_mb: float,
              specs: list[str], steps: int, eval_every: int, world: int, nodes: int,
              progress=None, budget=None) -> ProbeResult:
    """Train fp32 DDP and each of ``specs`` on every tensor (every rank) with the
    workload's recipe; one row per spec, none when fp32 did not learn. With ``budget``
    (a :class:`bytecomp.training.convergence.Budget`), ``steps`` is the most it trains
    and the clock decides."""
    import copy

    from bytecomp.comm.schemes import native_scheme
    from bytecomp.compress import from_spec
    from bytecomp.plan_file import plan_for_model
    from bytecomp.plan_types import Option
    from bytecomp.runtime import apply_plan

    evidence, batches = workload.evidence_batches(batch_size)
    device_ids = [device.index] if device.type == "cuda" else None

    def trainee(name: str, plan=None) -> Trainee:
        model = copy.deepcopy(workload.model).to(device)
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
        executor = apply_plan(ddp, plan, measure_gain=True) if plan is not None else None
        return Trainee.of(name, ddp, workload, executor)

    trainees = [trainee("fp32")]
    for spec in specs:
        option = Option(spec, "device", native_scheme(from_spec(spec)))
        plan = plan_for_model(workload.model, lambda n, p, option=option: option, world, nodes,
                              bucket_cap_mb)
        trainees.append(trainee(spec, plan))
    settle = budget is not None  # a forced count trains its count
    config = ConvergenceConfig(steps, min(eval_every, steps), budget=budget,
                               flat_fall=SETTLED_FALL if settle else None,
                               flat_least=min(SETTLED_LEAST, steps))
    training = train_curves(trainees, workload, batch_size, device, config, evidence, progress)
    steps = training.steps
    for each in trainees:
        if each.executor is not None:
            each.executor.close()
    reference = training.curves["fp32"]
    check_reference(reference, "the convergence probe")
    gains = probe_gains(training.gains, specs, steps / 2)
    fell = improvement(reference)
    from bytecomp.training.factors import reference_factor  # within fp32's loss noise floor

    rows = [{"spec": spec, "steps": steps,
             "steps_factor": round(max(1 / MAX_FACTOR, reference_factor(
                 training.curves[spec], reference, steps / 2, MAX_FACTOR).value), 4),
             "gain": round(gain, 6)}
            for spec, gain in zip(specs, gains)] if fell >= MIN_IMPROVEMENT else []
    return ProbeResult(rows, batches, round(fell, 6), steps, training.planned,
                       training.stopped_by_budget, training.seconds, training.stopped_flat)


def probe_gains(gains: dict[str, list[tuple[int, float]]], specs: list[str],
                from_step: float) -> list[float]:
    """Each spec's gain over the steps from ``from_step``: ``sqrt`` of the mean squared gain
    over those steps and every rank (collective: every rank calls it)."""
    squares = torch.tensor([statistics.fmean([g * g for s, g in gains.get(spec, [])
                                              if s >= from_step and math.isfinite(g)] or [1.0])
                            for spec in specs], dtype=torch.float64)
    dist.all_reduce(squares)
    return [min(1.0, math.sqrt(max(0.0, float(v) / dist.get_world_size()))) for v in squares]
