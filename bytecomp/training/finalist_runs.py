"""Training finalists on the profiled ranks: what ``bytecomp plan`` measures before it
chooses (:mod:`bytecomp.search.finalists`).

Every finalist is a plan file; every rank builds the workload with its recipe (the
profile's model, optimizer and batch size), wraps one copy of the model per
finalist in DDP at the plan's bucket cap, applies the plan (PyTorch's own hook where
the plan is one), and trains them all from the same initial weights on the same
batches, interleaved step by step (:func:`bytecomp.training.convergence.train_curves`),
with the loss on the evidence batches (validation, or held-out batches of
``make_batch``) at :data:`EVALUATIONS` points. A finalist's steps factor compares the
two curves at the same losses (:func:`matched_factor`): for each loss fp32 DDP
reached in the second half of the run, the steps the finalist took to first reach it
over the steps fp32 DDP took, each loss counted as reached within fp32's loss noise
floor (:mod:`bytecomp.training.factors`); the median (fp32 DDP's own is 1 exactly,
however noisy its curve), with its bounds within the floor beside it (a finalist
inside the floor gets a factor near 1 and a range, not the cap). The factor over the
first half of the run is kept beside it, and how much
fp32's loss still fell over the last quarter, so that the plan can say whether the
run saw a plateau. A budgeted run may stop once it has (``flat_fall``), and the
results say why it stopped. Rank 0 writes the results as JSON.
"""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bytecomp.files import write_text_atomic
from bytecomp.launch import pick_device
from bytecomp.plan_file import load_plan
from bytecomp.plan_record import STOPPED_BUDGET, STOPPED_FLAT, STOPPED_STEPS
from bytecomp.training.convergence import (
    Budget,
    ConvergenceConfig,
    improvement,
    last_quarter,
    train_curves,
)
from bytecomp.training.factors import Factor, floored_factor, loss_floor
from bytecomp.training.probe import MAX_FACTOR, Trainee, check_reference
from bytecomp.training.workloads import load_workload
from bytecomp.ui import Reporter

EVALUATIONS = 10
# a budgeted run that stops once fp32's loss has flattened evaluates twice as often: the
# last quarter holds two evaluations from the fourth on, and the stop can come at a fifth
# of the steps the budget affords rather than at two fifths
FLAT_EVALUATIONS = 20
REFERENCE = "fp32 DDP"  # the finalist every factor is measured against


@dataclass
class FinalistsJob:
    """What every rank trains: the profile's workload and recipe, one plan file per
    finalist (``names``, in order; one of them is :data:`REFERENCE`), how long, and
    where every rank writes the results."""

    model: str
    optimizer: str | None
    batch_size: int
    device: str
    plans: list[str]
    names: list[str]
    steps: int  # with a budget: the most it trains
    out: str
    eval_every: int = field(default=0)
    budget_s: float | None = None  # train for this long (wall clock), not ``steps``
    started: float = 0.0  # when the budget began (time.time() of the process that set it)
    # with a budget: stop once fp32 DDP's loss fell by at most this over the last quarter
    # (and by more in all), from step flat_least on (ConvergenceConfig)
    flat_fall: float | None = None
    flat_least: int = 0
    scheduler: str | None = None  # the profile's schedule spec (None: the recipe's own)

    def __post_init__(self) -> None:
        if not self.eval_every:
            self.eval_every = max(1, self.steps // EVALUATIONS)


def train_finalists(job: FinalistsJob, nodes: int, ranks_per_node: int) -> None:
    """On every rank (``bytecomp.launch.run_job``'s target): train the finalists; every
    rank writes ``job.out`` (see :func:`results`)."""
    rank = dist.get_rank()
    device = pick_device(job.device, rank % ranks_per_node)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    from bytecomp.runtime import apply_plan  # the profiler alone may run the executor

    reporter = Reporter(enabled=rank == 0)
    with reporter.session():
        building = reporter.phase("building the finalists", len(job.plans))
        workload = load_workload(job.model, optimizer=job.optimizer, scheduler=job.scheduler)
        evidence, batches = workload.evidence_batches(job.batch_size)
        device_ids = [device.index] if device.type == "cuda" else None
        trainees = []
        for name, path in zip(job.names, job.plans):
            plan = load_plan(path)
            model = copy.deepcopy(workload.model).to(device)
            ddp = DistributedDataParallel(model, device_ids=device_ids,
                                          bucket_cap_mb=plan.bucket_cap_mb)
            trainees.append(Trainee.of(name, ddp, workload, apply_plan(ddp, plan)))
            building()
        stops_flat = job.budget_s is not None and job.flat_fall is not None
        budget = Budget(job.budget_s, job.started, job.steps,
                        evaluations=FLAT_EVALUATIONS if stops_flat else EVALUATIONS) \
            if job.budget_s is not None else None
        config = ConvergenceConfig(job.steps, min(job.eval_every, job.steps), budget=budget,
                                   flat_fall=job.flat_fall if stops_flat else None,
                                   flat_least=job.flat_least)
        progress = reporter.phase(f"training {len(trainees)} finalists", job.steps,
                                  most=budget is not None)
        training = train_curves(trainees, workload, job.batch_size, device, config, evidence,
                                progress)
    for trainee in trainees:
        trainee.executor.close()
    # Every rank writes the results, the same on all (the losses and step times are
    # agreed by collectives): under torchrun or bytecomp emulate each rank's plan made
    # job.out in a temporary folder of its own and reads it back; spawned ranks share
    # one, which the atomic write leaves whole.
    out = results(training.curves, training.step_ms, training.steps, batches)
    out.update(planned=training.planned, stopped_by_budget=training.stopped_by_budget,
               stopped_by=stopped_by(training), training_seconds=round(training.seconds, 3))
    write_text_atomic(job.out, json.dumps(out))


def stopped_by(training) -> str:
    """Why the training stopped: fp32 DDP's loss flattened, the clock (before the steps it
    planned), or it trained every step it planned (a forced count, or all that the budget
    afforded)."""
    if training.stopped_flat:
        return STOPPED_FLAT
    return STOPPED_BUDGET if training.stopped_by_budget else STOPPED_STEPS


def results(curves: dict[str, list[tuple[int, float]]], step_ms: dict[str, list[float]],
            steps: int, batches: str) -> dict:
    """Per finalist: its curve, its median step (ms, on the profiled ranks), its steps
    factor over the second half of the run, with its bounds within fp32's loss noise
    floor (``steps_factor_low``, ``steps_factor_high``), and over the second quarter
    (the first half's second half), against :data:`REFERENCE`; and how much the
    reference's loss fell in all and over the last quarter, and its floor over the
    second half (``loss_floor``, in the loss's units)."""
    reference = curves[REFERENCE]
    check_reference(reference, "the finalists' training")
    finalists: dict[str, dict] = {}
    floor = loss_floor(reference, steps / 2)
    out = {"steps": steps, "batches": batches, "fp32_improvement": improvement(reference),
           "fp32_last_quarter": last_quarter(reference, steps), "loss_floor": floor,
           "finalists": finalists}
    reference_half = [(s, loss) for s, loss in reference if s <= steps / 2]
    half_floor = loss_floor(reference_half, steps / 4)
    for name, curve in curves.items():
        half = [(s, loss) for s, loss in curve if s <= steps / 2]
        finite = [ms for ms in step_ms[name] if ms == ms]
        factor = Factor(1.0, 1.0, 1.0) if name == REFERENCE else \
            floored_factor(curve, reference, steps / 2, floor, MAX_FACTOR)
        finalists[name] = {
            "curve": [[s, loss] for s, loss in curve],
            "step_ms": statistics.median(finite) if finite else None,
            "steps_factor": factor.value, "steps_factor_low": factor.low,
            "steps_factor_high": factor.high,
            "steps_factor_half": 1.0 if name == REFERENCE else
            matched_factor(half, reference_half, steps / 4, half_floor)
            if len(half) > 1 else None}
    return out


def matched_factor(curve: list[tuple[int, float]], reference: list[tuple[int, float]],
                   from_step: float, floor: float = 0.0) -> float:
    """The median, over the losses ``reference`` reached at its evaluations from
    ``from_step`` on, of the steps ``curve`` took to first reach each over the steps
    ``reference`` took, both within ``floor`` of it (``MAX_FACTOR`` where it never
    did): :func:`bytecomp.training.factors.floored_factor`'s value."""
    return floored_factor(curve, reference, from_step, floor, MAX_FACTOR).value


def load_results(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
