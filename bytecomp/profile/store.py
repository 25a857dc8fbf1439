"""The profile directory: ``profile.yaml`` plus CSV tables (see DESIGN.md).

``save_profile`` writes it atomically; ``load_profile`` validates every file
and reports a bad one with its path, the column or field and the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from bytecomp.errors import BytecompError
from bytecomp.files import check_input_directory, directory_atomic, read_text_file

FORMAT_VERSION = 1
TIME_NAMES = ("forward", "backward", "optimizer", "iteration")
EXECUTOR_PATHS = ("direct", "fifo", "host")  # bytecomp.model.overheads.PATHS

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
}
OPTIONAL_TABLES = ("copies", "fidelity", "probe")  # profiles without them still load
NON_NEGATIVE = {"numel", "bytes", "ready_ms", "ranks", "time_ms", "p10_ms", "p90_ms",
                "encode_ms", "decode_ms", "payload_bytes", "steps_factor", "steps"}
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

    @property
    def has_fidelity(self) -> bool:
        """Whether the profile measured gradient fidelity (profiles before it did not)."""
        return not self.fidelity.empty

    @property
    def steps_factors(self) -> dict[str, float]:
        """The convergence probe's steps factor by spec (empty: no probe)."""
        return {str(row.spec): float(row.steps_factor) for row in self.probe.itertuples()}

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
            yaml.safe_dump(profile.meta, sort_keys=False, default_flow_style=False))
        for name in TABLES:
            table = getattr(profile, name)
            table.to_csv(temporary / f"{name}.csv", index=False, columns=list(TABLES[name]))
    return Path(directory)


def _fail(path: Path, message: str):
    raise BytecompError(f"{path}: {message}")


def _check_interference(path: Path, entry) -> None:
    """Optional: shares of the compute stream lost to communication, in [0, 1)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        _fail(path, "field 'interference' must be a mapping")
    for key in ("fraction", "intra_fraction"):
        value = entry.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            _fail(path, f"field 'interference.{key}' must be a number in [0, 1)")


def _milliseconds(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and \
        math.isfinite(value) and 0 <= value < 1e6


def _check_executor(path: Path, entry) -> None:
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


def _load_meta(path: Path) -> dict:
    if not path.exists():
        _fail(path, "missing (is this a profile directory made by bytecomp profile?)")
    try:
        meta = yaml.safe_load(read_text_file(path, "profile file"))
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0]
        _fail(path, f"not valid YAML ({first})")
    if not isinstance(meta, dict):
        _fail(path, "must be a YAML mapping")
    for key, kind in REQUIRED_FIELDS.items():
        if key not in meta:
            _fail(path, f"missing field '{key}'")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            _fail(path, f"field '{key}' has the wrong type ({type(meta[key]).__name__})")
    if meta["format_version"] != FORMAT_VERSION:
        _fail(path, f"format_version {meta['format_version']} is not supported "
                    f"(this bytecomp reads {FORMAT_VERSION})")
    for key in ("world_size", "nodes", "ranks_per_node", "batch_size"):
        if meta[key] < 1:
            _fail(path, f"field '{key}' must be at least 1")
    if not 0 < meta["bucket_cap_mb"] < math.inf:
        _fail(path, "field 'bucket_cap_mb' must be a positive number")
    if meta["nodes"] * meta["ranks_per_node"] != meta["world_size"]:
        _fail(path, "nodes x ranks_per_node must equal world_size")
    if not isinstance(meta["model"].get("fingerprint"), str):
        _fail(path, "field 'model.fingerprint' is missing")
    if meta["device"].get("type") not in ("cpu", "cuda"):
        _fail(path, "field 'device.type' must be cpu or cuda")
    _check_interference(path, meta.get("interference"))
    _check_executor(path, meta.get("executor"))
    for name in TIME_NAMES:
        entry = meta["times"].get(name)
        value = entry.get("median_ms") if isinstance(entry, dict) else None
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            _fail(path, f"field 'times.{name}.median_ms' must be a non-negative number")
    return meta


def _load_table(directory: Path, name: str, required: bool = True) -> pd.DataFrame:
    path = directory / f"{name}.csv"
    if not path.exists():
        if required:
            _fail(path, "missing")
        return empty_table(name)
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as error:
        _fail(path, f"not a readable CSV table ({type(error).__name__}: {error})")
    for column, kind in TABLES[name].items():
        if column not in table.columns:
            _fail(path, f"missing column '{column}'")
        if kind is str:
            continue
        numbers = pd.to_numeric(table[column], errors="coerce")
        bad = ~np.isfinite(numbers.astype(float))
        if bad.any():
            row = int(bad.idxmax())
            _fail(path, f"column '{column}', row {row + 1}: {table[column][row]!r} is not a number")
        if column in NON_NEGATIVE and (numbers < 0).any():
            row = int((numbers < 0).idxmax())
            _fail(path, f"column '{column}', row {row + 1}: must not be negative")
        if column in FRACTIONS and ((numbers < 0) | (numbers > 1)).any():
            row = int(((numbers < 0) | (numbers > 1)).idxmax())
            _fail(path, f"column '{column}', row {row + 1}: must be between 0 and 1")
        table[column] = numbers.astype(kind)
    return table


def load_profile(directory) -> Profile:
    """Read and validate a profile directory."""
    directory = check_input_directory(directory, "profile directory")
    meta = _load_meta(directory / "profile.yaml")
    tensors = _load_table(directory, "tensors")
    if tensors.empty:
        _fail(directory / "tensors.csv", "has no rows")
    if tensors["name"].duplicated().any():
        _fail(directory / "tensors.csv", f"tensor {tensors['name'][tensors['name'].duplicated()].iloc[0]!r} "
                                         f"appears twice")
    collectives = _load_table(directory, "collectives")
    if collectives.empty:
        _fail(directory / "collectives.csv", "has no rows")
    compressors = _load_table(directory, "compressors")
    copies = _load_table(directory, "copies", required=False)
    fidelity = _load_table(directory, "fidelity", required=False)
    unknown = set(fidelity["tensor"]) - set(tensors["name"])
    if unknown:
        _fail(directory / "fidelity.csv", f"tensor {sorted(unknown)[0]!r} is not in tensors.csv")
    probe = _load_table(directory, "probe", required=False)
    return Profile(meta, tensors, collectives, compressors, copies, directory, fidelity, probe)
