"""A profile's CSV tables (docs/formats.md): their columns and types, and the checks
:func:`bytecomp.profile_store.load_profile` and the calibration reader
(:mod:`bytecomp.profiler.calibration_file`) make of them, each failure one line naming the
table, the column and the row.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from bytecomp.compress import canonical, from_spec
from bytecomp.errors import BytecompError
from bytecomp.files import control_character, read_text_file
from bytecomp.profile_meta import ProfileMeta
from bytecomp.schema import MAX_INTEGER, MAX_MS, MAX_STEPS_FACTOR, fail

ELEMENT_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}  # dtypes planned
COLLECTIVE_NAMES = ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast"]
COLLECTIVE_DTYPES = ["float32", "float16", "uint8"]  # the dtypes the collective sweeps time
COPY_DIRECTIONS = ["d2h", "h2d", "d2d"]
SHAPE = r"(\d+(x\d+)*)?"  # 64x3x3x3; empty for a scalar
READY_SLACK = 0.01

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


def empty_table(name: str) -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype=object if kind is str else kind)
                         for column, kind in TABLES[name].items()})


def row_fail(path: Path | str, table: pd.DataFrame, mask, column: str, reason: str,
              show: bool = True) -> None:
    """Fail on the first row where ``mask`` holds, naming it (rows count from 1) and,
    with ``show``, its value."""
    mask = np.asarray(mask, dtype=bool)
    if mask.any():
        row = int(mask.argmax())
        value = table[column].iloc[row]
        value = value.item() if isinstance(value, np.generic) else value
        fail(path, f"column '{column}', row {row + 1}: " + (f"{value!r} " if show else "")
              + reason)


def load_table(directory: Path, name: str, required: bool = True) -> pd.DataFrame:
    path = directory / f"{name}.csv"
    if not path.exists() and not path.is_symlink():
        if required:
            fail(path, "missing")
        return empty_table(name)
    text = read_text_file(path, "profile table")
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except Exception as error:  # pandas raises several kinds for a malformed table
        fail(path, f"not a readable CSV table ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''})")
    return typed_table(path, name, table)


def typed_table(path: Path | str, name: str, table: pd.DataFrame) -> pd.DataFrame:
    """Table ``name``'s columns there, each value of its column's type and in range, the
    numbers as numbers (``table`` is changed: a copy where it is the caller's)."""
    optional = OPTIONAL_COLUMNS.get(name, {})
    for column, kind in {**TABLES[name], **optional}.items():
        if column not in table.columns:
            if column in optional:
                continue
            fail(path, f"missing column '{column}'")
        if kind is str:  # always so as read; a table edited in memory may hold anything
            strings = table[column].map(lambda value: isinstance(value, str)).astype(bool)
            row_fail(path, table, ~strings, column, "is not a string")
            continue
        numbers = pd.to_numeric(table[column], errors="coerce").astype(float)
        row_fail(path, table, ~np.isfinite(numbers), column, "is not a number")
        if kind is int:
            row_fail(path, table, (numbers != np.round(numbers)) | (numbers.abs() > MAX_INTEGER),
                      column, f"is not an integer (at most {MAX_INTEGER:.3g})")
        if column in NON_NEGATIVE:
            row_fail(path, table, numbers < 0, column, "must not be negative", show=False)
        if column.endswith("_ms"):
            row_fail(path, table, numbers >= MAX_MS, column, f"is not below {MAX_MS:g} ms")
        if column in FRACTIONS:
            row_fail(path, table, (numbers < 0) | (numbers > 1), column,
                      "must be between 0 and 1", show=False)
        table[column] = numbers.astype(kind)
    return table


def check_tensors(path: Path | str, tensors: pd.DataFrame, meta: ProfileMeta) -> None:
    """Each row one parameter: numel a positive integer matching its shape, bytes numel x
    the dtype's size, a supported dtype, ready times in ready order within the backward
    pass."""
    if tensors.empty:
        fail(path, "has no rows")
    row_fail(path, tensors, tensors["name"].str.strip() == "", "name", "is empty")
    row_fail(path, tensors, tensors["name"].duplicated(), "name", "appears twice")
    row_fail(path, tensors, tensors["name"].map(control_character).notna(), "name",
              "holds a control character (a name is printed: no escape sequences)")
    row_fail(path, tensors, tensors["numel"] < 1, "numel", "must be at least 1")
    shapes = tensors["shape"].astype(str)
    row_fail(path, tensors, ~shapes.str.fullmatch(SHAPE), "shape",
              "is not a shape (sizes joined by x, like 64x3x3x3)")
    products = [math.prod(int(size) for size in shape.split("x") if size) for shape in shapes]
    row_fail(path, tensors, np.array(products, dtype=object) != tensors["numel"].to_numpy(),
              "shape", "does not hold numel elements")
    row_fail(path, tensors, ~tensors["dtype"].isin(list(ELEMENT_SIZES)), "dtype",
              f"is not a supported dtype ({', '.join(ELEMENT_SIZES)})")
    sizes = tensors["dtype"].map(ELEMENT_SIZES)
    row_fail(path, tensors, tensors["bytes"] != tensors["numel"] * sizes, "bytes",
              "is not numel x the dtype's element size")
    ready = tensors["ready_ms"].to_numpy()
    row_fail(path, tensors, np.r_[False, ready[1:] < ready[:-1]], "ready_ms",
              "is earlier than the row before (rows are in gradient-ready order)")
    backward = float(meta["times"]["backward_compute"]["median_ms"])
    row_fail(path, tensors, ready > backward * (1 + READY_SLACK) + 0.01, "ready_ms",
              f"is after the backward pass (times.backward_compute: {backward:g} ms)")
    row_fail(path, tensors, tensors["bucket"] < 0, "bucket", "must not be negative (DDP's "
              "bucket index of the parameter)")
    row_fail(path, tensors, tensors["bucket"] >= len(tensors), "bucket",
              "is beyond the number of tensors (DDP has at most a bucket each)")
    model: Mapping[str, object] = meta["model"]  # read by key names
    for key, value, what in (("tensors", len(tensors), "rows"),
                             ("parameters", int(tensors["numel"].sum()), "elements")):
        if key in model and model[key] != value:
            fail(path, f"has {value:,} {what}, but profile.yaml's model.{key} is "
                        f"{model[key]!r}")


def check_collectives(path: Path | str, table: pd.DataFrame, meta: ProfileMeta) -> None:
    """Known collectives and dtypes; the groups a job of this shape sweeps (the world;
    inter-node with several nodes; intra-node with several nodes of several ranks),
    each with its size as rank count."""
    if table.empty:
        fail(path, "has no rows")
    row_fail(path, table, ~table["collective"].isin(COLLECTIVE_NAMES), "collective",
              f"is not one of {', '.join(COLLECTIVE_NAMES)}")
    row_fail(path, table, ~table["dtype"].isin(COLLECTIVE_DTYPES), "dtype",
              f"is not one of {', '.join(COLLECTIVE_DTYPES)}")
    ranks = {"world": meta["world_size"], "intra": meta["ranks_per_node"],
             "inter": meta["nodes"]}
    row_fail(path, table, ~table["group"].isin(list(ranks)), "group",
              "is not one of world, intra, inter")
    shape = f"{meta['nodes']} nodes x {meta['ranks_per_node']}"
    swept = {"world"} | ({"inter"} if meta["nodes"] > 1 else set()) | \
        ({"intra"} if meta["nodes"] > 1 and meta["ranks_per_node"] > 1 else set())
    row_fail(path, table, ~table["group"].isin(sorted(swept)), "group",
              f"is not a group of a job of {shape} ({', '.join(sorted(swept))})")
    for group in sorted(swept - set(table["group"])):
        fail(path, f"has no rows for the {group} group, which a job of {shape} has")
    expected = table["group"].map(ranks)
    row_fail(path, table, table["ranks"] != expected, "ranks",
              f"does not match the group's size in profile.yaml (world_size "
              f"{meta['world_size']}, {shape})")
    row_fail(path, table, table["bytes"] < 1, "bytes", "must be at least 1")


def check_specs(path: Path | str, table: pd.DataFrame, column: str) -> None:
    for spec in dict.fromkeys(table[column]):
        try:
            from_spec(spec)
        except BytecompError as error:
            row = int((table[column] == spec).to_numpy().argmax())
            fail(path, f"column '{column}', row {row + 1}: {error}")


def check_sweep(path: Path | str, table: pd.DataFrame) -> None:
    """A compressor sweep's rows (compressors.csv, aggregation.csv): known specs, a cpu
    or cuda device, at least one element."""
    check_specs(path, table, "spec")
    row_fail(path, table, ~table["device"].isin(["cpu", "cuda"]), "device",
              "is not cpu or cuda")
    row_fail(path, table, table["numel"] < 1, "numel", "must be at least 1")
    if "payload_bytes" in table.columns:  # an encoded tensor sends something
        row_fail(path, table, table["payload_bytes"] < 1, "payload_bytes", "must be at least 1")
    if "advance_ms" in table.columns:  # a part of the encode
        row_fail(path, table, table["advance_ms"] > table["encode_ms"], "advance_ms",
                  "is more than encode_ms (it is a part of it)")


def check_fidelity(path: Path | str, fidelity: pd.DataFrame, tensors: pd.DataFrame,
                    compressors: pd.DataFrame) -> None:
    """One row per (tensor, compressor), each a tensor of tensors.csv and a compressor
    that compressors.csv timed (a gain without timings cannot be planned with)."""
    unknown = set(fidelity["tensor"]) - set(tensors["name"])
    if unknown:
        fail(path, f"tensor {sorted(unknown)[0]!r} is not in tensors.csv")
    if fidelity.empty:
        return
    specs = fidelity["spec"].map(canonical)
    timed = set(compressors["spec"].map(canonical))
    row_fail(path, fidelity, ~specs.isin(sorted(timed)), "spec",
              "has no timings in compressors.csv")
    row_fail(path, fidelity, pd.DataFrame({"t": fidelity["tensor"], "s": specs}).duplicated(),
              "spec", "appears twice for the same tensor (specs compared in canonical form)")


def check_probe(path: Path | str, probe: pd.DataFrame) -> None:
    """One row per compressor spec, its steps factor at most the probe's cap (bytecomp
    .profile.probe.MAX_FACTOR: "it does not learn")."""
    check_specs(path, probe, "spec")
    specs = probe["spec"].map(canonical)
    row_fail(path, probe, specs.duplicated(), "spec",
              "appears twice (specs compared in canonical form)")
    row_fail(path, probe, (probe["steps_factor"] > MAX_STEPS_FACTOR) |
              (probe["steps_factor"] < 1 / MAX_STEPS_FACTOR), "steps_factor",
              f"is not from {1 / MAX_STEPS_FACTOR:g} to {MAX_STEPS_FACTOR:g} (steps relative "
              f"to fp32's)")


def check_quality_fits(path: Path | str, entry, collectives: pd.DataFrame,
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
            fail(path, f"field '{where}' names {name[:200]!r}, which is no sweep of "
                        f"collectives.csv or compressors.csv")
