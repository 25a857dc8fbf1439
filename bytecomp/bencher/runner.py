"""``bytecomp bench``: measure a plan and the baselines for real, beside the model's
predictions.

On every rank of the job (spawned, under torchrun, or under ``bytecomp
emulate``), one copy of the profiled workload per strategy, with the same
initial weights:

* fp32 DDP (DDP's built-in allreduce);
* PyTorch's ``fp16_compress_hook``;
* PyTorch's ``powerSGD_hook`` (the profile's PowerSGD rank, error feedback and
  warm start, compressing from the second iteration);
* one compressor on every tensor (bytecomp's executor);
* the bytecomp plan (bytecomp's executor), and any further plans (named
  ``bytecomp plan: <file name>``); an adaptive plan's levels are timed one by
  one as static plans (``... level 2 (topk:ratio=0.025)``), since the plan
  itself moves between them;
* compute only: DDP with communication off (``no_sync``), the reference for
  how fast this machine computes now;
* in training, with ``ConvergenceConfig.reference_seed``: fp32 DDP again, on a second
  data order (``fp32 DDP, data seed S``): how far two equally good runs end apart.

Iterations are interleaved round-robin (every other round reversed) after a
warm-up; an iteration's time is the slowest rank's, after a barrier. The
prediction of each strategy comes from the same models ``bytecomp plan`` uses.

A shared machine's speed drifts between the profile and the bench (the CI
machine's own compute drifts by 20-40% over minutes), so a second prediction
is given too: the same models with every compute time of the profile (forward,
backward and ready times, optimizer, compression) scaled by the measured drift
(compute-only iteration now / in the profile); communication is left as
profiled. Both errors are reported.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.bencher.link_probe import clock, link_warning
from bytecomp.bencher.report import (
    COMPUTE_ONLY,
    convergence_table,
    plot_curves,
    results_table,
    time_to_accuracy,
    write_training,
)
from bytecomp.compress import canonical, from_spec
from bytecomp.costs.clusters import load_cluster
from bytecomp.errors import BytecompError
from bytecomp.files import directory_atomic
from bytecomp.model_spec import allowed_model
from bytecomp.option_fields import default_of
from bytecomp.options import BenchOptions
from bytecomp.plan_file import load_plan, plan_for_model
from bytecomp.plan_types import Plan
from bytecomp.profile_store import Profile, load_profile
from bytecomp.runtime import Executor
from bytecomp.search import Planner, simulate_plan
from bytecomp.search.baselines import native_option
from bytecomp.search.settings import BaselineKind
from bytecomp.training.convergence import (
    ConvergenceConfig,
    Training,
    reference_name,
    train_curves,
    training_optimizer,
)
from bytecomp.training.workloads import load_workload, to_device
from bytecomp.ui import Fitted, Reporter

DEFAULT_COMPRESSOR = "topk:ratio=0.01"


@dataclass
class BenchConfig:
    """Everything ``bytecomp bench`` was asked to do: its options' values (defaults from
    :class:`~bytecomp.options.BenchOptions`, where they are declared) and what they
    resolve to (the plans, the convergence run)."""

    profile: str
    plan: str
    out: str = default_of(BenchOptions, "out")
    other_plans: list[str] = field(default_factory=list)  # more plans, named by their files
    compressors: list[str] = field(default_factory=list)  # each one on every tensor
    cluster: str | None = None
    iterations: int = default_of(BenchOptions, "iterations")
    warmup: int = default_of(BenchOptions, "warmup")
    force: bool = False
    convergence: ConvergenceConfig | None = None  # also train to a validation loss
    train_levels: bool = False  # also train each level of an adaptive plan, statically
    every: bool = default_of(BenchOptions, "every")  # "one compressor on every tensor"
    tables: bool = default_of(BenchOptions, "tables")  # False: bench --format json
    model: str | None = None  # the model spec the user named (bytecomp.model_spec)

    @classmethod
    def from_options(cls, profile: str, plans: list[str], options: BenchOptions) -> BenchConfig:
        """The configuration of ``bench(profile, plans, **options)`` (``plans``: the
        first is "bytecomp plan", the others named by their files)."""
        convergence = ConvergenceConfig(
            options.train_steps, min(options.eval_every, options.train_steps),
            options.to_loss, options.lr, target_fraction=options.target_fraction,
            reference_seed=options.reference_seed) if options.train_steps else None
        return cls(profile=profile, plan=plans[0], other_plans=plans[1:], out=options.out,
                   compressors=list(options.compressor), cluster=options.cluster,
                   iterations=options.iterations, warmup=options.warmup, force=options.force,
                   convergence=convergence, train_levels=options.train_levels,
                   every=options.every, tables=options.tables, model=options.model)


@dataclass
class Strategy:
    name: str
    key: str  # its prediction's name in _predictions
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    executor: Executor | None = None
    compute_only: bool = False
    data_seed: int | None = None  # its batches' seed, where not the run's (train_curves)
    scheduler: object | None = None  # the recipe's learning-rate schedule (training only)


@dataclass
class BenchedPlan:
    """A plan under bench: its strategy name and the plan (an adaptive plan's levels are
    timed as static plans of their own)."""

    name: str
    plan: Plan

    def levels(self) -> list[tuple[str, Plan]]:
        """(strategy name, static plan) of each level of an adaptive plan."""
        if not self.plan.levels:
            return []
        return [(f"{self.name} level {number} ({level.setting})", self.plan.level(number))
                for number, level in enumerate(self.plan.levels)]


def benched_plans(config: BenchConfig) -> list[BenchedPlan]:
    """The plans to bench: ``bytecomp plan`` first, then ``bytecomp plan: <file stem>``."""
    plans = [BenchedPlan("bytecomp plan", load_plan(config.plan))]
    for path in config.other_plans:
        plans.append(BenchedPlan(f"bytecomp plan: {Path(path).stem}", load_plan(path)))
    return plans


def _every_compressors(config: BenchConfig, plan, profile) -> list[str]:
    """The compressors to run on every tensor: those asked for; else, when training to
    accuracy, every compressor in the profile; else the plan's first, else top-k at 1% where
    the profile timed it, else the profile's first compressor (a plan that compresses nothing
    names none, and a default the profile lacks would refuse the bench)."""
    if config.compressors:
        return list(dict.fromkeys(canonical(spec) for spec in config.compressors))
    if not config.every:
        return []
    profiled = sorted({canonical(s) for s in profile.compressors["spec"]
                       if from_spec(s).compresses})
    if config.convergence is not None:
        return profiled
    if plan.compressors:
        return [plan.compressors[0]]
    return [DEFAULT_COMPRESSOR] if DEFAULT_COMPRESSOR in profiled else profiled[:1]


def every_key(spec: str) -> str:
    """The prediction key of ``spec`` on every tensor."""
    return f"every:{spec}"


def _predictions(profile, plans: list[BenchedPlan], cluster, specs: list[str]
                 ) -> tuple[dict[str, float], int | None]:
    planner = Planner(profile, cluster, specs, strict=True, objective="time")
    baselines = planner.baselines()
    by_kind = {b.kind: b.time_ms for b in baselines}
    every = {b.spec: b.time_ms for b in baselines if b.kind is BaselineKind.EVERY_TENSOR}
    powersgd_spec = planner.baseline_specs[BaselineKind.POWERSGD_HOOK]
    rank = from_spec(powersgd_spec).values["rank"] if powersgd_spec else None

    nodes, per_node = (cluster.nodes, cluster.ranks_per_node) if cluster else \
        (profile.nodes, profile.ranks_per_node)

    def simulated(plan: Plan) -> float:
        # a further plan made for another shape of this world size (run_bench warned):
        # its groups predicted on this job's shape, as they run here
        plan = replace(plan, nodes=nodes, ranks_per_node=per_node)
        return simulate_plan(Planner(profile, cluster, plan.compressors or None, strict=True,
                                     objective="time"), plan, record=False).iteration_ms

    predicted = {
        "compute": profile.time_ms("iteration_compute"),
        "fp32 DDP": by_kind[BaselineKind.FP32_DDP],
        "fp16 hook": by_kind.get(BaselineKind.FP16_HOOK, float("nan")),
        "PowerSGD hook": by_kind.get(BaselineKind.POWERSGD_HOOK, float("nan")),
        **{every_key(spec): every[spec] for spec in specs},
    }
    for benched in plans:  # an adaptive plan is predicted at its first level
        predicted[benched.name] = simulated(benched.plan.level(0) if benched.plan.levels
                                            else benched.plan)
        for name, level in benched.levels():
            predicted[name] = simulated(level)
    return predicted, rank


def scaled_compute(profile: Profile, factor: float) -> Profile:
    """A copy of ``profile`` whose compute times (not its communication) are scaled."""
    meta = copy.deepcopy(profile.meta)
    for name in ("forward", "optimizer", "forward_compute", "backward_compute",
                 "optimizer_compute", "iteration_compute"):
        if name not in meta["times"]:  # older profiles lack some compute-only phases
            continue
        meta["times"][name] = {k: v * factor for k, v in meta["times"][name].items()}
    tensors = profile.tensors.assign(ready_ms=profile.tensors["ready_ms"] * factor)
    compressors = profile.compressors.assign(encode_ms=profile.compressors["encode_ms"] * factor,
                                             decode_ms=profile.compressors["decode_ms"] * factor)
    if "advance_ms" in compressors.columns:  # a part of the encode
        compressors["advance_ms"] = compressors["advance_ms"] * factor
    aggregation = profile.aggregation.assign(one_ms=profile.aggregation["one_ms"] * factor,
                                             each_ms=profile.aggregation["each_ms"] * factor)
    return Profile(meta, tensors, profile.collectives, compressors, profile.copies, profile.path,
                   profile.fidelity, profile.probe, aggregation)


def build_strategies(workload, device, profile, plans: list[BenchedPlan], specs: list[str],
                     rank, world, nodes, make_optimizer,
                     timing: bool = True, levels: bool | None = None,
                     reference_seed: int | None = None) -> list[Strategy]:
    """One DDP copy of the workload's model per strategy, all with its initial weights:
    fp32 DDP, the fp16 and PowerSGD hooks, each of ``specs`` on every tensor, the
    plans, adaptive plans' levels one by one (``levels``, by default when
    ``timing``), fp32 DDP again on the batches of ``reference_seed`` (where given)
    and, for ``timing``, DDP with communication off."""
    cap = profile.bucket_cap_mb
    order = list(profile.tensors["name"])
    device_ids = [device.index] if device.type == "cuda" else None

    def fresh(bucket_cap_mb):
        model = copy.deepcopy(workload.model).to(device)
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
        return ddp, make_optimizer(model.parameters())

    strategies = []
    ddp, optimizer = fresh(cap)
    strategies.append(Strategy("fp32 DDP", "fp32 DDP", ddp, optimizer))
    ddp, optimizer = fresh(cap)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    strategies.append(Strategy("fp16 hook", "fp16 hook", ddp, optimizer))
    if rank is not None:
        ddp, optimizer = fresh(cap)
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                       start_powerSGD_iter=2, min_compression_rate=2,
                                       use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        strategies.append(Strategy(f"PowerSGD hook (rank {rank})", "PowerSGD hook", ddp,
                                   optimizer))
    for spec in specs:
        option = native_option(spec)
        every = plan_for_model(workload.model, lambda n, p, option=option: option, world, nodes,
                               cap, ready_order=order)
        ddp, optimizer = fresh(cap)
        strategies.append(Strategy(f"{spec} on every tensor", every_key(spec), ddp, optimizer,
                                   bytecomp.apply_plan(ddp, every)))
    for benched in plans:
        ddp, optimizer = fresh(benched.plan.bucket_cap_mb)
        strategies.append(Strategy(benched.name, benched.name, ddp, optimizer,
                                   bytecomp.apply_plan(ddp, benched.plan)))
        for name, level in benched.levels() if (timing if levels is None else levels) else []:
            ddp, optimizer = fresh(level.bucket_cap_mb)
            strategies.append(Strategy(name, name, ddp, optimizer,
                                       bytecomp.apply_plan(ddp, level)))
    if reference_seed is not None:
        ddp, optimizer = fresh(cap)
        strategies.append(Strategy(reference_name(reference_seed), "fp32 DDP", ddp, optimizer,
                                   data_seed=reference_seed))
    if timing:
        ddp, optimizer = fresh(cap)
        strategies.append(Strategy(COMPUTE_ONLY, "compute", ddp, optimizer, compute_only=True))
    return strategies


def _measure(strategies, workload, batch, device, config, progress) -> list[list[float]]:
    inputs, target = batch
    times: list[list[float]] = [[] for _ in strategies]
    for round_number in range(config.warmup + config.iterations):
        order = list(enumerate(strategies))
        if round_number % 2:
            order.reverse()
        for index, strategy in order:
            dist.barrier()
            start = clock(device)
            with strategy.ddp.no_sync() if strategy.compute_only else contextlib.nullcontext():
                workload.loss(strategy.ddp(*inputs), target).backward()
            strategy.optimizer.step()
            strategy.optimizer.zero_grad()
            elapsed = clock(device) - start
            if round_number >= config.warmup:
                times[index].append(1000 * elapsed)
        progress()
    table = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return table.tolist()


def bench_rank(config: BenchConfig) -> pd.DataFrame | None:
    """Run on every rank; rank 0 writes the results and returns them."""
    profile = load_profile(config.profile)
    plans = benched_plans(config)
    plan = plans[0].plan
    cluster = load_cluster(config.cluster) if config.cluster else None
    world = dist.get_world_size()
    shape = (cluster.nodes, cluster.ranks_per_node) if cluster else \
        (profile.nodes, profile.ranks_per_node)
    if shape[0] * shape[1] != world:
        raise BytecompError(f"this job has {world} ranks but the predictions are for "
                            f"{shape[0] * shape[1]} ({'--cluster' if cluster else 'the profile'});"
                            f" pass --cluster with this job's shape")
    specs = _every_compressors(config, plan, profile)
    predicted, rank = _predictions(profile, plans, cluster, specs)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if torch.cuda.is_available() else torch.device("cpu")
    spec = allowed_model(profile.meta["model"].get("spec"), config.model, profile.label,
                         "bench a profile of a built-in model")
    workload = load_workload(spec, optimizer=profile.recipe_optimizer(),
                             scheduler=profile.recipe_scheduler())
    batch = to_device(workload.make_batch(int(profile.meta["batch_size"])), device)
    strategies = build_strategies(workload, device, profile, plans, specs, rank, world, shape[0],
                                  workload.make_optimizer)
    reporter = Reporter(enabled=dist.get_rank() == 0, to_stderr=not config.tables)
    mismatch = link_warning(profile, cluster, device)
    if mismatch is not None:
        reporter.warn(mismatch)
    with reporter.session():
        progress = reporter.phase(f"{len(strategies)} strategies, interleaved",
                                  config.warmup + config.iterations)
        times = _measure(strategies, workload, batch, device, config, progress)
    stats = {}
    for strategy in strategies:
        if strategy.executor is not None:
            stats[strategy.name] = strategy.executor.stats.summary()
            strategy.executor.close()
    training = None
    if config.convergence is not None:
        training = _converge(config.convergence, workload, device, profile, plans, specs, rank,
                             world, shape[0], reporter, config.train_levels)
    if dist.get_rank() != 0:
        return None
    rows = []
    medians = [statistics.median(samples) for samples in times]
    fp32 = medians[0]
    drift = medians[-1] / predicted["compute"]
    recalibrated, _ = _predictions(scaled_compute(profile, drift), plans, cluster, specs)
    for strategy, samples, median in zip(strategies, times, medians):
        rows.append({
            "strategy": strategy.name, "measured_ms": median,
            "p10_ms": float(np.percentile(samples, 10)), "p90_ms": float(np.percentile(samples, 90)),
            "predicted_ms": predicted[strategy.key],
            "error": (predicted[strategy.key] - median) / median,
            "recalibrated_ms": recalibrated[strategy.key],
            "recalibrated_error": (recalibrated[strategy.key] - median) / median,
            "compute_drift": drift,
            "speedup_vs_fp32": fp32 / median,
            **{f"rank0_{key}": value for key, value in stats.get(strategy.name, {}).items()
               if key.endswith("ms_per_step") or key == "bytes_vs_fp32"},
        })
    results = pd.DataFrame(rows)
    convergence = None
    if training is not None and config.convergence is not None:
        convergence = time_to_accuracy(training, config.convergence,
                                       _fidelities(profile, plans, cluster, specs))
    _write(results, config, profile, world, shape, training, convergence)
    reporter.print(Fitted(results_table(results, profile, shape, config)))
    if convergence is not None and config.convergence is not None:
        reporter.print(Fitted(convergence_table(convergence, config.convergence)))
    return results


def _converge(settings: ConvergenceConfig, workload, device, profile, plans, specs, rank, world,
              nodes, reporter, train_levels: bool = False) -> Training:
    """Train every strategy but compute-only from the initial weights: curves, step times,
    and the levels of adaptive plans."""
    validation = workload.validation(int(profile.meta["batch_size"]),
                                     settings.validation_batches)
    if validation is None:
        raise BytecompError(f"{workload.name} has no validation data (its inputs are "
                            f"generated): training to accuracy needs a workload with real data "
                            f"(transformer, lstm, or a factory's own)")
    optimizer = workload.make_optimizer if settings.lr is None else \
        training_optimizer(settings.lr)
    strategies = build_strategies(workload, device, profile, plans, specs, rank, world, nodes,
                                  optimizer, timing=False, levels=train_levels,
                                  reference_seed=settings.reference_seed)
    for strategy in strategies:  # the schedule the probe and the finalists trained with
        strategy.scheduler = workload.make_scheduler(strategy.optimizer)
    with reporter.session():
        progress = reporter.phase(f"training {len(strategies)} strategies",
                                  settings.train_steps)
        training = train_curves(strategies, workload, int(profile.meta["batch_size"]), device,
                                settings, validation, progress)
    for strategy in strategies:
        if strategy.executor is not None:
            strategy.executor.close()
    return training


def _fidelities(profile, plans: list[BenchedPlan], cluster, specs) -> dict[str, float | None]:
    """Each strategy's predicted fidelity, where the profile measured it (an adaptive
    plan has one per level: none for the plan itself)."""
    if not profile.has_fidelity:
        return {}
    planner = Planner(profile, cluster, specs, strict=True, objective="time")
    out: dict[str, float | None] = {}
    for baseline in planner.baselines():
        name = baseline.name.split(" (")[0] if " on every tensor" in baseline.name \
            else baseline.name
        out[name] = baseline.fidelity
    for benched in plans:
        fidelity = benched.plan.info.get("fidelity", {}).get("plan")
        if fidelity is not None:
            out[benched.name] = float(fidelity)
    return out


def _write(results: pd.DataFrame, config: BenchConfig, profile, world: int, shape,
           training: Training | None = None, convergence: pd.DataFrame | None = None) -> None:
    with directory_atomic(config.out, config.force) as folder:
        results.to_csv(folder / "bench.csv", index=False)
        if training is not None and convergence is not None:
            write_training(training, folder)
            convergence.to_csv(folder / "convergence.csv", index=False)
            plot_curves(training, float(convergence.target_loss.iloc[0]),
                        folder / "convergence.png")
        lines = ["| strategy | measured ms (p10-p90) | predicted ms | error | recalibrated ms | "
                 "error | speedup vs fp32 |", "|---|---|---|---|---|---|---|"]
        for row in results.itertuples():
            lines.append(f"| {row.strategy} | {row.measured_ms:.2f} ({row.p10_ms:.2f}-"
                         f"{row.p90_ms:.2f}) | {row.predicted_ms:.2f} | {100 * row.error:+.1f}% | "
                         f"{row.recalibrated_ms:.2f} | {100 * row.recalibrated_error:+.1f}% | "
                         f"{row.speedup_vs_fp32:.2f}x |")
        header = (f"{profile.meta['model']['spec']}, {shape[0]} x {shape[1]} ranks "
                  f"({world} in the job), profile {config.profile}, plan "
                  f"{', '.join([config.plan, *config.other_plans])}\n\n")
        (folder / "bench.md").write_text(header + "\n".join(lines) + "\n")


