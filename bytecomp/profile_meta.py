"""``profile.yaml``'s type (:class:`ProfileMeta`; calibration.yaml's :class:`CalibrationMeta`)
and its checks (docs/formats.md): every field in range and consistent with the others;
its optional sections (interference, the executor's fixed costs, the probe,
the stages' seconds, the sweeps' fit quality, where a calibration's tables came from)
checked as the rest. The calibration reader (:mod:`bytecomp.profiler.calibration_file`) shares
the sections a calibration holds too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypedDict, cast

from bytecomp.files import control_character
from bytecomp.schema import (
    COUNT,
    MAX_BUCKET_CAP_MB,
    MAX_COUNT,
    MAX_INTEGER,
    MAX_MS,
    MAX_SECONDS,
    PROBE_BATCHES,
    Fields,
    Integer,
    Number,
    Rule,
    check_field,
    check_fields,
    check_section,
    fail,
    is_number,
    iso_time,
    number_in,
)

TIME_NAMES = ("forward", "backward", "optimizer", "iteration")
REQUIRED_TIMES = (*TIME_NAMES, "backward_compute")  # what plan and simulate use
PHASE_SLACK = 0.1  # a phase's median against the iteration's (timed apart, so not additive)
BACKENDS = ("gloo", "nccl")  # ready times and backward time are medians rounded to 0.1 us
# the executor's paths, whose fixed costs profile.yaml's executor section holds
# (bytecomp.costs.executor_costs prices them)
EXECUTOR_PATHS = ("direct", "fifo", "host")
# the tables a calibration holds (bytecomp.profiler.calibration), and where a profile's came from
CLUSTER_TABLES = ("collectives", "compressors", "aggregation", "copies", "executor")
TABLE_SOURCES = ("measured", "calibration")
CALIBRATION_KINDS = ("calibration", "profile")  # a --calibrate-only directory, or a profile
MAX_LINK_TOLERANCE = 1000.0


class ModelMeta(TypedDict, total=False):
    """profile.yaml's ``model``: the network profiled (name, spec and fingerprint are
    required, :func:`check_meta`)."""

    name: str
    spec: str
    fingerprint: str
    parameters: int
    tensors: int
    args: dict[str, Any]


class DeviceMeta(TypedDict, total=False):
    """``device``: ``cpu`` or ``cuda``, and its name."""

    type: str
    name: str


class ProfileMeta(TypedDict, total=False):
    """profile.yaml (everything but its tables), its keys in the order bytecomp writes
    them. Every key is optional to the type: a file needs :data:`REQUIRED_FIELDS` (and
    :func:`check_meta`'s), while the profiles built in memory of a cluster's tables
    alone (the probe's candidates, the executor's measurement) hold the job's shape."""

    format_version: int
    bytecomp_version: str
    torch_version: str
    compress_kernels: str  # what the compressors with kernels ran: "triton <version>", "torch"
    created: str
    machine: dict[str, Any]
    model: ModelMeta
    device: DeviceMeta
    backend: str
    world_size: int
    nodes: int
    ranks_per_node: int
    batch_size: int
    bucket_cap_mb: float
    iterations: int
    warmup: int
    quick: bool
    recipe: dict[str, Any]
    fidelity: dict[str, Any]
    probe: dict[str, Any]
    times: dict[str, dict[str, float]]
    interference: dict[str, Any]
    executor: dict[str, Any]
    compressor_specs: list[str]
    quality: dict[str, Any]
    sweep: dict[str, Any]
    calibration: dict[str, Any]
    stages_s: dict[str, float]
    synthetic: bool  # bytecomp.testing.synthetic's profiles


class CalibrationMeta(ProfileMeta, total=False):
    """calibration.yaml: profile.yaml's head without the model's keys (the job, the
    compressor specs, the executor's measurement, the sweeps' settings and quality),
    its ``kind`` and, in the cache, the key it was written for."""

    kind: str
    cache_key: dict[str, Any]


# the fields a profile.yaml must hold, of these types (in ProfileMeta's order: a test
# checks them against its annotations)
REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format_version": int, "model": dict, "device": dict, "backend": str, "world_size": int,
    "nodes": int, "ranks_per_node": int, "batch_size": int, "bucket_cap_mb": (int, float),
    "times": dict,
}


def _milliseconds(value) -> bool:
    return is_number(value) and math.isfinite(value) and 0 <= value < MAX_MS


# the device's type, which calibration.yaml's head shares
DEVICE_TYPE = Rule(lambda value: value in ("cpu", "cuda"), "must be cpu or cuda")
# the optional sections' fields, declared: each key's default where absent and its check
# (the message after "field 'SECTION.KEY' ")
MS = Rule(_milliseconds, "must be a non-negative number of ms")
SECONDS = Rule(lambda value: is_number(value) and 0 <= value <= MAX_SECONDS,
               "must be seconds from 0 to 1e7, got {value!r}")
FLAG = Rule(lambda value: isinstance(value, bool), "must be true or false")
TIME = Rule(iso_time, "must be a time (ISO 8601)")
RELATIVE_ERROR = Rule(lambda value: is_number(value) and 0 <= value <= MAX_INTEGER,
                      "must be a non-negative number, got {value!r}")
SHARE = Rule(lambda value: is_number(value) and 0 <= value < 1, "must be a number in [0, 1)")
# interference: shares of the compute stream lost to communication, in [0, 1), and what
# a collective waits while the rank computes (ms)
INTERFERENCE_FIELDS: Fields = {
    "fraction": (0.0, SHARE), "intra_fraction": (0.0, SHARE),
    "busy_collective_ms": (0.0, MS), "collective_alone_ms": (0.0, MS),
    "collective_busy_ms": (0.0, MS)}
# probe: the convergence probe's settings (its steps are named in plan's notes)
PROBE_FIELDS: Fields = {
    "steps": (0, Integer(0, MAX_COUNT)), "ran_steps": (0, Integer(0, MAX_COUNT)),
    "planned_steps": (0, Integer(0, MAX_COUNT)),
    "batches": ("validation", Rule(lambda value: value in PROBE_BATCHES,
                                   f"must be one of {', '.join(PROBE_BATCHES)}")),
    "fp32_improvement": (0.0, Rule(lambda value: number_in(value, 0.0, 1.0),
                                   "must be a fraction from 0 to 1, got {value!r}")),
    "informative": (True, FLAG), "seconds": (0.0, SECONDS),
    "stopped_by_budget": (False, FLAG),
    "length": ("budget", Rule(lambda value: value in ("budget", "--probe-steps"),
                              "must be budget or --probe-steps")),
}
MAX_RETRIES = 100  # the quality section's retries (bytecomp.profiler.quality.RETRIES)
QUALITY_FIELDS: Fields = {
    "min_r2": (0.0, Number(0.0, 1.0)), "max_worst_relative_error": (0.0, RELATIVE_ERROR),
    "retries": (0, Integer(0, MAX_RETRIES)),
    "remeasured": ([], Rule(lambda value: isinstance(value, list) and
                            all(isinstance(name, str) for name in value),
                            "must be a list of fit names")),
    "poor": ([], Rule(lambda value: isinstance(value, list), "must be a list")),
}
CALIBRATION_FIELDS: Fields = {
    "kind": (None, Rule(lambda value: value in CALIBRATION_KINDS,
                        f"must be one of {', '.join(CALIBRATION_KINDS)}")),
    "created": (None, TIME), "measured": (None, TIME),
}


def _check_executor(path: Path | str, entry) -> None:
    """Optional: the executor's fixed costs (costs/executor_costs.py), in milliseconds."""
    if entry is None:
        return
    if not isinstance(entry, dict) or not isinstance(entry.get("paths"), dict):
        fail(path, "field 'executor' must be a mapping with 'bucket_ms' and 'paths'")
    check_field(path, "executor.bucket_ms", entry.get("bucket_ms"), MS)
    for name in EXECUTOR_PATHS:
        costs = entry["paths"].get(name)
        check_fields(path, f"executor.paths.{name}", costs if isinstance(costs, dict) else {},
                     {"hook_ms": (None, MS), "tail_ms": (None, MS)})
    check_executor_measured(path, entry.get("measured"))


# executor.measured holds differences of medians per added group or bucket: noise may take
# one a little below 0 (the fixed costs derived from it are clamped at 0), never by more
MIN_DIFFERENCE_MS = -1.0


def _difference_ms(value) -> bool:
    return is_number(value) and math.isfinite(value) and MIN_DIFFERENCE_MS <= value < MAX_MS


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
        fail(path, f"field '{where}' must be a mapping with added_ms, hook_added_ms and "
                    f"bucket_ms")
    if not _difference_ms(entry.get("bucket_ms")):
        fail(path, f"field '{where}.bucket_ms' must be {span}, got "
                    f"{repr(entry.get('bucket_ms'))[:60]}")
    for key in ("added_ms", "hook_added_ms", "busy_added_ms"):
        if key == "busy_added_ms" and entry.get(key) is None:
            continue
        paths = entry.get(key)
        if not isinstance(paths, dict) or set(paths) != set(EXECUTOR_PATHS):
            fail(path, f"field '{where}.{key}' must map each of {', '.join(EXECUTOR_PATHS)} "
                        f"to a number of ms")
        for name in EXECUTOR_PATHS:
            if not _difference_ms(paths[name]):
                fail(path, f"field '{where}.{key}.{name}' must be {span}, got "
                            f"{repr(paths[name])[:60]}")


def _check_calibration(path: Path | str, entry, meta: dict) -> None:
    """Optional (profiles before calibrations have none: every table measured): where
    each cluster table came from, and with one from a calibration directory, which,
    when it was made and measured, and the link check that allowed it."""
    if entry is None:
        return
    if not isinstance(entry, dict) or not isinstance(entry.get("tables"), dict):
        fail(path, "field 'calibration' must be a mapping with 'tables'")
    for name, source in entry["tables"].items():
        if name not in CLUSTER_TABLES:
            fail(path, f"field 'calibration.tables' names {str(name)[:100]!r}, which is not "
                        f"one of {', '.join(CLUSTER_TABLES)}")
        if source not in TABLE_SOURCES:
            fail(path, f"field 'calibration.tables.{name}' must be one of "
                        f"{', '.join(TABLE_SOURCES)}")
    if "calibration" not in entry["tables"].values():
        for key in ("directory", "kind", "created", "measured", "link"):
            if key in entry:
                fail(path, f"field 'calibration.{key}' is set, but no table came from a "
                            f"calibration (calibration.tables)")
        return
    directory = entry.get("directory")
    if not isinstance(directory, str) or not directory.strip() or len(directory) > 4096 \
            or control_character(directory):
        fail(path, "field 'calibration.directory' must be the calibration's path (printable "
                    "text)")
    check_fields(path, "calibration", entry, CALIBRATION_FIELDS)
    link = entry.get("link")
    if not isinstance(link, dict) or not isinstance(link.get("checks"), list) or \
            not link["checks"]:
        fail(path, "field 'calibration.link' must be a mapping with tolerance and checks "
                    "(a list of the allreduces timed)")
    tolerance = link.get("tolerance")
    if not is_number(tolerance) or not 1 < tolerance <= MAX_LINK_TOLERANCE:
        fail(path, f"field 'calibration.link.tolerance' must be a number above 1 and at "
                    f"most {MAX_LINK_TOLERANCE:g}, got {tolerance!r}")
    groups = {"world"} | ({"inter"} if meta["nodes"] > 1 else set()) | \
        ({"intra"} if meta["nodes"] > 1 and meta["ranks_per_node"] > 1 else set())
    for index, check in enumerate(link["checks"]):
        where = f"calibration.link.checks[{index}]"
        if not isinstance(check, dict) or check.get("group") not in groups:
            fail(path, f"field '{where}' must be a mapping whose group is one of this job's "
                        f"({', '.join(sorted(groups))})")
        for key, least in (("bytes", 1), ("samples", 1)):
            value = check.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not least <= value <= MAX_INTEGER:
                fail(path, f"field '{where}.{key}' must be a positive integer, got {value!r}")
        for key in ("calibration_ms", "measured_ms"):
            if not _milliseconds(check.get(key)) or check[key] <= 0:
                fail(path, f"field '{where}.{key}' must be a positive number of ms below "
                            f"{MAX_MS:g}")
        ratio = check.get("ratio")
        expected = check["measured_ms"] / check["calibration_ms"]
        if not is_number(ratio) or not math.isclose(ratio, expected, rel_tol=1e-3):
            fail(path, f"field '{where}.ratio' must be measured_ms / calibration_ms "
                        f"({expected:.4g}), got {ratio!r}")
        if not 1 / tolerance <= ratio <= tolerance:
            fail(path, f"field '{where}.ratio' ({ratio:g}) is beyond the tolerance "
                        f"({tolerance:g}x either way): such a calibration is refused")


def _check_stages(path: Path | str, entry) -> None:
    """Optional: seconds each stage of the profile took, by name (informative)."""
    if entry is None:
        return
    if not isinstance(entry, dict) or len(entry) > 100:
        fail(path, "field 'stages_s' must be a mapping of stage names to seconds")
    for name, seconds in entry.items():
        if not isinstance(name, str) or not name.isprintable() or len(name) > 200:
            fail(path, f"field 'stages_s' has a bad stage name {str(name)[:40]!r}")
        check_field(path, f"stages_s.{name}", seconds, SECONDS)


def check_quality(path: Path | str, entry) -> None:
    """Optional: the sweeps' fit quality (bytecomp.profiler.quality): the thresholds, the
    retries, the fits measured again and those that stayed poor (names checked against
    the tables by :func:`check_quality_fits`)."""
    check_section(path, "quality", entry, QUALITY_FIELDS)
    if entry is None:
        return
    for index, fit in enumerate(entry.get("poor", [])):
        where = f"quality.poor[{index}]"
        if not isinstance(fit, dict) or not isinstance(fit.get("fit"), str):
            fail(path, f"field '{where}' must be a mapping with fit (a name), r2 and "
                        f"worst_relative_error")
        r2 = fit.get("r2")
        if not is_number(r2) or not -MAX_INTEGER <= r2 <= 1:  # R^2 of a bad fit: below 0
            fail(path, f"field '{where}.r2' must be a number at most 1, got {r2!r}")
        check_field(path, f"{where}.worst_relative_error", fit.get("worst_relative_error"),
                    RELATIVE_ERROR)


def _check_times(path: Path | str, times: dict) -> None:
    """Every phase: a mapping of statistics in ms (median_ms at least); the phases the
    planner and simulator use must be there."""
    for name in REQUIRED_TIMES:
        if name not in times:
            fail(path, f"missing field 'times.{name}' (re-run bytecomp profile)")
    for name, entry in times.items():
        if not isinstance(entry, dict) or "median_ms" not in entry:
            fail(path, f"field 'times.{name}' must be a mapping with median_ms")
        for statistic, value in entry.items():
            if not _milliseconds(value):
                fail(path, f"field 'times.{name}.{statistic}' must be a non-negative number "
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
                fail(path, f"field 'times.{phase}{suffix}.median_ms' ({part['median_ms']:g} ms) "
                            f"is longer than the whole iteration{suffix} "
                            f"({whole['median_ms']:g} ms)")


def check_meta(path: Path | str, meta: dict) -> ProfileMeta:
    """profile.yaml's fields, after :func:`check_document`: each in range, and consistent
    with each other; ``meta``, checked, as the :class:`ProfileMeta` it then is."""
    for key in ("world_size", "nodes", "ranks_per_node", "batch_size"):
        check_field(path, key, meta[key], COUNT)
    if not 0 < meta["bucket_cap_mb"] <= MAX_BUCKET_CAP_MB:
        fail(path, f"field 'bucket_cap_mb' must be a positive number (at most "
                    f"{MAX_BUCKET_CAP_MB:g})")
    if meta["nodes"] * meta["ranks_per_node"] != meta["world_size"]:
        fail(path, "nodes x ranks_per_node must equal world_size")
    fingerprint = meta["model"].get("fingerprint")
    if fingerprint is None:
        fail(path, "field 'model.fingerprint' is missing")
    if not isinstance(fingerprint, str) or not fingerprint.strip():
        fail(path, f"field 'model.fingerprint' must be the model's fingerprint (a string of "
                    f"hex digits), got {type(fingerprint).__name__} {fingerprint!r}")
    for key in ("name", "spec"):  # what the plan records, and the finalists build
        value = meta["model"].get(key)
        if value is None:
            fail(path, f"field 'model.{key}' is missing")
        if not isinstance(value, str) or not value.strip() or control_character(value):
            fail(path, f"field 'model.{key}' must be the model's {key} (printable text), "
                        f"got {type(value).__name__} {str(value)[:100]!r}")
    for key in ("tensors", "parameters"):
        value = meta["model"].get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_INTEGER):
            fail(path, f"field 'model.{key}' must be a positive integer, got {value!r}")
    if meta["backend"] not in BACKENDS and not (meta.get("synthetic") is True and
                                                meta["backend"] == "synthetic"):
        fail(path, f"field 'backend' must be one of {', '.join(BACKENDS)} (what bytecomp "
                    f"profiles on), got {meta['backend']!r}")
    check_field(path, "device.type", meta["device"].get("type"), DEVICE_TYPE)
    check_section(path, "interference", meta.get("interference"), INTERFERENCE_FIELDS)
    _check_executor(path, meta.get("executor"))
    check_section(path, "probe", meta.get("probe"), PROBE_FIELDS)
    _check_stages(path, meta.get("stages_s"))
    check_quality(path, meta.get("quality"))
    _check_calibration(path, meta.get("calibration"), meta)
    _check_times(path, meta["times"])
    _check_phases(path, meta["times"])
    return cast(ProfileMeta, meta)  # the one place a mapping read becomes one
