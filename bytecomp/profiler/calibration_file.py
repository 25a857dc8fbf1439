"""Reading a calibration: a calibration directory (``calibration.yaml`` and the cluster
tables, written by ``bytecomp profile --calibrate-only``) or a profile directory used as
one, validated (:func:`load_calibration`). Measuring one, and checking that it fits a
job: :mod:`bytecomp.profiler.calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pandas as pd

from bytecomp.compress import canonical, from_spec
from bytecomp.errors import BytecompError
from bytecomp.files import check_input_directory, control_character
from bytecomp.profile_meta import (
    BACKENDS,
    DEVICE_TYPE,
    TIME,
    CalibrationMeta,
    ProfileMeta,
    check_executor_measured,
    check_quality,
)
from bytecomp.profile_store import FORMAT_VERSION, load_profile, profile_files
from bytecomp.profile_tables import (
    COPY_DIRECTIONS,
    check_collectives,
    check_quality_fits,
    check_sweep,
    load_table,
    row_fail,
)
from bytecomp.profiler.overheads import ExecutorMeasurement
from bytecomp.schema import COUNT, MAX_COUNT, check_field, fail, read_document

CALIBRATION_FILE = "calibration.yaml"
CALIBRATION_TABLES = ("collectives", "compressors", "aggregation", "copies")


@dataclass
class Calibration:
    """A calibration directory (``kind`` ``calibration``) or a profile used as one
    (``kind`` ``profile``): its metadata and its cluster tables, validated."""

    path: Path
    kind: str
    meta: ProfileMeta  # a calibration's: a CalibrationMeta
    collectives: pd.DataFrame
    compressors: pd.DataFrame
    aggregation: pd.DataFrame
    copies: pd.DataFrame

    @property
    def specs(self) -> list[str]:
        """The compressor specs it timed (compressors.csv), in canonical form."""
        return list(dict.fromkeys(canonical(spec) for spec in self.compressors["spec"]))

    @property
    def measured(self) -> str:
        """When its tables were measured: its creation time, or, for a profile that took
        them from a calibration itself, that calibration's."""
        record = self.meta.get("calibration") or {}
        if "calibration" in (record.get("tables") or {}).values():
            return str(record["measured"])
        return str(self.meta["created"])

    def executor(self) -> ExecutorMeasurement | None:
        """What the executor's fixed costs derive from; None where it predates the record."""
        measured = (self.meta.get("executor") or {}).get("measured")
        return ExecutorMeasurement.from_meta(measured) if measured else None

    def describe(self) -> str:
        what = "calibration" if self.kind == "calibration" else \
            f"profile of {self.meta['model'].get('spec', self.meta['model'].get('name'))}"
        return f"{self.path} ({what}, {self.meta['created']})"


def calibration_files(directory) -> list[Path]:
    """The files :func:`load_calibration` may read: inputs no output may overwrite."""
    directory = Path(directory)
    return [directory / CALIBRATION_FILE] + [directory / f"{name}.csv"
                                             for name in CALIBRATION_TABLES] \
        + profile_files(directory)


def _load_calibration_meta(path: Path) -> CalibrationMeta:
    """calibration.yaml: the job it was made on, the sweeps' settings and quality."""
    required: dict[str, type] = {"format_version": int, "kind": str, "created": str,
                                 "device": dict, "backend": str, "world_size": int,
                                 "nodes": int, "ranks_per_node": int,
                                 "compressor_specs": list}
    meta = read_document(path, "calibration file", required, FORMAT_VERSION)
    if meta["kind"] != "calibration":
        fail(path, f"field 'kind' must be calibration, got {meta['kind'][:100]!r}")
    check_field(path, "created", meta["created"], TIME)
    for key in ("world_size", "nodes", "ranks_per_node"):
        check_field(path, key, meta[key], COUNT)
    if meta["nodes"] * meta["ranks_per_node"] != meta["world_size"]:
        fail(path, "nodes x ranks_per_node must equal world_size")
    if meta["backend"] not in BACKENDS:
        fail(path, f"field 'backend' must be one of {', '.join(BACKENDS)}, got "
                    f"{meta['backend'][:100]!r}")
    device = meta["device"]
    check_field(path, "device.type", device.get("type"), DEVICE_TYPE)
    name = device.get("name")
    if not isinstance(name, str) or len(name) > 1000 or control_character(name):
        fail(path, "field 'device.name' must be the device's name (printable text)")
    for index, spec in enumerate(meta["compressor_specs"]):
        if not isinstance(spec, str):
            fail(path, f"field 'compressor_specs[{index}]' must be a compressor spec")
        try:
            from_spec(spec)
        except BytecompError as error:
            fail(path, f"field 'compressor_specs[{index}]': {error}")
    machine = meta.get("machine", {})
    threads = machine.get("threads_per_rank", 1) if isinstance(machine, dict) else None
    if isinstance(threads, bool) or not isinstance(threads, int) or \
            not 1 <= threads <= MAX_COUNT:
        fail(path, "field 'machine' must be a mapping whose threads_per_rank is a positive "
                    "integer")
    for key in ("compress_kernels",):
        if not isinstance(meta.get(key, ""), str):
            fail(path, f"field '{key}' must be text")
    check_quality(path, meta.get("quality"))
    executor = meta.get("executor")
    if executor is not None and not isinstance(executor, dict):
        fail(path, "field 'executor' must be a mapping with 'measured'")
    check_executor_measured(path, (executor or {}).get("measured"))
    return cast(CalibrationMeta, meta)  # the one place a mapping read becomes one


def load_calibration(directory) -> Calibration:
    """Read and validate a calibration directory (``calibration.yaml``) or a profile
    directory (``profile.yaml``, :func:`~bytecomp.profile_store.load_profile`), and check
    that it holds an fp32 allreduce sweep of each group, which the link check times."""
    directory = check_input_directory(directory, "calibration directory")
    def present(name: str) -> bool:  # a broken link is there, and read reports it
        return (directory / name).exists() or (directory / name).is_symlink()

    has_calibration, has_profile = present(CALIBRATION_FILE), present("profile.yaml")
    if has_calibration and has_profile:
        raise BytecompError(f"calibration directory {directory} holds both calibration.yaml "
                            f"and profile.yaml: it is neither a calibration nor a profile")
    if not has_calibration and not has_profile:
        raise BytecompError(f"calibration directory {directory} holds neither calibration.yaml "
                            f"nor profile.yaml (bytecomp profile --calibrate-only --out DIR "
                            f"makes a calibration; a profile directory serves too)")
    if has_profile:
        profile = load_profile(directory)
        calibration = Calibration(directory, "profile", profile.meta, profile.collectives,
                                  profile.compressors, profile.aggregation, profile.copies)
    else:
        meta = _load_calibration_meta(directory / CALIBRATION_FILE)
        collectives = load_table(directory, "collectives")
        check_collectives(directory / "collectives.csv", collectives, meta)
        compressors = load_table(directory, "compressors")
        check_sweep(directory / "compressors.csv", compressors)
        if compressors.empty:
            fail(directory / "compressors.csv", "has no rows")
        check_quality_fits(directory / CALIBRATION_FILE, meta.get("quality"), collectives,
                            compressors)
        copies = load_table(directory, "copies", required=False)
        row_fail(directory / "copies.csv", copies, ~copies["direction"].isin(COPY_DIRECTIONS),
                  "direction", f"is not one of {', '.join(COPY_DIRECTIONS)}")
        aggregation = load_table(directory, "aggregation", required=False)
        check_sweep(directory / "aggregation.csv", aggregation)
        calibration = Calibration(directory, "calibration", meta, collectives, compressors,
                                  aggregation, copies)
    table = calibration.collectives
    for group in sorted(set(table["group"])):
        rows = table[(table["group"] == group) & (table["collective"] == "allreduce")
                     & (table["dtype"] == "float32")]
        if rows.empty:
            fail(directory / "collectives.csv", f"has no float32 allreduce of the {group} "
                                                 f"group, which the link check times")
    return calibration
