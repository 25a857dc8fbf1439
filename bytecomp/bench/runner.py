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
* the bytecomp plan (bytecomp's executor);
* compute only: DDP with communication off (``no_sync``), the reference for
  how fast this machine computes now.

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
import math
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from rich.table import Table
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.bench.convergence import (
    ConvergenceConfig,
    steps_to,
    target_loss,
    train_curves,
    training_optimizer,
)
from bytecomp.compress import canonical, from_spec
from bytecomp.errors import BytecompError
from bytecomp.files import directory_atomic
from bytecomp.model.clusters import load_cluster
from bytecomp.plan import load_plan, plan_for_model
from bytecomp.profile.store import Profile, load_profile
from bytecomp.profile.training import to_device
from bytecomp.profile.workloads import load_workload
from bytecomp.runtime import Executor
from bytecomp.search import Planner, simulate_plan
from bytecomp.search.planner import check_plan_fits, native_option
from bytecomp.ui import Reporter

DEFAULT_COMPRESSOR = "topk:ratio=0.01"


@dataclass
class BenchConfig:
    profile: str
    plan: str
    out: str = "bench"
    compressors: list[str] = field(default_factory=list)  # each one on every tensor
    cluster: str | None = None
    iterations: int = 10
    warmup: int = 3
    force: bool = False
    convergence: ConvergenceConfig | None = None  # also train to a validation loss


@dataclass
class Strategy:
    name: str
    key: str  # its prediction's name in _predictions
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    executor: Executor | None = None
    compute_only: bool = False


COMPUTE_ONLY = "compute only (no communication)"


def _every_compressors(config: BenchConfig, plan, profile) -> list[str]:
    """The compressors to run on every tensor: those asked for; else, when training to
    accuracy, every compressor in the profile; else the plan's first (or top-k)."""
    if config.compressors:
        return list(dict.fromkeys(canonical(spec) for spec in config.compressors))
    if config.convergence is not None:
        return sorted({canonical(s) for s in profile.compressors["spec"]} - {"none"})
    return [plan.compressors[0] if plan.compressors else DEFAULT_COMPRESSOR]


def every_key(spec: str) -> str:
    """The prediction key of ``spec`` on every tensor."""
    return f"every:{spec}"


def _predictions(profile, plan, cluster, specs: list[str]) -> tuple[dict[str, float], int | None]:
    planner = Planner(profile, cluster, specs, strict=True, objective="time")
    baselines = {b.name: b.time_ms for b in planner.baselines()}
    powersgd_spec = planner.baseline_specs["powersgd"]
    rank = from_spec(powersgd_spec).values["rank"] if powersgd_spec else None
    plan_ms = simulate_plan(Planner(profile, cluster, plan.compressors or None, strict=True,
                                    objective="time"), plan, record=False).iteration_ms
    return {
        "compute": profile.time_ms("iteration_compute"),
        "fp32 DDP": baselines["fp32 DDP"],
        "fp16 hook": baselines.get("fp16 hook", float("nan")),
        "PowerSGD hook": baselines.get(f"PowerSGD hook (rank {rank})", float("nan")),
        **{every_key(spec): baselines[f"{spec} on every tensor "
                                      f"({native_option(spec).collective})"] for spec in specs},
        "plan": plan_ms,
    }, rank


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
    return Profile(meta, tensors, profile.collectives, compressors, profile.copies, profile.path,
                   profile.fidelity)


def timing_optimizer(parameters) -> torch.optim.Optimizer:
    """The profiler's optimizer, for measuring iteration times."""
    return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)


def build_strategies(workload, device, profile, plan, specs: list[str], rank, world, nodes,
                     make_optimizer=timing_optimizer, compute_only: bool = True) -> list[Strategy]:
    """One DDP copy of the workload's model per strategy, all with its initial weights:
    fp32 DDP, the fp16 and PowerSGD hooks, each of ``specs`` on every tensor, the plan
    and (with ``compute_only``) DDP with communication off."""
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
    ddp, optimizer = fresh(plan.bucket_cap_mb)
    strategies.append(Strategy("bytecomp plan", "plan", ddp, optimizer,
                               bytecomp.apply_plan(ddp, plan)))
    if compute_only:
        ddp, optimizer = fresh(cap)
        strategies.append(Strategy(COMPUTE_ONLY, "compute", ddp, optimizer, compute_only=True))
    return strategies


def _clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _measure(strategies, workload, batch, device, config, progress) -> list[list[float]]:
    inputs, target = batch
    times: list[list[float]] = [[] for _ in strategies]
    for round_number in range(config.warmup + config.iterations):
        order = list(enumerate(strategies))
        if round_number % 2:
            order.reverse()
        for index, strategy in order:
            dist.barrier()
            start = _clock(device)
            with strategy.ddp.no_sync() if strategy.compute_only else contextlib.nullcontext():
                workload.loss(strategy.ddp(*inputs), target).backward()
            strategy.optimizer.step()
            strategy.optimizer.zero_grad()
            elapsed = _clock(device) - start
            if round_number >= config.warmup:
                times[index].append(1000 * elapsed)
        progress()
    table = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return table.tolist()


def bench_rank(config: BenchConfig) -> pd.DataFrame | None:
    """Run on every rank; rank 0 writes the results and returns them."""
    profile = load_profile(config.profile)
    plan = load_plan(config.plan)
    cluster = load_cluster(config.cluster) if config.cluster else None
    world = dist.get_world_size()
    shape = (cluster.nodes, cluster.ranks_per_node) if cluster else \
        (profile.nodes, profile.ranks_per_node)
    check_plan_fits(plan, profile, cluster)
    if shape[0] * shape[1] != world:
        raise BytecompError(f"this job has {world} ranks but the predictions are for "
                            f"{shape[0] * shape[1]} ({'--cluster' if cluster else 'the profile'});"
                            f" pass --cluster with this job's shape")
    specs = _every_compressors(config, plan, profile)
    predicted, rank = _predictions(profile, plan, cluster, specs)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if torch.cuda.is_available() else torch.device("cpu")
    workload = load_workload(profile.meta["model"]["spec"])
    batch = to_device(workload.make_batch(int(profile.meta["batch_size"])), device)
    strategies = build_strategies(workload, device, profile, plan, specs, rank, world, shape[0])
    reporter = Reporter(enabled=dist.get_rank() == 0)
    with reporter.session():
        progress = reporter.phase(f"{len(strategies)} strategies, interleaved",
                                  config.warmup + config.iterations)
        times = _measure(strategies, workload, batch, device, config, progress)
    stats = {}
    for strategy in strategies:
        if strategy.executor is not None:
            stats[strategy.name] = strategy.executor.stats.summary()
            strategy.executor.close()
    curves = None
    if config.convergence is not None:
        curves = _converge(config.convergence, workload, device, profile, plan, specs, rank,
                           world, shape[0], reporter)
    if dist.get_rank() != 0:
        return None
    rows = []
    medians = [statistics.median(samples) for samples in times]
    fp32 = medians[0]
    drift = medians[-1] / predicted["compute"]
    recalibrated, _ = _predictions(scaled_compute(profile, drift), plan, cluster, specs)
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
    if curves is not None and config.convergence is not None:
        convergence = time_to_accuracy(curves, results, config.convergence,
                                       _fidelities(profile, plan, cluster, specs))
    _write(results, config, profile, world, shape, curves, convergence)
    reporter.print(_table(results, profile, shape, config))
    if convergence is not None and config.convergence is not None:
        reporter.print(convergence_table(convergence, config.convergence))
    return results


def _converge(settings: ConvergenceConfig, workload, device, profile, plan, specs, rank, world,
              nodes, reporter) -> dict[str, list[tuple[int, float]]]:
    """Train every strategy but compute-only from the initial weights; their curves."""
    validation = workload.validation(int(profile.meta["batch_size"]),
                                     settings.validation_batches)
    if validation is None:
        raise BytecompError(f"{workload.name} has no validation data (its inputs are "
                            f"generated): training to accuracy needs a workload with real data "
                            f"(transformer, lstm, or a factory's own)")
    strategies = build_strategies(workload, device, profile, plan, specs, rank, world, nodes,
                                  training_optimizer(settings.lr), compute_only=False)
    with reporter.session():
        progress = reporter.phase(f"training {len(strategies)} strategies",
                                  settings.train_steps)
        curves = train_curves(strategies, workload, int(profile.meta["batch_size"]), device,
                              settings, validation, progress)
    for strategy in strategies:
        if strategy.executor is not None:
            strategy.executor.close()
    return {strategy.name: curve for strategy, curve in zip(strategies, curves)}


def _fidelities(profile, plan, cluster, specs) -> dict[str, float | None]:
    """Each strategy's predicted fidelity, where the profile measured it."""
    if not profile.has_fidelity:
        return {}
    planner = Planner(profile, cluster, specs, strict=True, objective="time")
    out: dict[str, float | None] = {}
    for baseline in planner.baselines():
        name = baseline.name.split(" (")[0] if " on every tensor" in baseline.name \
            else baseline.name
        out[name] = baseline.fidelity
    fidelity = plan.info.get("fidelity", {}).get("plan")
    if fidelity is not None:
        out["bytecomp plan"] = float(fidelity)
    return out


def time_to_accuracy(curves: dict[str, list[tuple[int, float]]], timing: pd.DataFrame,
                     settings: ConvergenceConfig,
                     fidelities: dict[str, float | None]) -> pd.DataFrame:
    """Per strategy: steps and wall-clock time to the target validation loss (steps x
    the measured iteration time), final loss, divergence, predicted fidelity."""
    target = target_loss(list(curves.values()), settings)
    measured = dict(zip(timing.strategy, timing.measured_ms))
    rows = []
    for name, curve in curves.items():
        steps = steps_to(curve, target)
        steps = math.nan if steps is None else steps  # NaN: never reached
        rows.append({
            "strategy": name, "iteration_ms": measured[name], "target_loss": target,
            "steps_to_target": steps, "time_to_target_s": steps * measured[name] / 1000.0,
            "final_loss": curve[-1][1], "diverged": not math.isfinite(curve[-1][1]),
            "predicted_fidelity": fidelities.get(name),
        })
    table = pd.DataFrame(rows)
    table["time_vs_fp32"] = table.time_to_target_s.iloc[0] / table.time_to_target_s
    table["steps_vs_fp32"] = table.steps_to_target / table.steps_to_target.iloc[0]
    return table


def convergence_table(table: pd.DataFrame, settings: ConvergenceConfig) -> Table:
    target = table.target_loss.iloc[0]
    out = Table(title=f"time to a validation loss of {target:.4f} ({settings.train_steps} "
                      f"steps, evaluated every {settings.eval_every})")
    for column in ("strategy", "iteration ms", "steps to target", "time to target s",
                   "vs fp32", "final loss", "predicted fidelity"):
        out.add_column(column, justify="left" if column == "strategy" else "right")
    for row in table.itertuples():
        reached = row.steps_to_target == row.steps_to_target  # not NaN
        out.add_row(row.strategy, f"{row.iteration_ms:.1f}",
                    f"{row.steps_to_target:.0f}" if reached else "not reached",
                    f"{row.time_to_target_s:.1f}" if reached else "-",
                    f"{row.time_vs_fp32:.2f}x" if reached else "-",
                    "diverged" if row.diverged else f"{row.final_loss:.4f}",
                    "-" if row.predicted_fidelity is None or row.predicted_fidelity !=
                    row.predicted_fidelity else f"{row.predicted_fidelity:.3f}")
    return out


def _table(results: pd.DataFrame, profile, shape, config) -> Table:
    table = Table(title=f"bytecomp bench: {profile.meta['model']['spec']} on {shape[0]} x "
                        f"{shape[1]} ranks, median of {config.iterations} interleaved iterations")
    for column in ("strategy", "measured ms (p10-p90)", "predicted ms", "error",
                   "recalibrated ms", "error ", "vs fp32"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in results.itertuples():
        table.add_row(row.strategy, f"{row.measured_ms:.1f} ({row.p10_ms:.1f}-{row.p90_ms:.1f})",
                      f"{row.predicted_ms:.1f}", f"{100 * row.error:+.1f}%",
                      f"{row.recalibrated_ms:.1f}", f"{100 * row.recalibrated_error:+.1f}%",
                      f"{row.speedup_vs_fp32:.2f}x")
    strategies = results[results.strategy != COMPUTE_ONLY]
    raw, recalibrated = strategies["error"].abs(), strategies["recalibrated_error"].abs()
    table.caption = (f"compute drift since the profile: x{results.compute_drift.iloc[0]:.3f}; "
                     f"prediction error: median {100 * raw.median():.1f}%, worst "
                     f"{100 * raw.max():.1f}%; recalibrated for the drift: median "
                     f"{100 * recalibrated.median():.1f}%, worst {100 * recalibrated.max():.1f}%")
    return table


def _write(results: pd.DataFrame, config: BenchConfig, profile, world: int, shape,
           curves=None, convergence: pd.DataFrame | None = None) -> None:
    with directory_atomic(config.out, config.force) as folder:
        results.to_csv(folder / "bench.csv", index=False)
        if curves is not None and convergence is not None:
            pd.DataFrame([{"strategy": name, "step": step, "validation_loss": loss}
                          for name, curve in curves.items() for step, loss in curve]
                         ).to_csv(folder / "curves.csv", index=False)
            convergence.to_csv(folder / "convergence.csv", index=False)
            plot_curves(curves, dict(zip(convergence.strategy, convergence.iteration_ms)),
                        float(convergence.target_loss.iloc[0]), folder / "convergence.png")
        lines = ["| strategy | measured ms (p10-p90) | predicted ms | error | recalibrated ms | "
                 "error | speedup vs fp32 |", "|---|---|---|---|---|---|---|"]
        for row in results.itertuples():
            lines.append(f"| {row.strategy} | {row.measured_ms:.2f} ({row.p10_ms:.2f}-"
                         f"{row.p90_ms:.2f}) | {row.predicted_ms:.2f} | {100 * row.error:+.1f}% | "
                         f"{row.recalibrated_ms:.2f} | {100 * row.recalibrated_error:+.1f}% | "
                         f"{row.speedup_vs_fp32:.2f}x |")
        header = (f"{profile.meta['model']['spec']}, {shape[0]} x {shape[1]} ranks "
                  f"({world} in the job), profile {config.profile}, plan {config.plan}\n\n")
        (folder / "bench.md").write_text(header + "\n".join(lines) + "\n")


def plot_curves(curves: dict[str, list[tuple[int, float]]], iteration: dict[str, float],
                target: float, path) -> None:
    """Validation loss against wall-clock time (steps x measured ``iteration`` ms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5))
    for name, curve in curves.items():
        finite = [(s, loss) for s, loss in curve if math.isfinite(loss)]
        if not finite:
            continue
        seconds = [s * iteration[name] / 1000.0 for s, _ in finite]
        axes.plot(seconds, [loss for _, loss in finite], label=name,
                  linewidth=2.5 if name == "bytecomp plan" else 1.2)
    axes.axhline(target, color="grey", linestyle=":", label="target")
    axes.set_xlabel("wall-clock time (s): steps x measured iteration time")
    axes.set_ylabel("validation loss")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
