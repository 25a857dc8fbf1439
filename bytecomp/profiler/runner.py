"""What every rank runs for ``bytecomp profile``, with the process group up."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from rich.table import Table

from bytecomp.compress import default_specs, from_spec, ladder_specs
from bytecomp.errors import BytecompError
from bytecomp.option_fields import default_of
from bytecomp.options import PROFILE_RANGED, ProfileOptions, check_profile_ranges
from bytecomp.plan_types import fingerprint
from bytecomp.profile_meta import ModelMeta, ProfileMeta
from bytecomp.profile_store import Profile, save_profile
from bytecomp.profile_tables import TABLES
from bytecomp.profiler.budget import CLUSTER_SHARE, SHARES, describe_split
from bytecomp.profiler.cache import ClusterKey, keep, reuse_line
from bytecomp.profiler.calibration import (
    ClusterTables,
    calibration_meta,
    check_link,
    measure_cluster,
    measure_executor_here,
    reuse_cluster,
    write_calibration,
)
from bytecomp.profiler.calibration_file import load_calibration
from bytecomp.profiler.candidates import Candidates, probe_candidates
from bytecomp.profiler.fidelity import COLUMNS as FIDELITY_COLUMNS
from bytecomp.profiler.fidelity import measure_fidelity
from bytecomp.profiler.iteration_times import TrainingSettings, measure_training
from bytecomp.profiler.job import RankJob, profile_head, start_rank
from bytecomp.profiler.overheads import model_charges
from bytecomp.profiler.sweeps import SweepSettings
from bytecomp.recipe import parse_optimizer, parse_scheduler
from bytecomp.training.convergence import Budget
from bytecomp.training.probe import COLUMNS as PROBE_COLUMNS
from bytecomp.training.probe import ProbeResult, run_probe
from bytecomp.training.workloads import data_source, describe, load_workload, parameter_count
from bytecomp.ui import Reporter, console

PROBE_EVALUATIONS = 10  # validation losses over a convergence probe
PROBE_MOST_STEPS = 100  # a budgeted probe's most steps (--quick: QUICK_PROBE_STEPS)
QUICK_PROBE_STEPS = 20
# This configuration's settings under the names of ProfileOptions' fields (the options
# they come from), where the two differ
OPTION_NAMES = {"specs": "compressor", "timeout_s": "timeout", "ladders": "ladder",
                "budget_s": "budget", "clusters": "cluster"}


def _default(name: str):
    """Setting ``name``'s default: its option's, declared in ProfileOptions."""
    return default_of(ProfileOptions, OPTION_NAMES.get(name, name))


@dataclass
class ProfileConfig:
    """Everything ``bytecomp profile`` was asked to do: :class:`~bytecomp.options.
    ProfileOptions`' values (their defaults and ranges are declared there; a few names
    differ: :data:`OPTION_NAMES`) and what the profile's stages resolve from them."""

    model: str = "mlp"
    out: str = "profiles/mlp"
    batch_size: int | None = _default("batch_size")
    bucket_cap_mb: float = _default("bucket_cap_mb")
    iterations: int = _default("iterations")
    warmup: int = _default("warmup")
    specs: list[str] = field(default_factory=list)
    quick: bool = _default("quick")
    force: bool = _default("force")
    device: str = _default("device")
    timeout_s: float = _default("timeout_s")
    max_mb: float = _default("max_mb")
    machine: str = _default("machine")
    # training steps whose gradients measure fidelity (0: none)
    fidelity_iterations: int = _default("fidelity_iterations")
    # convergence probe: steps of each compressor on every tensor (0: none; None: what
    # the budget affords, at most PROBE_MOST_STEPS)
    probe_steps: int | None = _default("probe_steps")
    # wall clock of the whole profile (None: none)
    budget_s: float | None = _default("budget_s")
    started: float = field(default_factory=time.time)  # when the budget began
    ladders: list[str] = field(default_factory=list)  # families whose ladders are timed too
    optimizer: str | None = None  # a spec replacing the workload recipe's (--optimizer)
    scheduler: str | None = None  # a schedule spec replacing the recipe's (--scheduler)
    calibration: str | None = None  # reuse this calibration's cluster tables (--calibration)
    calibrate_only: bool = False  # measure the cluster tables alone (--calibrate-only)
    cache: bool = _default("cache")  # reuse and write the per-user cache of cluster tables
    clusters: list[str] = field(default_factory=list)  # what plans are for (--cluster)
    named_specs: bool = field(init=False, default=False)  # --compressor or --ladder given
    # set in the parent: the cache entry this job's tables go to (and come from, with
    # from_cache: then ``calibration`` is the entry)
    cache_key: ClusterKey | None = field(init=False, default=None)
    from_cache: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._validate()
        if self.clusters:
            from bytecomp.costs.clusters import load_cluster

            for name in self.clusters:  # one line for an unknown one, before any rank
                load_cluster(name)
        if self.optimizer is not None:
            self.optimizer = parse_optimizer(self.optimizer).spec  # one line, before any rank
        if self.scheduler is not None:
            self.scheduler = parse_scheduler(self.scheduler).spec
        self.named_specs = bool(self.specs or self.ladders)
        specs = [from_spec(s).spec for s in self.specs] or default_specs()
        specs += [spec for family in self.ladders for spec in ladder_specs(family)]
        self.specs = list(dict.fromkeys(specs))
        if self.quick:
            self.iterations, self.warmup = min(self.iterations, 5), min(self.warmup, 2)
            self.fidelity_iterations = min(self.fidelity_iterations, 3)
            self.probe_steps = None if self.probe_steps is None else \
                min(self.probe_steps, QUICK_PROBE_STEPS)

    @classmethod
    def from_options(cls, options: ProfileOptions) -> ProfileConfig:
        """The configuration of ``bytecomp profile`` with ``options`` (``--out``'s default:
        profiles/<model>, or profiles/calibration with ``--calibrate-only``)."""
        from bytecomp.training.workloads import safe_name

        values = {name: getattr(options, OPTION_NAMES.get(name, name))
                  for name in (item.name for item in fields(cls) if item.init)
                  if hasattr(options, OPTION_NAMES.get(name, name))}
        model = options.model or "mlp"
        values.update(model=model, specs=list(options.compressor),
                      ladders=list(options.ladder), clusters=list(options.cluster),
                      out=options.out or ("profiles/calibration" if options.calibrate_only
                                          else f"profiles/{safe_name(model)}"))
        return cls(**values)

    def _validate(self) -> None:
        """Reject bad settings here, before any rank is spawned (the ranges ProfileOptions
        declares)."""
        names = {option: name for name, option in OPTION_NAMES.items()}
        check_profile_ranges({option: getattr(self, names.get(option, option))
                              for option in PROFILE_RANGED})

    def sweep_settings(self, needed_bytes: int | None = None) -> SweepSettings:
        """The sweeps' settings: sizes up to ``--max-mb``, or to ``needed_bytes`` (the
        largest array the profiled model's plans can use: :func:`plan_bytes`) where
        that is less."""
        max_bytes = int(self.max_mb * (1 << 20))
        if needed_bytes is not None:
            max_bytes = min(max_bytes, needed_bytes)
        if self.quick:
            return SweepSettings(max_bytes=min(max_bytes, 1 << 20), size_factor=4, repeats=3,
                                 budget_s=0.2, numels=(1 << 10, 1 << 14, 1 << 18),
                                 compressor_repeats=2)
        return SweepSettings(max_bytes=max_bytes)


def plan_bytes(model: torch.nn.Module) -> int:
    """The largest array a plan of ``model`` can exchange: its whole gradient in float32
    (no bucket or merged group holds more), at least 1 MiB."""
    return max(1 << 20, 4 * sum(p.numel() for p in model.parameters() if p.requires_grad))


def _summary(profile: Profile) -> Table:
    # the path is not in the title: a title wraps at the table's width, mid-path when piped
    table = Table(title=f"profile of {profile.meta['model']['spec']} on "
                        f"{profile.world_size} ranks")
    for column in ("phase", "median ms", "p10 ms", "p90 ms"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for name, stats in profile.meta["times"].items():
        table.add_row(name, f"{stats['median_ms']:.2f}", f"{stats['p10_ms']:.2f}",
                      f"{stats['p90_ms']:.2f}")
    table.caption = (f"{len(profile.tensors)} tensors, {len(profile.collectives)} collective rows, "
                     f"{len(profile.compressors)} compressor rows, {len(profile.copies)} copy rows")
    return table


def _probe_meta(config: ProfileConfig, probe: ProbeResult | None, workload,
                skipped: list[str] | None = None) -> dict:
    """profile.yaml's ``probe``: its steps (0: none ran, or it told nothing), what it
    measured on, how much fp32's loss fell, and what decided its length (a count, or
    the profile's budget: the steps it afforded, and whether the clock stopped it)."""
    ran = probe.steps if probe is not None else 0
    meta = {"steps": ran if probe and probe.rows else 0,
            "eval_every": max(1, ran // PROBE_EVALUATIONS),
            "optimizer": workload.optimizer_spec, "scheduler": workload.scheduler_spec,
            "data": data_source(workload)}
    if probe is not None:
        meta.update(batches=probe.batches, fp32_improvement=probe.improvement,
                    informative=probe.informative, ran_steps=ran,
                    length="--probe-steps" if config.probe_steps is not None else "budget",
                    planned_steps=probe.planned, stopped_by_budget=probe.stopped_by_budget,
                    settled=probe.settled, seconds=round(probe.seconds, 1))
    if skipped:  # compressors no plan on the profiled ranks (or --cluster) could use
        meta["skipped"] = list(skipped)
    return meta


def _plan_of(config: ProfileConfig, left_s: float | None = None) -> str:
    """What the profile will do and how long it aims to take, in words."""
    if config.probe_steps == 0:
        return "timing, sweeps and gains; no convergence probe (--probe-steps 0)"
    if config.probe_steps is not None:
        return (f"timing, sweeps and gains, then a {config.probe_steps}-step convergence "
                f"probe (--probe-steps; 0 skips it)")
    if config.budget_s is None:
        return "timing, sweeps and gains, then the convergence probe (--probe-steps 0 skips it)"
    return (f"timing, sweeps and gains, then the convergence probe for what is left of "
            f"{config.budget_s:.0f} s; {describe_split(config.budget_s, left_s)}; it stops sooner "
            f"once its factors settle (--budget sets it; --quick shortens the sweeps, "
            f"--probe-steps 0 skips the probe)")


def probe_budget(config: ProfileConfig) -> tuple[int, Budget | None]:
    """The probe's most steps and its budget: a forced count (``--probe-steps``) has
    none; otherwise what is left of the profile's budget decides, at most
    :data:`PROBE_MOST_STEPS` (``--quick``: :data:`QUICK_PROBE_STEPS`)."""
    if config.probe_steps is not None:
        return config.probe_steps, None
    most = QUICK_PROBE_STEPS if config.quick else PROBE_MOST_STEPS
    if config.budget_s is None:
        return most, None
    return most, Budget(config.budget_s, config.started, most, least=min(10, most),
                        evaluations=PROBE_EVALUATIONS)


def _candidates(config: ProfileConfig, tensors, collectives: list[dict],
                compressors: list[dict], specs: list[str], topology, nodes: int,
                device) -> Candidates:
    """The compressors the probe trains (:mod:`bytecomp.profiler.candidates`), as rank 0
    reckons them (collective: every rank gets the same)."""
    found: list = [None]
    if dist.get_rank() == 0:
        meta: ProfileMeta = {"world_size": topology.size, "nodes": nodes,
                             "ranks_per_node": topology.ranks_per_node,
                             "device": {"type": device.type}, "model": {"name": config.model}}
        found[0] = probe_candidates(meta, tensors, collectives, compressors, specs,
                                    config.clusters)
    dist.broadcast_object_list(found, src=0)
    return found[0]


def _check_reused(config: ProfileConfig, calibration, topology, device, reporter):
    """The link check of a reused calibration: ``(calibration, link)``. A cache entry
    that fails it (another link) is set aside on every rank alike (they see the same
    reduced times) and the cluster measured afresh: ``(None, None)``."""
    if not config.from_cache:
        reporter.line(f"cluster tables from {calibration.describe()}; checking the link")
        return calibration, check_link(calibration, topology, device)
    try:
        link = check_link(calibration, topology, device)
    except BytecompError as error:
        reporter.line(f"the cached cluster tables do not fit this job ({error}); measuring "
                      f"them afresh")
        return None, None
    reporter.line(reuse_line(calibration))
    return calibration, link


def run_rank(config: ProfileConfig, nodes: int, ranks_per_node: int) -> Path | None:
    """Profile on this rank; rank 0 writes the directory and returns its path."""
    job = start_rank(config, nodes, ranks_per_node)
    rank, device, devices, topology = job.rank, job.device, job.devices, job.topology
    workload = load_workload(config.model, optimizer=config.optimizer,
                             scheduler=config.scheduler)
    initial = copy.deepcopy(workload.model.state_dict())  # every phase starts from these
    batch_size = config.batch_size or workload.batch_size
    training = TrainingSettings(batch_size, config.bucket_cap_mb, config.warmup, config.iterations)
    sweep = config.sweep_settings(plan_bytes(workload.model))
    reporter = Reporter(enabled=rank == 0)
    calibration = load_calibration(config.calibration) if config.calibration else None
    measuring = time.time()
    # the stages share what start-up (the recipe's check, the ranks' start) left
    budget_s = None if config.budget_s is None else \
        max(0.0, config.budget_s - (measuring - config.started))
    reporter.line(f"profiling {config.model} ({describe(workload.model)}) on "
                  f"{topology.size} ranks ({nodes} x {ranks_per_node}), {device.type}, "
                  f"batch {batch_size} per rank: {_plan_of(config, budget_s)}")

    def allowed(stage: str) -> float | None:
        return None if budget_s is None else SHARES[stage] * budget_s

    with reporter.session():
        link = None
        if calibration is not None:  # before anything is measured: a refusal comes at once
            calibration, link = _check_reused(config, calibration, topology, device, reporter)
        steps = 2 * (training.warmup + training.iterations)
        several = nodes > 1 and ranks_per_node > 1
        times, tensors, interference = measure_training(
            workload, device, training,
            reporter.phase("training iterations", steps, allowed("training iterations"),
                           "a larger --budget gives it more; fewer --iterations shorten it"),
            topology.intra if several else None)
        if calibration is not None:
            cluster = reuse_cluster(calibration, config.specs)
        else:
            cluster = measure_cluster(config.specs, topology, device, devices, sweep,
                                      training.warmup, training.iterations, config.quick,
                                      reporter, budget_s)
        if cluster.executor is None:  # a calibration from before the executor's record
            cluster.executor = measure_executor_here(device, nodes, training.warmup,
                                                     training.iterations, config.quick,
                                                     reporter, budget_s)
        collectives, compressors = cluster.collectives, cluster.compressors
        aggregation, copies = cluster.aggregation, cluster.copies
        charges, compute_charges, counts = model_charges(collectives.rows, device, nodes,
                                                         ranks_per_node)
        executor = cluster.executor.costs(charges, compute_charges, counts,
                                          float(interference.get("busy_collective_ms", 0.0)))
        fidelity_specs = [s for s in config.specs if from_spec(s).compresses]
        fidelity = []
        workload.model.load_state_dict(initial)
        if config.fidelity_iterations and fidelity_specs:
            steps = training.warmup + config.fidelity_iterations
            fidelity = measure_fidelity(
                workload, device, batch_size, config.bucket_cap_mb, fidelity_specs,
                training.warmup, config.fidelity_iterations,
                reporter.phase("gradient fidelity", steps, allowed("gradient fidelity"),
                               "a larger --budget gives it more; fewer "
                               "--fidelity-iterations shorten it"))
        if fidelity and not any(row["gain"] > 0 for row in fidelity):
            raise BytecompError(f"every compressor's measured gain is 0 on every tensor of "
                                f"{config.model}: its gradients are zero or not finite, so "
                                f"there is nothing to plan (check the loss and the batches)")
        probe = None
        workload.model.load_state_dict(initial)
        probe_steps, budget = probe_budget(config)
        candidates = Candidates(fidelity_specs)
        if probe_steps and fidelity_specs and config.clusters:  # what the plans are for
            candidates = _candidates(config, tensors, collectives.rows, compressors.rows,
                                     fidelity_specs, topology, nodes, device)
            if (said := candidates.line(config.clusters)) is not None:
                reporter.end_phase()
                reporter.line(said)
            fidelity_specs = candidates.trained
        if probe_steps and fidelity_specs:
            left = None if budget is None or budget.left() <= 0 else budget.left()
            probe = run_probe(workload, device, batch_size, config.bucket_cap_mb, fidelity_specs,
                              probe_steps, max(1, probe_steps // PROBE_EVALUATIONS),
                              topology.size, nodes,
                              reporter.phase(f"convergence probe ({len(fidelity_specs) + 1})",
                                             probe_steps, left, most=budget is not None),
                              budget)
    if rank == 0 and calibration is None and config.cache_key is not None:
        _keep_in_cache(config, config.cache_key, cluster, job, reporter)
    if rank != 0:
        return None
    stages_s = {"start-up": round(measuring - config.started, 3), **reporter.durations()}
    model: ModelMeta = {"name": workload.name, "spec": config.model,
                        "fingerprint": fingerprint(workload.model),
                        "parameters": parameter_count(workload.model), "tensors": len(tensors),
                        "args": workload.args}
    meta: ProfileMeta = {
        **profile_head(config, topology, device, cluster.compress_kernels, model, batch_size),
        "recipe": {"optimizer": workload.optimizer_spec, "scheduler": workload.scheduler_spec,
                   "data": data_source(workload)},
        "fidelity": {"iterations": config.fidelity_iterations, "warmup": training.warmup,
                     "optimizer": workload.optimizer_spec, "data": data_source(workload)},
        "probe": _probe_meta(config, probe, workload, candidates.skipped),
        "times": times,
        "interference": interference,
        "executor": {**executor.to_meta(),
                     "charged_ms": charges, "charged_compute_ms": compute_charges,
                     "measured": cluster.executor.to_meta()},
        "compressor_specs": config.specs,
        "quality": cluster.quality,
        "sweep": cluster.sweep,
        "calibration": {**cluster.record(calibration, link),
                        **({"cache": True} if config.from_cache and calibration else {})},
        # where the time went: start-up (the recipe check, the ranks' start), then each phase
        "stages_s": stages_s,
    }
    profile = Profile(meta, tensors, pd.DataFrame(collectives.rows),
                      pd.DataFrame(compressors.rows),
                      pd.DataFrame(copies, columns=["direction", "bytes", "time_ms"]),
                      fidelity=pd.DataFrame(fidelity, columns=FIDELITY_COLUMNS),
                      probe=pd.DataFrame(probe.rows if probe else [], columns=PROBE_COLUMNS),
                      aggregation=pd.DataFrame(aggregation, columns=list(TABLES["aggregation"])))
    path = save_profile(profile, config.out, config.force)
    reporter.print(_summary(profile))
    if reporter.enabled and not reporter.to_stderr:  # one line however narrow the
        console.print(f"wrote {path}", soft_wrap=True, highlight=False)  # terminal, or piped
    took = time.time() - config.started
    if config.budget_s is not None and took > config.budget_s * 1.2:
        stages = {name: spent for name, spent in stages_s.items()
                  if not name.startswith("convergence probe")}
        over = {name: spent - SHARES[name] * config.budget_s for name, spent in stages.items()
                if name in SHARES}
        worst = max(over, key=over.__getitem__, default="start-up")
        reporter.warn(f"the profile took {took:.0f} s against --budget {config.budget_s:g}: "
                      f"the stages before the probe took {sum(stages.values()):.0f} s, "
                      f"{worst} the most past its share ({stages.get(worst, 0):.0f} s); a "
                      f"larger --budget, --quick or --calibration shortens them")
    return path


def _keep_in_cache(config: ProfileConfig, key: ClusterKey, tables: ClusterTables,
                   job: RankJob, reporter: Reporter) -> None:
    """On rank 0: the cluster's tables measured on this job into the cache's entry of
    ``key`` (:func:`bytecomp.profiler.cache.keep`: a failure is one line, no error)."""
    meta = calibration_meta(config, tables, job.topology, job.device, key)
    keep(key, lambda path: write_calibration(path, True, meta, tables), reporter.warn)


def run_calibration_rank(config: ProfileConfig, nodes: int, ranks_per_node: int) -> Path | None:
    """``bytecomp profile --calibrate-only`` on this rank: the cluster tables alone, no
    model; rank 0 writes the calibration directory and returns its path."""
    job = start_rank(config, nodes, ranks_per_node)
    rank, device, devices, topology = job.rank, job.device, job.devices, job.topology
    reporter = Reporter(enabled=rank == 0)
    reporter.print(f"calibrating {topology.size} ranks ({nodes} x {ranks_per_node}), "
                   f"{device.type}: collective, compressor, aggregation and copy sweeps and "
                   f"the executor's fixed costs, for {len(config.specs)} compressor specs"
                   + (f", in at most {config.budget_s:.0f} s (--budget)"
                      if config.budget_s is not None else ""))
    with reporter.session():
        tables = measure_cluster(config.specs, topology, device, devices,
                                 config.sweep_settings(), config.warmup, config.iterations,
                                 config.quick, reporter, config.budget_s,
                                 scale=1 / CLUSTER_SHARE)
    if rank != 0:
        return None
    write_calibration(config.out, config.force,
                      calibration_meta(config, tables, topology, device), tables)
    if config.cache_key is not None:
        _keep_in_cache(config, config.cache_key, tables, job, reporter)
    reporter.print(f"calibration -> {config.out}: {len(tables.collectives.rows)} collective "
                   f"rows, {len(tables.compressors.rows)} compressor rows, "
                   f"{len(tables.aggregation)} aggregation rows, {len(tables.copies)} copy rows")
    return Path(config.out)
