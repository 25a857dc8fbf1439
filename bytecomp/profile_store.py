"""The profile directory: ``profile.yaml`` plus CSV tables (docs/formats.md).

``save_profile`` writes it atomically; ``load_profile`` validates every file
and reports a bad one with its path, the column or field and the reason;
``check_profile`` validates a :class:`Profile` held in memory (perhaps edited) with the
same checks, naming the attribute instead of the file.

It sits beside :mod:`bytecomp.plan_file` rather than in a stage: the profiler writes
profiles, the models and the planner read them, and neither stage imports the other
for it.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from bytecomp.compress import canonical, from_spec
from bytecomp.errors import BytecompError
from bytecomp.files import (
    check_input_directory,
    control_character,
    directory_atomic,
    dump_yaml,
    read_text_file,
    read_yaml_file,
)
from bytecomp.plan_file import MAX_BUCKET_CAP_MB

FORMAT_VERSION = 1
TIME_NAMES = ("forward", "backward", "optimizer", "iteration")
REQUIRED_TIMES = (*TIME_NAMES, "backward_compute")  # what plan and simulate use
ELEMENT_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}  # dtypes planned
COLLECTIVE_NAMES = ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast"]
COLLECTIVE_DTYPES = ["float32", "float16", "uint8"]  # profile/sweeps.py DTYPES
COPY_DIRECTIONS = ["d2h", "h2d", "d2d"]
SHAPE = r"(\d+(x\d+)*)?"  # 64x3x3x3; empty for a scalar
# Bounds on what a real profile can hold: beyond them a number is an error, not a model.
MAX_INTEGER = 1 << 50  # elements or bytes
MAX_MS = 1e7  # 2.8 hours
MAX_COUNT = 1 << 20  # ranks, nodes, batch
READY_SLACK = 0.01
PHASE_SLACK = 0.1  # a phase's median against the iteration's (timed apart, so not additive)
BACKENDS = ("gloo", "nccl")  # ready times and backward time are medians rounded to 0.1 us
EXECUTOR_PATHS = ("direct", "fifo", "host")  # bytecomp.model.overheads.PATHS
MAX_STEPS_FACTOR = 10.0  # bytecomp.profiler.probe.MAX_FACTOR
# what the convergence probe measured its losses on (bytecomp.profiler.workloads)
PROBE_BATCHES = ("validation", "held-out training batches")
# the tables a calibration holds (bytecomp.profiler.calibration), and where a profile's came from
CLUSTER_TABLES = ("collectives", "compressors", "aggregation", "copies", "executor")
TABLE_SOURCES = ("measured", "calibration")
CALIBRATION_KINDS = ("calibration", "profile")  # a --calibrate-only directory, or a profile
MAX_LINK_TOLERANCE = 1000.0

TABLES = {
    "tensors": {"name": str, "shape": str, "numel": int, "dtype": str, "bytes": int,
                "ready_ms": float, "bucket": int},
    "collectives": {"collective": str, "group": str, "dtype": str, "bytes": int, "ranks": int,
                    "time_ms": float, "p10_ms": float, "p90_ms": float},
    "compressors": {"spec": str, "device": str, "numel": int, "encode_ms": float,
                    "decode_ms": float, "payload_bytes": int},
    "copies": {"direction": str, "bytes": int, "time_ms": float},
    "fidelity": {"tensor": str, "spec": str, "gain": float, "gain_p10": float,
                 "gain_p90": float, "norm_share": float},
    "probe": {"spec": str, "steps_factor": float, "steps": int},
    "aggregation": {"spec": str, "device": str, "numel": int, "one_ms": float,
                    "each_ms": float},
}
OPTIONAL_TABLES = ("copies", "fidelity", "probe", "aggregation")  # profiles without them load
# tables written before these columns existed load (an advance_ms of 0 is the old reading)
OPTIONAL_COLUMNS = {"probe": {"gain": float}, "compressors": {"advance_ms": float}}
NON_NEGATIVE = {"numel", "bytes", "ready_ms", "ranks", "time_ms", "p10_ms", "p90_ms",
                "encode_ms", "decode_ms", "advance_ms", "payload_bytes", "steps_factor", "steps",
                "one_ms", "each_ms"}
FRACTIONS = {"gain", "gain_p10", "gain_p90", "norm_share"}  # between 0 and 1
REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format_version": int, "model": dict, "device": dict, "backend": str, "world_size": int,
    "nodes": int, "ranks_per_node": int, "batch_size": int, "bucket_cap_mb": (int, float),
    "times": dict,
}


@dataclass
class Profile:
    """A measured profile: ``meta`` is profile.yaml, the rest its tables."""

    meta: dict
    tensors: pd.DataFrame
    collectives: pd.DataFrame
    compressors: pd.DataFrame
    copies: pd.DataFrame = field(default_factory=lambda: empty_table("copies"))
    path: Path | None = None
    fidelity: pd.DataFrame = field(default_factory=lambda: empty_table("fidelity"))
    probe: pd.DataFrame = field(default_factory=lambda: empty_table("probe"))
    aggregation: pd.DataFrame = field(default_factory=lambda: empty_table("aggregation"))

    @property
    def has_fidelity(self) -> bool:
        """Whether the profile measured gradient fidelity (profiles before it did not)."""
        return not self.fidelity.empty

    @property
    def probe_gains(self) -> dict[str, float]:
        """The convergence probe's gain by spec, where it recorded one."""
        if "gain" not in self.probe.columns:
            return {}
        return {str(row.spec): float(row.gain) for row in self.probe.itertuples()}

    @property
    def steps_factors(self) -> dict[str, float]:
        """The convergence probe's steps factor by spec (empty: no probe)."""
        return {str(row.spec): float(row.steps_factor) for row in self.probe.itertuples()}

    def recipe_optimizer(self) -> str | None:
        """The optimizer spec the profile's recipe trained with; None where the factory
        built its own (building the workload builds it again) or the profile predates
        recipes (the workload's default then)."""
        from bytecomp.recipe import parse_optimizer

        spec = (self.meta.get("recipe") or {}).get("optimizer")
        if not isinstance(spec, str):
            return None
        try:
            return parse_optimizer(spec).spec
        except BytecompError:
            return None  # "the factory's (...)"

    def recipe_scheduler(self) -> str | None:
        """The learning-rate schedule spec the profile's recipe trained with; None where it
        had none, the factory built its own (building the workload builds it again) or
        the profile predates schedules."""
        from bytecomp.recipe import parse_scheduler

        spec = (self.meta.get("recipe") or {}).get("scheduler")
        if not isinstance(spec, str):
            return None
        try:
            return parse_scheduler(spec).spec
        except BytecompError:
            return None  # "the factory's (...)"

    def evidence(self) -> tuple[bool, str]:
        """What convergence evidence the profile holds, in words, and whether it holds any
        (measured steps factors) or only the one-step gains."""
        probe = self.meta.get("probe") or {}
        if self.steps_factors:
            batches = probe.get("batches", "validation")
            return True, (f"the convergence probe ({int(probe.get('steps', 0))} steps of each "
                          f"compressor, losses on {batches}) calibrates the gains")
        if not self.has_fidelity:
            return False, "no convergence evidence: the profile measured neither gains nor a probe"
        if probe.get("informative") is False:
            return False, (f"raw gains only: in the convergence probe ({probe.get('ran_steps')} "
                           f"steps) fp32 DDP's loss fell {100 * probe['fp32_improvement']:.1f}%, "
                           f"too little to tell compressors apart")
        return False, ("raw gains only: the profile has no convergence probe (bytecomp profile "
                       "--probe-steps N measures one)")

    @property
    def world_size(self) -> int:
        return int(self.meta["world_size"])

    @property
    def nodes(self) -> int:
        return int(self.meta["nodes"])

    @property
    def ranks_per_node(self) -> int:
        return int(self.meta["ranks_per_node"])

    @property
    def fingerprint(self) -> str:
        return self.meta["model"]["fingerprint"]

    @property
    def device_type(self) -> str:
        return self.meta["device"]["type"]

    @property
    def bucket_cap_mb(self) -> float:
        return float(self.meta["bucket_cap_mb"])

    def time_ms(self, name: str, statistic: str = "median_ms") -> float:
        return float(self.meta["times"][name][statistic])

    @property
    def label(self) -> str:
        return str(self.path) if self.path else self.meta["model"]["name"]


def empty_table(name: str) -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype=object if kind is str else kind)
                         for column, kind in TABLES[name].items()})


def save_profile(profile: Profile, directory, force: bool = False) -> Path:
    """Write ``directory/profile.yaml`` and the CSV tables, atomically."""
    with directory_atomic(directory, force) as temporary:
        (temporary / "profile.yaml").write_text(
            dump_yaml(profile.meta, sort_keys=False, default_flow_style=False))
        for name in TABLES:
            table = getattr(profile, name)
            columns = list(TABLES[name]) + [c for c in OPTIONAL_COLUMNS.get(name, {})
                                            if c in table.columns]
            table.to_csv(temporary / f"{name}.csv", index=False, columns=columns)
    return Path(directory)


def _fail(path: Path | str, message: str):
    raise BytecompError(f"{path}: {message}")


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _check_finite(path: Path | str, value, where: str = "") -> None:
    """Every number anywhere in profile.yaml must be finite (a NaN compares false with
    everything, so it slips through range checks and hangs or corrupts the models)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(path, item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(path, item, f"{where}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        _fail(path, f"field '{where}' is {value} (must be a finite number)")


def _check_interference(path: Path | str, entry) -> None:
    """Optional: shares of the compute stream lost to communication, in [0, 1), and what a
    collective waits while the rank computes (ms)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        _fail(path, "field 'interference' must be a mapping")
    for key in ("fraction", "intra_fraction"):
        value = entry.get(key, 0.0)
        if not _number(value) or not 0 <= value < 1:
            _fail(path, f"field 'interference.{key}' must be a number in [0, 1)")
    for key in ("busy_collective_ms", "collective_alone_ms", "collective_busy_ms"):
        if not _milliseconds(entry.get(key, 0.0)):
            _fail(path, f"field 'interference.{key}' must be a non-negative number of ms")


def _milliseconds(value) -> bool:
    return _number(value) and math.isfinite(value) and 0 <= value < MAX_MS


def _check_executor(path: Path | str, entry) -> None:
    """Optional: the executor's fixed costs (model/overheads.py), in milliseconds."""
    if entry is None:
        return
    if not isinstance(entry, dict) or not isinstance(entry.get("paths"), dict):
        _fail(path, "field 'executor' must be a mapping with 'bucket_ms' and 'paths'")
    if not _milliseconds(entry.get("bucket_ms")):
        _fail(path, "field 'executor.bucket_ms' must be a non-negative number of ms")
    for name in EXECUTOR_PATHS:
        costs = entry["paths"].get(name)
        for key in ("hook_ms", "tail_ms"):
            if not isinstance(costs, dict) or not _milliseconds(costs.get(key)):
                _fail(path, f"field 'executor.paths.{name}.{key}' must be a non-negative "
                            f"number of ms")
    check_executor_measured(path, entry.get("measured"))


# executor.measured holds differences of medians per added group or bucket: noise may take
# one a little below 0 (the fixed costs derived from it are clamped at 0), never by more
MIN_DIFFERENCE_MS = -1.0


def _difference_ms(value) -> bool:
    return _number(value) and math.isfinite(value) and MIN_DIFFERENCE_MS <= value < MAX_MS


def check_executor_measured(path: Path | str, entry, where: str = "executor.measured") -> None:
    """Optional: what the executor's fixed costs were derived from
    (:class:`bytecomp.profiler.overheads.ExecutorMeasurement`): per path the backward's
    ms per added group (``added_ms``, ``hook_added_ms``, on a CPU job ``busy_added_ms``)
    and ``bucket_ms`` per added bucket; differences of medians, so they may be a little
    below 0 (down to :data:`MIN_DIFFERENCE_MS`)."""
    span = f"a number of ms from {MIN_DIFFERENCE_MS:g} (noise below 0) to {MAX_MS:g}"
    if entry is None:
        return
    if not isinstance(entry, dict):
        _fail(path, f"field '{where}' must be a mapping with added_ms, hook_added_ms and "
                    f"bucket_ms")
    if not _difference_ms(entry.get("bucket_ms")):
        _fail(path, f"field '{where}.bucket_ms' must be {span}, got "
                    f"{repr(entry.get('bucket_ms'))[:60]}")
    for key in ("added_ms", "hook_added_ms", "busy_added_ms"):
        if key == "busy_added_ms" and entry.get(key) is None:
            continue
        paths = entry.get(key)
        if not isinstance(paths, dict) or set(paths) != set(EXECUTOR_PATHS):
            _fail(path, f"field '{where}.{key}' must map each of {', '.join(EXECUTOR_PATHS)} "
                        f"to a number of ms")
        for name in EXECUTOR_PATHS:
            if not _difference_ms(paths[name]):
                _fail(path, f"field '{where}.{key}.{name}' must be {span}, got "
                            f"{repr(paths[name])[:60]}")


def _iso_time(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _check_calibration(path: Path | str, entry, meta: dict) -> None:
    """Optional (profiles before calibrations have none: every table measured): where
    each cluster table came from, and with one from a calibration directory, which,
    when it was made and measured, and the link check that allowed it."""
    if entry is None:
        return
    if not isinstance(entry, dict) or not isinstance(entry.get("tables"), dict):
        _fail(path, "field 'calibration' must be a mapping with 'tables'")
    for name, source in entry["tables"].items():
        if name not in CLUSTER_TABLES:
            _fail(path, f"field 'calibration.tables' names {str(name)[:100]!r}, which is not "
                        f"one of {', '.join(CLUSTER_TABLES)}")
        if source not in TABLE_SOURCES:
            _fail(path, f"field 'calibration.tables.{name}' must be one of "
                        f"{', '.join(TABLE_SOURCES)}")
    if "calibration" not in entry["tables"].values():
        for key in ("directory", "kind", "created", "measured", "link"):
            if key in entry:
                _fail(path, f"field 'calibration.{key}' is set, but no table came from a "
                            f"calibration (calibration.tables)")
        return
    directory = entry.get("directory")
    if not isinstance(directory, str) or not directory.strip() or len(directory) > 4096 \
            or control_character(directory):
        _fail(path, "field 'calibration.directory' must be the calibration's path (printable "
                    "text)")
    if entry.get("kind") not in CALIBRATION_KINDS:
        _fail(path, f"field 'calibration.kind' must be one of {', '.join(CALIBRATION_KINDS)}")
    for key in ("created", "measured"):
        if not _iso_time(entry.get(key)):
            _fail(path, f"field 'calibration.{key}' must be a time (ISO 8601)")
    link = entry.get("link")
    if not isinstance(link, dict) or not isinstance(link.get("checks"), list) or \
            not link["checks"]:
        _fail(path, "field 'calibration.link' must be a mapping with tolerance and checks "
                    "(a list of the allreduces timed)")
    tolerance = link.get("tolerance")
    if not _number(tolerance) or not 1 < tolerance <= MAX_LINK_TOLERANCE:
        _fail(path, f"field 'calibration.link.tolerance' must be a number above 1 and at "
                    f"most {MAX_LINK_TOLERANCE:g}, got {tolerance!r}")
    groups = {"world"} | ({"inter"} if meta["nodes"] > 1 else set()) | \
        ({"intra"} if meta["nodes"] > 1 and meta["ranks_per_node"] > 1 else set())
    for index, check in enumerate(link["checks"]):
        where = f"calibration.link.checks[{index}]"
        if not isinstance(check, dict) or check.get("group") not in groups:
            _fail(path, f"field '{where}' must be a mapping whose group is one of this job's "
                        f"({', '.join(sorted(groups))})")
        for key, least in (("bytes", 1), ("samples", 1)):
            value = check.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not least <= value <= MAX_INTEGER:
                _fail(path, f"field '{where}.{key}' must be a positive integer, got {value!r}")
        for key in ("calibration_ms", "measured_ms"):
            if not _milliseconds(check.get(key)) or check[key] <= 0:
                _fail(path, f"field '{where}.{key}' must be a positive number of ms below "
                            f"{MAX_MS:g}")
        ratio = check.get("ratio")
        expected = check["measured_ms"] / check["calibration_ms"]
        if not _number(ratio) or not math.isclose(ratio, expected, rel_tol=1e-3):
            _fail(path, f"field '{where}.ratio' must be measured_ms / calibration_ms "
                        f"({expected:.4g}), got {ratio!r}")
        if not 1 / tolerance <= ratio <= tolerance:
            _fail(path, f"field '{where}.ratio' ({ratio:g}) is beyond the tolerance "
                        f"({tolerance:g}x either way): such a calibration is refused")


MAX_SECONDS = 1e7  # informative durations (a stage, the probe): at most about four months


def _seconds(value) -> bool:
    return _number(value) and 0 <= value <= MAX_SECONDS


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _check_stages(path: Path | str, entry) -> None:
    """Optional: seconds each stage of the profile took, by name (informative)."""
    if entry is None:
        return
    if not isinstance(entry, dict) or len(entry) > 100:
        _fail(path, "field 'stages_s' must be a mapping of stage names to seconds")
    for name, seconds in entry.items():
        if not isinstance(name, str) or not name.isprintable() or len(name) > 200:
            _fail(path, f"field 'stages_s' has a bad stage name {str(name)[:40]!r}")
        if not _seconds(seconds):
            _fail(path, f"field 'stages_s.{name}' must be seconds from 0 to 1e7, got "
                        f"{seconds!r}")


def _check_probe_meta(path: Path | str, entry) -> None:
    """Optional: the convergence probe's settings (its steps are named in plan's notes)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        _fail(path, "field 'probe' must be a mapping")
    for key in ("steps", "ran_steps", "planned_steps"):
        value = entry.get(key, 0)
        if not _count(value):
            _fail(path, f"field 'probe.{key}' must be an integer from 0 to {MAX_COUNT:,}, "
                        f"got {value!r}")
    if entry.get("batches", "validation") not in PROBE_BATCHES:
        _fail(path, f"field 'probe.batches' must be one of {', '.join(PROBE_BATCHES)}")
    fell = entry.get("fp32_improvement", 0.0)
    if isinstance(fell, bool) or not isinstance(fell, (int, float)) or not 0 <= fell <= 1:
        _fail(path, f"field 'probe.fp32_improvement' must be a fraction from 0 to 1, "
                    f"got {fell!r}")
    if not isinstance(entry.get("informative", True), bool):
        _fail(path, "field 'probe.informative' must be true or false")
    seconds = entry.get("seconds", 0.0)
    if not _seconds(seconds):
        _fail(path, f"field 'probe.seconds' must be seconds from 0 to 1e7, got {seconds!r}")
    if not isinstance(entry.get("stopped_by_budget", False), bool):
        _fail(path, "field 'probe.stopped_by_budget' must be true or false")
    if entry.get("length", "budget") not in ("budget", "--probe-steps"):
        _fail(path, "field 'probe.length' must be budget or --probe-steps")


MAX_RETRIES = 100  # the quality section's retries (bytecomp.profiler.quality.RETRIES)


def _check_quality(path: Path | str, entry) -> None:
    """Optional: the sweeps' fit quality (bytecomp.profiler.quality): the thresholds, the
    retries, the fits measured again and those that stayed poor (names checked against
    the tables by :func:`_check_quality_fits`)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        _fail(path, "field 'quality' must be a mapping")
    r2 = entry.get("min_r2", 0.0)
    if not _number(r2) or not 0 <= r2 <= 1:
        _fail(path, f"field 'quality.min_r2' must be a number from 0 to 1, got {r2!r}")
    worst = entry.get("max_worst_relative_error", 0.0)
    if not _number(worst) or not 0 <= worst <= MAX_INTEGER:
        _fail(path, f"field 'quality.max_worst_relative_error' must be a non-negative "
                    f"number, got {worst!r}")
    retries = entry.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or \
            not 0 <= retries <= MAX_RETRIES:
        _fail(path, f"field 'quality.retries' must be an integer from 0 to {MAX_RETRIES}, "
                    f"got {retries!r}")
    remeasured = entry.get("remeasured", [])
    if not isinstance(remeasured, list) or not all(isinstance(n, str) for n in remeasured):
        _fail(path, "field 'quality.remeasured' must be a list of fit names")
    poor = entry.get("poor", [])
    if not isinstance(poor, list):
        _fail(path, "field 'quality.poor' must be a list")
    for index, fit in enumerate(poor):
        where = f"quality.poor[{index}]"
        if not isinstance(fit, dict) or not isinstance(fit.get("fit"), str):
            _fail(path, f"field '{where}' must be a mapping with fit (a name), r2 and "
                        f"worst_relative_error")
        r2 = fit.get("r2")
        if not _number(r2) or not -MAX_INTEGER <= r2 <= 1:  # R^2 of a bad fit: below 0
            _fail(path, f"field '{where}.r2' must be a number at most 1, got {r2!r}")
        worst = fit.get("worst_relative_error")
        if not _number(worst) or not 0 <= worst <= MAX_INTEGER:
            _fail(path, f"field '{where}.worst_relative_error' must be a non-negative number, "
                        f"got {worst!r}")


def _check_quality_fits(path: Path | str, entry, collectives: pd.DataFrame,
                        compressors: pd.DataFrame) -> None:
    """Every fit the quality section names is a sweep of collectives.csv
    (``collective allreduce/world/float32``) or compressors.csv (``compressor
    topk:ratio=0.01/cpu``)."""
    if not isinstance(entry, dict):
        return
    series = [("collective", collectives[["collective", "group", "dtype"]]),
              ("compressor", compressors[["spec", "device"]])]
    fits = {f"{kind} " + "/".join(map(str, key)) for kind, table in series
            for key in table.drop_duplicates().itertuples(index=False)}
    named = [(f"quality.remeasured[{i}]", name) for i, name in
             enumerate(entry.get("remeasured", []))]
    named += [(f"quality.poor[{i}].fit", fit["fit"]) for i, fit in
              enumerate(entry.get("poor", []))]
    for where, name in named:
        if name not in fits:
            _fail(path, f"field '{where}' names {name[:200]!r}, which is no sweep of "
                        f"collectives.csv or compressors.csv")


def _check_times(path: Path | str, times: dict) -> None:
    """Every phase: a mapping of statistics in ms (median_ms at least); the phases the
    planner and simulator use must be there."""
    for name in REQUIRED_TIMES:
        if name not in times:
            _fail(path, f"missing field 'times.{name}' (re-run bytecomp profile)")
    for name, entry in times.items():
        if not isinstance(entry, dict) or "median_ms" not in entry:
            _fail(path, f"field 'times.{name}' must be a mapping with median_ms")
        for statistic, value in entry.items():
            if not _milliseconds(value):
                _fail(path, f"field 'times.{name}.{statistic}' must be a non-negative number "
                            f"of ms below {MAX_MS:g}, got {value!r}")


def _check_phases(path: Path | str, times: dict) -> None:
    """No phase of an iteration longer than the iteration (medians of separate timings do
    not add up exactly: a phase may exceed it by PHASE_SLACK)."""
    for suffix in ("", "_compute"):
        whole = times.get(f"iteration{suffix}")
        if whole is None:
            continue
        limit = whole["median_ms"] * (1 + PHASE_SLACK) + 0.05
        for phase in ("forward", "backward", "optimizer"):
            part = times.get(f"{phase}{suffix}")
            if part is not None and part["median_ms"] > limit:
                _fail(path, f"field 'times.{phase}{suffix}.median_ms' ({part['median_ms']:g} ms) "
                            f"is longer than the whole iteration{suffix} "
                            f"({whole['median_ms']:g} ms)")


def read_document(path: Path, what: str, required: dict) -> dict:
    """A bytecomp YAML document (profile.yaml, calibration.yaml): a mapping with the
    ``required`` fields of their types (a bool is no number), every number finite, of
    this bytecomp's format version; else one line naming ``path``."""
    return check_document(path, read_yaml_file(path, what), required)


def check_document(path: Path | str, meta, required: dict) -> dict:
    """:func:`read_document`'s checks of a document already read (``meta``)."""
    if not isinstance(meta, dict):
        _fail(path, "must be a YAML mapping")
    for key, kind in required.items():
        if key not in meta:
            _fail(path, f"missing field '{key}'")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            _fail(path, f"field '{key}' has the wrong type ({type(meta[key]).__name__})")
    _check_finite(path, meta)
    if meta["format_version"] != FORMAT_VERSION:
        _fail(path, f"format_version {meta['format_version']} is not supported "
                    f"(this bytecomp reads {FORMAT_VERSION})")
    return meta


def _load_meta(path: Path) -> dict:
    if not path.exists():
        _fail(path, "missing (is this a profile directory made by bytecomp profile?)")
    meta = read_document(path, "profile file", REQUIRED_FIELDS)
    _check_meta(path, meta)
    return meta


def _check_meta(path: Path | str, meta: dict) -> None:
    """profile.yaml's fields, after :func:`check_document`: each in range, and consistent
    with each other."""
    for key in ("world_size", "nodes", "ranks_per_node", "batch_size"):
        if not 1 <= meta[key] <= MAX_COUNT:
            _fail(path, f"field '{key}' must be between 1 and {MAX_COUNT:,}")
    if not 0 < meta["bucket_cap_mb"] <= MAX_BUCKET_CAP_MB:
        _fail(path, f"field 'bucket_cap_mb' must be a positive number (at most "
                    f"{MAX_BUCKET_CAP_MB:g})")
    if meta["nodes"] * meta["ranks_per_node"] != meta["world_size"]:
        _fail(path, "nodes x ranks_per_node must equal world_size")
    fingerprint = meta["model"].get("fingerprint")
    if fingerprint is None:
        _fail(path, "field 'model.fingerprint' is missing")
    if not isinstance(fingerprint, str) or not fingerprint.strip():
        _fail(path, f"field 'model.fingerprint' must be the model's fingerprint (a string of "
                    f"hex digits), got {type(fingerprint).__name__} {fingerprint!r}")
    for key in ("name", "spec"):  # what the plan records, and the finalists build
        value = meta["model"].get(key)
        if value is None:
            _fail(path, f"field 'model.{key}' is missing")
        if not isinstance(value, str) or not value.strip() or control_character(value):
            _fail(path, f"field 'model.{key}' must be the model's {key} (printable text), "
                        f"got {type(value).__name__} {str(value)[:100]!r}")
    for key in ("tensors", "parameters"):
        value = meta["model"].get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_INTEGER):
            _fail(path, f"field 'model.{key}' must be a positive integer, got {value!r}")
    if meta["backend"] not in BACKENDS and not (meta.get("synthetic") is True and
                                                meta["backend"] == "synthetic"):
        _fail(path, f"field 'backend' must be one of {', '.join(BACKENDS)} (what bytecomp "
                    f"profiles on), got {meta['backend']!r}")
    if meta["device"].get("type") not in ("cpu", "cuda"):
        _fail(path, "field 'device.type' must be cpu or cuda")
    _check_interference(path, meta.get("interference"))
    _check_executor(path, meta.get("executor"))
    _check_probe_meta(path, meta.get("probe"))
    _check_stages(path, meta.get("stages_s"))
    _check_quality(path, meta.get("quality"))
    _check_calibration(path, meta.get("calibration"), meta)
    _check_times(path, meta["times"])
    _check_phases(path, meta["times"])


def _row_fail(path: Path | str, table: pd.DataFrame, mask, column: str, reason: str,
              show: bool = True) -> None:
    """Fail on the first row where ``mask`` holds, naming it (rows count from 1) and,
    with ``show``, its value."""
    mask = np.asarray(mask, dtype=bool)
    if mask.any():
        row = int(mask.argmax())
        value = table[column].iloc[row]
        value = value.item() if isinstance(value, np.generic) else value
        _fail(path, f"column '{column}', row {row + 1}: " + (f"{value!r} " if show else "")
              + reason)


def _load_table(directory: Path, name: str, required: bool = True) -> pd.DataFrame:
    path = directory / f"{name}.csv"
    if not path.exists() and not path.is_symlink():
        if required:
            _fail(path, "missing")
        return empty_table(name)
    text = read_text_file(path, "profile table")
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except Exception as error:  # pandas raises several kinds for a malformed table
        _fail(path, f"not a readable CSV table ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''})")
    return _typed_table(path, name, table)


def _typed_table(path: Path | str, name: str, table: pd.DataFrame) -> pd.DataFrame:
    """Table ``name``'s columns there, each value of its column's type and in range, the
    numbers as numbers (``table`` is changed: a copy where it is the caller's)."""
    optional = OPTIONAL_COLUMNS.get(name, {})
    for column, kind in {**TABLES[name], **optional}.items():
        if column not in table.columns:
            if column in optional:
                continue
            _fail(path, f"missing column '{column}'")
        if kind is str:  # always so as read; a table edited in memory may hold anything
            strings = table[column].map(lambda value: isinstance(value, str)).astype(bool)
            _row_fail(path, table, ~strings, column, "is not a string")
            continue
        numbers = pd.to_numeric(table[column], errors="coerce").astype(float)
        _row_fail(path, table, ~np.isfinite(numbers), column, "is not a number")
        if kind is int:
            _row_fail(path, table, (numbers != np.round(numbers)) | (numbers.abs() > MAX_INTEGER),
                      column, f"is not an integer (at most {MAX_INTEGER:.3g})")
        if column in NON_NEGATIVE:
            _row_fail(path, table, numbers < 0, column, "must not be negative", show=False)
        if column.endswith("_ms"):
            _row_fail(path, table, numbers >= MAX_MS, column, f"is not below {MAX_MS:g} ms")
        if column in FRACTIONS:
            _row_fail(path, table, (numbers < 0) | (numbers > 1), column,
                      "must be between 0 and 1", show=False)
        table[column] = numbers.astype(kind)
    return table


def _check_tensors(path: Path | str, tensors: pd.DataFrame, meta: dict) -> None:
    """Each row one parameter: numel a positive integer matching its shape, bytes numel x
    the dtype's size, a supported dtype, ready times in ready order within the backward
    pass."""
    if tensors.empty:
        _fail(path, "has no rows")
    _row_fail(path, tensors, tensors["name"].str.strip() == "", "name", "is empty")
    _row_fail(path, tensors, tensors["name"].duplicated(), "name", "appears twice")
    _row_fail(path, tensors, tensors["name"].map(control_character).notna(), "name",
              "holds a control character (a name is printed: no escape sequences)")
    _row_fail(path, tensors, tensors["numel"] < 1, "numel", "must be at least 1")
    shapes = tensors["shape"].astype(str)
    _row_fail(path, tensors, ~shapes.str.fullmatch(SHAPE), "shape",
              "is not a shape (sizes joined by x, like 64x3x3x3)")
    products = [math.prod(int(size) for size in shape.split("x") if size) for shape in shapes]
    _row_fail(path, tensors, np.array(products, dtype=object) != tensors["numel"].to_numpy(),
              "shape", "does not hold numel elements")
    _row_fail(path, tensors, ~tensors["dtype"].isin(list(ELEMENT_SIZES)), "dtype",
              f"is not a supported dtype ({', '.join(ELEMENT_SIZES)})")
    sizes = tensors["dtype"].map(ELEMENT_SIZES)
    _row_fail(path, tensors, tensors["bytes"] != tensors["numel"] * sizes, "bytes",
              "is not numel x the dtype's element size")
    ready = tensors["ready_ms"].to_numpy()
    _row_fail(path, tensors, np.r_[False, ready[1:] < ready[:-1]], "ready_ms",
              "is earlier than the row before (rows are in gradient-ready order)")
    backward = float(meta["times"]["backward_compute"]["median_ms"])
    _row_fail(path, tensors, ready > backward * (1 + READY_SLACK) + 0.01, "ready_ms",
              f"is after the backward pass (times.backward_compute: {backward:g} ms)")
    _row_fail(path, tensors, tensors["bucket"] < 0, "bucket", "must not be negative (DDP's "
              "bucket index of the parameter)")
    _row_fail(path, tensors, tensors["bucket"] >= len(tensors), "bucket",
              "is beyond the number of tensors (DDP has at most a bucket each)")
    model = meta["model"]
    for key, value, what in (("tensors", len(tensors), "rows"),
                             ("parameters", int(tensors["numel"].sum()), "elements")):
        if key in model and model[key] != value:
            _fail(path, f"has {value:,} {what}, but profile.yaml's model.{key} is "
                        f"{model[key]!r}")


def _check_collectives(path: Path | str, table: pd.DataFrame, meta: dict) -> None:
    """Known collectives and dtypes; the groups a job of this shape sweeps (the world;
    inter-node with several nodes; intra-node with several nodes of several ranks),
    each with its size as rank count."""
    if table.empty:
        _fail(path, "has no rows")
    _row_fail(path, table, ~table["collective"].isin(COLLECTIVE_NAMES), "collective",
              f"is not one of {', '.join(COLLECTIVE_NAMES)}")
    _row_fail(path, table, ~table["dtype"].isin(COLLECTIVE_DTYPES), "dtype",
              f"is not one of {', '.join(COLLECTIVE_DTYPES)}")
    ranks = {"world": meta["world_size"], "intra": meta["ranks_per_node"],
             "inter": meta["nodes"]}
    _row_fail(path, table, ~table["group"].isin(list(ranks)), "group",
              "is not one of world, intra, inter")
    shape = f"{meta['nodes']} nodes x {meta['ranks_per_node']}"
    swept = {"world"} | ({"inter"} if meta["nodes"] > 1 else set()) | \
        ({"intra"} if meta["nodes"] > 1 and meta["ranks_per_node"] > 1 else set())
    _row_fail(path, table, ~table["group"].isin(sorted(swept)), "group",
              f"is not a group of a job of {shape} ({', '.join(sorted(swept))})")
    for group in sorted(swept - set(table["group"])):
        _fail(path, f"has no rows for the {group} group, which a job of {shape} has")
    expected = table["group"].map(ranks)
    _row_fail(path, table, table["ranks"] != expected, "ranks",
              f"does not match the group's size in profile.yaml (world_size "
              f"{meta['world_size']}, {shape})")
    _row_fail(path, table, table["bytes"] < 1, "bytes", "must be at least 1")


def _check_specs(path: Path | str, table: pd.DataFrame, column: str) -> None:
    for spec in dict.fromkeys(table[column]):
        try:
            from_spec(spec)
        except BytecompError as error:
            row = int((table[column] == spec).to_numpy().argmax())
            _fail(path, f"column '{column}', row {row + 1}: {error}")


def load_profile(directory) -> Profile:
    """Read and validate a profile directory: every file a regular file of sane size,
    every number finite and in range, and the tables consistent with each other and
    with profile.yaml."""
    directory = check_input_directory(directory, "profile directory")
    if not (directory / "profile.yaml").exists() and (directory / "calibration.yaml").exists():
        raise BytecompError(f"{directory} is a calibration (bytecomp profile --calibrate-only), "
                            f"not a profile: profile a model with --calibration {directory}")
    return _validated(_load_meta(directory / "profile.yaml"), directory / "profile.yaml",
                      lambda name: _load_table(directory, name, name not in OPTIONAL_TABLES),
                      lambda name: directory / f"{name}.csv", directory)


def check_profile(profile: Profile) -> Profile:
    """``profile`` (from :func:`load_profile`, perhaps edited in memory, or built) checked
    as :func:`load_profile` checks a directory, each failure one line naming the
    attribute (``Profile(profiles/cnn).tensors: column 'ready_ms', row 3: ...``); a
    checked copy, its tables of the columns' types."""
    source = f"Profile({profile.path if profile.path is not None else 'in memory'})"
    meta = check_document(f"{source}.meta", profile.meta, REQUIRED_FIELDS)
    _check_meta(f"{source}.meta", meta)

    def table(name: str) -> pd.DataFrame:
        given = getattr(profile, name)
        if not isinstance(given, pd.DataFrame):
            _fail(f"{source}.{name}", f"must be a pandas DataFrame, got "
                                      f"{type(given).__name__}")
        return _typed_table(f"{source}.{name}", name, given.reset_index(drop=True))

    return _validated(meta, f"{source}.meta", table, lambda name: f"{source}.{name}",
                      profile.path)


def _validated(meta: dict, meta_path: Path | str, table, where,
               path: Path | None) -> Profile:
    """The profile of ``meta`` (checked) and of the tables ``table(name)`` gives (typed),
    each table checked against ``meta`` and the others, in the order load_profile reads
    them; ``where(name)``: the table as a message names it."""
    tensors = table("tensors")
    _check_tensors(where("tensors"), tensors, meta)
    collectives = table("collectives")
    _check_collectives(where("collectives"), collectives, meta)
    compressors = table("compressors")
    _check_sweep(where("compressors"), compressors)
    _check_quality_fits(meta_path, meta.get("quality"), collectives, compressors)
    copies = table("copies")
    _row_fail(where("copies"), copies, ~copies["direction"].isin(COPY_DIRECTIONS),
              "direction", f"is not one of {', '.join(COPY_DIRECTIONS)}")
    fidelity = table("fidelity")
    _check_specs(where("fidelity"), fidelity, "spec")
    _check_fidelity(where("fidelity"), fidelity, tensors, compressors)
    probe = table("probe")
    _check_probe(where("probe"), probe)
    aggregation = table("aggregation")
    _check_sweep(where("aggregation"), aggregation)
    return Profile(meta, tensors, collectives, compressors, copies, path, fidelity, probe,
                   aggregation)


def _check_sweep(path: Path | str, table: pd.DataFrame) -> None:
    """A compressor sweep's rows (compressors.csv, aggregation.csv): known specs, a cpu
    or cuda device, at least one element."""
    _check_specs(path, table, "spec")
    _row_fail(path, table, ~table["device"].isin(["cpu", "cuda"]), "device",
              "is not cpu or cuda")
    _row_fail(path, table, table["numel"] < 1, "numel", "must be at least 1")
    if "payload_bytes" in table.columns:  # an encoded tensor sends something
        _row_fail(path, table, table["payload_bytes"] < 1, "payload_bytes", "must be at least 1")
    if "advance_ms" in table.columns:  # a part of the encode
        _row_fail(path, table, table["advance_ms"] > table["encode_ms"], "advance_ms",
                  "is more than encode_ms (it is a part of it)")


def _check_fidelity(path: Path | str, fidelity: pd.DataFrame, tensors: pd.DataFrame,
                    compressors: pd.DataFrame) -> None:
    """One row per (tensor, compressor), each a tensor of tensors.csv and a compressor
    that compressors.csv timed (a gain without timings cannot be planned with)."""
    unknown = set(fidelity["tensor"]) - set(tensors["name"])
    if unknown:
        _fail(path, f"tensor {sorted(unknown)[0]!r} is not in tensors.csv")
    if fidelity.empty:
        return
    specs = fidelity["spec"].map(canonical)
    timed = set(compressors["spec"].map(canonical))
    _row_fail(path, fidelity, ~specs.isin(sorted(timed)), "spec",
              "has no timings in compressors.csv")
    _row_fail(path, fidelity, pd.DataFrame({"t": fidelity["tensor"], "s": specs}).duplicated(),
              "spec", "appears twice for the same tensor (specs compared in canonical form)")


def _check_probe(path: Path | str, probe: pd.DataFrame) -> None:
    """One row per compressor spec, its steps factor at most the probe's cap (bytecomp
    .profile.probe.MAX_FACTOR: "it does not learn")."""
    _check_specs(path, probe, "spec")
    specs = probe["spec"].map(canonical)
    _row_fail(path, probe, specs.duplicated(), "spec",
              "appears twice (specs compared in canonical form)")
    _row_fail(path, probe, (probe["steps_factor"] > MAX_STEPS_FACTOR) |
              (probe["steps_factor"] < 1 / MAX_STEPS_FACTOR), "steps_factor",
              f"is not from {1 / MAX_STEPS_FACTOR:g} to {MAX_STEPS_FACTOR:g} (steps relative "
              f"to fp32's)")


def profile_files(directory) -> list[Path]:
    """The files :func:`load_profile` reads: a command's inputs, which no output may
    overwrite."""
    return [Path(directory) / "profile.yaml"] + [Path(directory) / f"{name}.csv"
                                                  for name in TABLES]
