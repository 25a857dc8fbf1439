"""A cluster's calibration: the measurements that belong to the cluster and its devices,
not to the model, made once and reused (``bytecomp profile --calibration DIR``).

They are the collective sweeps, the compressor and aggregation sweeps, the copy sweep
(with the fit check of the first two, ``quality``) and what the executor's fixed costs
are derived from (:class:`~bytecomp.profiler.overheads.ExecutorMeasurement`: a tiny model
of its own, no part of the user's). ``bytecomp profile --calibrate-only`` measures
only them and writes a calibration directory: ``calibration.yaml`` and
``collectives.csv``, ``compressors.csv``, ``aggregation.csv``, ``copies.csv``, in the
profile's formats. A profile directory serves as a calibration too.

A calibration is reused only on a job like the one that made it: the same world size,
nodes and ranks per node, backend, device type and name, compressor path (torch or
triton kernels) and, on a CPU job, threads per rank, checked before any rank starts;
and the same link, checked by the ranks before they measure anything: an fp32
allreduce of each group the job has is timed now at one size of the calibration's
sweep (:func:`check_link`), and its least time must be within :data:`LINK_TOLERANCE`
times the calibration's p10, either way. Anything else is one line naming what differs.

Reading a calibration directory: :mod:`bytecomp.profiler.calibration_file`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from bytecomp.compress import canonical, kernels
from bytecomp.errors import BytecompError
from bytecomp.files import directory_atomic
from bytecomp.launch import pick_device
from bytecomp.profile_meta import CalibrationMeta
from bytecomp.profile_tables import TABLES
from bytecomp.profiler.budget import Allowance
from bytecomp.profiler.calibration_file import (
    CALIBRATION_FILE,
    Calibration,
    calibration_files,
    load_calibration,
)
from bytecomp.profiler.job import calibration_head, device_name
from bytecomp.profiler.overheads import (
    BUSY_DIM,
    QUICK_BUSY_DIM,
    ExecutorMeasurement,
    measure_executor,
)
from bytecomp.profiler.quality import (
    COLLECTIVE_KEY,
    COMPRESSOR_KEY,
    Checked,
    collective_quality,
    compressor_quality,
    poor_summary,
    quality_meta,
    remeasure,
)
from bytecomp.profiler.sweeps import (
    SweepSettings,
    aggregation_steps,
    collective_steps,
    compressor_steps,
    groups_to_sweep,
    sizes,
    sweep_aggregation,
    sweep_collectives,
    sweep_compressors,
    sweep_copies,
    time_allreduce,
)
from bytecomp.safe_yaml import dump_yaml

# the link check: an fp32 allreduce of each group at the largest size of the calibration's
# sweep up to LINK_MAX_BYTES whose median there took at most LINK_MAX_MS (a size where
# bandwidth, not a thread wake-up, sets the time; the smallest size where none did).
# The least of 3 to LINK_SAMPLES samples now (as many as fit in LINK_BUDGET_S, judged by
# the first) is compared with the calibration's p10: noise on a shared machine only adds
# time (a median of a millisecond moves by 3x there), so both are the quiet link's time.
LINK_MAX_BYTES = 16 << 20
LINK_MAX_MS = 100.0
LINK_SAMPLES = 9  # at most, after one untimed call
LINK_LEAST_SAMPLES = 3
LINK_BUDGET_S = 0.5
# how much slower or faster than the calibration's the allreduce may be: links of
# another class (100 Mbit/s, 1 Gbit/s, loopback) differ by 8x or more
LINK_TOLERANCE = 3.0
HOW_TO_CALIBRATE = "calibrate this cluster with bytecomp profile --calibrate-only --out DIR"


# -- does it fit this job? ---------------------------------------------------------------------


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _shape(world: int, nodes: int, per_node: int) -> str:
    return f"{_plural(world, 'rank')} ({_plural(nodes, 'node')} x {per_node})"


def check_job(calibration: Calibration, nodes: int, ranks_per_node: int, device_type: str,
              device_name: str, compress_kernels: str, threads_per_rank: int) -> None:
    """Before any rank starts: the calibration was made on a job of this shape, device
    and compressor path (and, on a CPU job, as many threads per rank); else one line
    naming every difference."""
    meta = calibration.meta
    differences = []
    if (meta["nodes"], meta["ranks_per_node"]) != (nodes, ranks_per_node):
        shape = _shape(meta["world_size"], meta["nodes"], meta["ranks_per_node"])
        differences.append(f"{shape} there, "
                           f"{_shape(nodes * ranks_per_node, nodes, ranks_per_node)} here")
    there = (meta["device"]["type"], meta["device"].get("name", ""))
    if there != (device_type, device_name):
        differences.append(f"device {there[0]} {there[1]!r} there, {device_type} "
                           f"{device_name!r} here")
    kernels_there = meta.get("compress_kernels", "torch")
    if kernels_there != compress_kernels:
        differences.append(f"compressors run {kernels_there} there, {compress_kernels} here")
    threads = (meta.get("machine") or {}).get("threads_per_rank")
    if device_type == "cpu" and threads is not None and threads != threads_per_rank:
        differences.append(f"{_plural(threads, 'thread')} per rank there, "
                           f"{threads_per_rank} here")
    if differences:
        raise BytecompError(f"calibration {calibration.path} does not match this job: "
                            f"{'; '.join(differences)} ({HOW_TO_CALIBRATE})")


def select_specs(calibration: Calibration, specs: list[str], named: bool) -> list[str]:
    """The profile's compressor specs: the calibration's where none were named, else the
    named ones, each of which the calibration must have timed."""
    if not named:
        return calibration.specs
    missing = [spec for spec in specs if canonical(spec) not in set(calibration.specs)]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise BytecompError(f"calibration {calibration.path} has no timings of "
                            f"{', '.join(missing)}: leave {them} out, or make the calibration "
                            f"with {them} (--compressor, --ladder)")
    return specs


def check_backend(calibration: Calibration) -> None:
    """On the ranks: the process group's backend is the calibration's."""
    here = dist.get_backend()
    if here != calibration.meta["backend"]:
        raise BytecompError(f"calibration {calibration.path} does not match this job: backend "
                            f"{calibration.meta['backend']} there, {here} here "
                            f"({HOW_TO_CALIBRATE})")


def _link_size(calibration: Calibration, group: str) -> tuple[int, float]:
    """The size the link check times for ``group`` and the calibration's p10 there."""
    table = calibration.collectives
    rows = table[(table["group"] == group) & (table["collective"] == "allreduce")
                 & (table["dtype"] == "float32")].sort_values("bytes")
    fitting = rows[(rows["bytes"] <= LINK_MAX_BYTES) & (rows["time_ms"] <= LINK_MAX_MS)]
    row = fitting.iloc[-1] if not fitting.empty else rows.iloc[0]
    return int(row["bytes"]), max(float(row["p10_ms"]), 1e-4)


def check_link(calibration: Calibration, topology, device: torch.device,
               tolerance: float = LINK_TOLERANCE) -> dict:
    """Time an fp32 allreduce of each group of the job at one size of the calibration's
    sweep (3 to :data:`LINK_SAMPLES` samples after an untimed one, as many as the first
    says fit in :data:`LINK_BUDGET_S`, each the time of the rank that arrived last, as
    in the sweep) and compare the least with the calibration's p10;
    beyond ``tolerance`` times either way, one line (on every rank: every rank sees the
    same reduced times). Collective: call on every rank. Returns profile.yaml's
    ``calibration.link``."""
    check_backend(calibration)
    checks: list[dict] = []
    for group_name, group, ranks in groups_to_sweep(topology):
        # rank 0's reading of the calibration decides, should the nodes' copies differ
        chosen = torch.tensor(_link_size(calibration, group_name), dtype=torch.float64,
                              device=device)
        dist.broadcast(chosen, src=0)
        nbytes, calibration_ms = int(chosen[0]), float(chosen[1])
        samples = time_allreduce(group_name, group, ranks, nbytes, device, 1)
        count = int(min(LINK_SAMPLES, max(LINK_LEAST_SAMPLES,
                                          LINK_BUDGET_S * 1000 // max(samples[0], 1e-3))))
        samples += time_allreduce(group_name, group, ranks, nbytes, device, count - 1,
                                  warm=False)
        measured_ms = max(round(min(samples), 4), 1e-4)
        checks.append({"group": group_name, "bytes": nbytes, "samples": count,
                       "calibration_ms": calibration_ms, "measured_ms": measured_ms,
                       "ratio": round(measured_ms / calibration_ms, 4)})
    for check in checks:
        if not 1 / tolerance <= check["measured_ms"] / check["calibration_ms"] <= tolerance:
            raise BytecompError(
                f"calibration {calibration.path} was made on another link: a "
                f"{_size(check['bytes'])} fp32 allreduce of the {check['group']} group takes "
                f"at least {check['measured_ms']:.3g} ms here, {check['calibration_ms']:.3g} "
                f"ms there ({_times(check['ratio'])}; at most {tolerance:g}x either way) "
                f"({HOW_TO_CALIBRATE})")
    return {"tolerance": tolerance, "checks": checks}


def _times(ratio: float) -> str:
    return f"{ratio:.3g}x slower here" if ratio >= 1 else f"{1 / ratio:.3g}x faster here"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


# -- the cluster's tables, measured or reused ---------------------------------------------------


@dataclass
class ClusterTables:
    """The measurements a calibration holds, for one profile: the sweeps' rows (with
    their fit checks), the executor's measurement, the sweeps' settings and quality
    section, and where each came from (profile.yaml's ``calibration``)."""

    collectives: Checked
    compressors: Checked
    aggregation: list[dict]
    copies: list[dict]
    executor: ExecutorMeasurement | None
    sweep: dict
    quality: dict
    compress_kernels: str
    sources: dict[str, str] = field(default_factory=dict)

    def record(self, calibration: Calibration | None, link: dict | None) -> dict:
        """profile.yaml's ``calibration``: where each table came from, and which
        calibration, made and measured when, let through by which link check."""
        record: dict = {"tables": dict(self.sources)}
        if calibration is not None:
            record.update(directory=str(calibration.path.resolve()), kind=calibration.kind,
                          created=str(calibration.meta["created"]),
                          measured=calibration.measured, link=link)
        return record


def sweep_meta(sweep: SweepSettings) -> dict:
    """profile.yaml's ``sweep``: its grid, ``max_bytes`` the largest size it reaches."""
    return {"min_bytes": sweep.min_bytes, "max_bytes": sizes(sweep, 1 << 62)[-1],
            "size_factor": sweep.size_factor, "repeats": sweep.repeats,
            "numels": list(sweep.numels_up_to_max())}


def _sweep_some_compressors(keys: set[tuple], devices: list[torch.device],
                            sweep: SweepSettings) -> list[dict]:
    """The compressor sweeps of ``keys`` ((spec, device type) pairs) again."""
    specs = sorted({spec for spec, _ in keys})
    chosen = [device for device in devices if any(d == device.type for _, d in keys)]
    return [row for row in sweep_compressors(specs, chosen, sweep)
            if (row["spec"], row["device"]) in keys]


def _stage(reporter, stage: str, steps: int, budget_s: float | None, scale: float):
    """A cluster stage's allowance (its share of the budget) and its progress."""
    allowance = Allowance.of(stage, budget_s, scale)
    more = "a larger --budget gives it more; --quick shortens it" if stage != "copy sweeps" \
        else "a larger --budget gives it more"
    return allowance, reporter.phase(stage, steps, allowance.seconds if allowance else None,
                                     more)


def measure_executor_here(device, nodes: int, warmup: int, iterations: int, quick: bool,
                          reporter, budget_s: float | None = None,
                          scale: float = 1.0) -> ExecutorMeasurement:
    rounds = iterations if quick else 2 * iterations
    allowance, progress = _stage(reporter, "executor fixed costs", warmup + rounds, budget_s,
                                 scale)
    return measure_executor(device, nodes, warmup, rounds, progress,
                            QUICK_BUSY_DIM if quick else BUSY_DIM, allowance)


def measure_cluster(specs: list[str], topology, device: torch.device,
                    devices: list[torch.device], sweep: SweepSettings, warmup: int,
                    iterations: int, quick: bool, reporter, budget_s: float | None = None,
                    scale: float = 1.0) -> ClusterTables:
    """Measure every cluster table on this job (collective: call on every rank): the
    collective, compressor, aggregation and copy sweeps, each fit measured again while
    poor and its stage has time (:mod:`bytecomp.profiler.quality`), and the executor
    (``warmup`` and ``iterations`` rounds, or twice as many rounds without ``quick``).
    With ``budget_s``, each stage gets its share of it (``scale`` times its share:
    :mod:`bytecomp.profiler.budget`); what stays poor is one line."""
    allowance, progress = _stage(reporter, "collective sweeps",
                                 collective_steps(topology, sweep), budget_s, scale)
    timed = replace(sweep, allowance=allowance)
    collectives = remeasure(
        sweep_collectives(topology, device, timed, progress), collective_quality,
        lambda keys: sweep_collectives(topology, device, timed, only=keys),
        COLLECTIVE_KEY, "bytes", ("time_ms",), allowance=allowance)
    allowance, progress = _stage(reporter, "compressor sweeps",
                                 compressor_steps(specs, devices, sweep), budget_s, scale)
    timed = replace(sweep, allowance=allowance)
    compressors = remeasure(
        sweep_compressors(specs, devices, timed, progress), compressor_quality,
        lambda keys: _sweep_some_compressors(keys, devices, timed),
        COMPRESSOR_KEY, "numel", ("encode_ms", "decode_ms", "advance_ms"),
        allowance=allowance)
    allowance, progress = _stage(reporter, "aggregation sweeps",
                                 aggregation_steps(specs, devices, sweep), budget_s, scale)
    aggregation = sweep_aggregation(specs, devices, replace(sweep, allowance=allowance),
                                    progress)
    _, progress = _stage(reporter, "copy sweeps", 1, budget_s, scale)
    copies = sweep_copies(device, sweep, progress)
    executor = measure_executor_here(device, topology.nodes, warmup, iterations, quick,
                                     reporter, budget_s, scale)
    summary = poor_summary(collectives.poor + compressors.poor)
    reporter.end_phase()
    if summary:
        reporter.warn(summary)
    return ClusterTables(collectives, compressors, aggregation, copies, executor,
                         sweep_meta(sweep), quality_meta(collectives, compressors),
                         kernels.describe(device),
                         dict.fromkeys(("collectives", "compressors", "aggregation", "copies",
                                        "executor"), "measured"))


def _rows(table: pd.DataFrame, specs: list[str] | None = None) -> list[dict]:
    if specs is not None:
        table = table[table["spec"].map(canonical).isin(set(map(canonical, specs)))]
    return table.to_dict("records")


def _kept_quality(quality: dict | None, collectives: list[dict],
                  compressors: list[dict]) -> dict:
    """The calibration's quality section, naming only the series the profile keeps."""
    quality = dict(quality or {})
    fits = {f"collective {r['collective']}/{r['group']}/{r['dtype']}" for r in collectives} | \
        {f"compressor {r['spec']}/{r['device']}" for r in compressors}
    if "remeasured" in quality:
        quality["remeasured"] = [name for name in quality["remeasured"] if name in fits]
    if "poor" in quality:
        quality["poor"] = [fit for fit in quality["poor"] if fit["fit"] in fits]
    return quality


def reuse_cluster(calibration: Calibration, specs: list[str]) -> ClusterTables:
    """The cluster tables of ``calibration``, its compressor rows those of ``specs``; the
    executor's measurement where it has one (else None: measure it here)."""
    collectives = _rows(calibration.collectives)
    compressors = _rows(calibration.compressors, specs)
    executor = calibration.executor()
    sources = dict.fromkeys(("collectives", "compressors", "aggregation", "copies"),
                            "calibration")
    sources["executor"] = "calibration" if executor is not None else "measured"
    meta = calibration.meta
    return ClusterTables(Checked(collectives), Checked(compressors),
                         _rows(calibration.aggregation, specs), _rows(calibration.copies),
                         executor, dict(meta.get("sweep") or {}),
                         _kept_quality(meta.get("quality"), collectives, compressors),
                         str(meta.get("compress_kernels", "torch")), sources)


# -- a calibration written, and checked before any rank starts ---------------------------------


def calibration_meta(config, tables: ClusterTables, topology, device,
                     cache_key=None) -> CalibrationMeta:
    """calibration.yaml of ``tables`` measured on this job (``cache_key``: the cache's
    entry, which records the key it was written for)."""
    meta: CalibrationMeta = {
        **calibration_head(config, topology, device, tables.compress_kernels),
        "compressor_specs": list(config.specs),
        "executor": {"measured": tables.executor.to_meta()} if tables.executor else {},
        "quality": tables.quality,
        "sweep": tables.sweep,
    }
    if cache_key is not None:
        meta["cache_key"] = asdict(cache_key)
    return meta


def write_calibration(out, force: bool, meta: CalibrationMeta, tables: ClusterTables) -> None:
    """A calibration directory of ``tables`` at ``out``, written whole or not at all."""
    frames = {"collectives": tables.collectives.rows, "compressors": tables.compressors.rows,
              "aggregation": tables.aggregation, "copies": tables.copies}
    with directory_atomic(out, force) as temporary:
        (temporary / CALIBRATION_FILE).write_text(
            dump_yaml(meta, sort_keys=False, default_flow_style=False))
        for name, rows in frames.items():
            columns = list(TABLES[name]) + (["advance_ms"] if name == "compressors" else [])
            pd.DataFrame(rows, columns=columns).to_csv(temporary / f"{name}.csv", index=False)


def local_job(config, nproc: int | None) -> tuple[int, int, int, torch.device]:
    """This job's nodes, ranks per node, threads per rank and rank 0's device, before any
    rank starts: from torchrun's environment, else ``nproc`` local ranks on one node."""
    from bytecomp.launch import in_torchrun, threads_per_rank, torchrun_shape

    if in_torchrun():
        shape = torchrun_shape()
        nodes, per_node, threads = shape.nodes, shape.ranks_per_node, torch.get_num_threads()
    else:
        nodes, per_node = 1, 1 if nproc is None else nproc
        threads = threads_per_rank(per_node)
    return nodes, per_node, threads, pick_device(config.device, 0)


def check_before_ranks(config, nproc: int | None) -> list[Path]:
    """In the parent, before any rank starts: ``config.calibration`` is a valid
    calibration made on a job like this one (:func:`check_job`); ``config.specs`` become
    its specs where none were named (:func:`select_specs`). Returns the files it reads,
    which no output may overwrite."""
    calibration = load_calibration(config.calibration)
    nodes, per_node, threads, device = local_job(config, nproc)
    check_job(calibration, nodes, per_node, device.type, device_name(device),
              kernels.describe(device), threads)
    config.specs = select_specs(calibration, config.specs, config.named_specs)
    return [path for path in calibration_files(calibration.path) if path.exists()]
