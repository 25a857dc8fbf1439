"""The convergence probe: how many more steps each compressor costs, measured.

A compressor's gain (:mod:`bytecomp.profile.fidelity`) says how much of one
step's gradient it keeps; it does not say how many steps training then needs.
Measured on a character-level transformer and a digits convnet (docs/benchmarks.md, time
to accuracy), PowerSGD kept 0.71 of the gradient and needed 1.2x fp32's steps
on one, and kept 0.89 and needed 1.4-1.6x on the other; int8 kept 0.9997 and
needed 1.05x. So the profile also trains: fp32 DDP and every compressor on
every tensor, from the same initial weights on the same batches (Adam, the
optimizer ``bytecomp bench --train-steps`` uses), ``steps`` steps each,
interleaved, with the validation loss every ``eval_every`` steps.

A compressor's *steps factor* is read off the two curves: at each evaluation
in the second half of the probe, the steps it took over the steps fp32 DDP
took to reach the same validation loss (linear between evaluations); the
median of those. 1 means no slower than fp32; a compressor that has not
learnt what fp32 had after its first evaluation gets ``MAX_FACTOR``. It needs
a workload with real data (validation batches); workloads with generated
inputs have no probe.

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

from bytecomp.profile.convergence import (
    ConvergenceConfig,
    steps_to,
    train_curves,
    training_optimizer,
)

COLUMNS = ["spec", "steps_factor", "steps", "gain"]
MAX_FACTOR = 10.0  # "it does not learn": beyond any step budget worth planning for


@dataclass
class Trainee:
    """One strategy under probe: a DDP model, its optimizer and executor (None: DDP's own
    allreduce)."""

    name: str
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    executor: Any = None  # a bytecomp.runtime.Executor (not imported here: see run_probe)


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
              progress=None) -> list[dict]:
    """Train fp32 DDP and each of ``specs`` on every tensor (every rank); one row per spec
    (empty without validation data)."""
    import copy

    from bytecomp.compress import from_spec
    from bytecomp.plan import Option, plan_for_model
    from bytecomp.runtime import apply_plan

    validation = workload.validation(batch_size)
    if validation is None or not specs:
        return []
    make_optimizer = training_optimizer(1e-3)
    device_ids = [device.index] if device.type == "cuda" else None

    def trainee(name: str, plan=None) -> Trainee:
        model = copy.deepcopy(workload.model).to(device)
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
        executor = apply_plan(ddp, plan, measure_gain=True) if plan is not None else None
        return Trainee(name, ddp, make_optimizer(model.parameters()), executor)

    trainees = [trainee("fp32")]
    for spec in specs:
        final = from_spec(spec).collectives_of_rounds()[-1]
        option = Option(spec, "device", "allreduce" if final == "allreduce" else "allgather")
        plan = plan_for_model(workload.model, lambda n, p, option=option: option, world, nodes,
                              bucket_cap_mb)
        trainees.append(trainee(spec, plan))
    config = ConvergenceConfig(steps, min(eval_every, steps))
    training = train_curves(trainees, workload, batch_size, device, config, validation, progress)
    for each in trainees:
        if each.executor is not None:
            each.executor.close()
    reference = training.curves["fp32"]
    gains = probe_gains(training.gains, specs, steps / 2)
    return [{"spec": spec, "steps": steps,
             "steps_factor": round(steps_factor(training.curves[spec], reference, steps / 2), 4),
             "gain": round(gain, 6)}
            for spec, gain in zip(specs, gains)]


def probe_gains(gains: dict[str, list[tuple[int, float]]], specs: list[str],
                from_step: float) -> list[float]:
    """Each spec's gain over the steps from ``from_step``: ``sqrt`` of the mean squared gain
    over those steps and every rank (collective: every rank calls it)."""
    squares = torch.tensor([statistics.fmean([g * g for s, g in gains.get(spec, [])
                                              if s >= from_step and math.isfinite(g)] or [1.0])
                            for spec in specs], dtype=torch.float64)
    dist.all_reduce(squares)
    return [min(1.0, math.sqrt(max(0.0, float(v) / dist.get_world_size()))) for v in squares]
