"""The hostile-input corpus: cases generated from the shipped profiles, plan and cluster
configs by mutation (drop, rename, retype; NaN, inf, negative, huge; special files;
YAML anchors and aliases, deep nesting, duplicate keys; outputs onto inputs).

A case copies its sources into a fresh directory, mutates them, and runs one command
in-process. ``expect`` is ``"error"`` (one line, exit 2) or ``"any"`` (the mutation
may leave a valid input: then the command must succeed).
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bytecomp.profile_tables import TABLES

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "cnn"  # 1 node x 2 ranks
PLANNED = ROOT / "benchmarks" / "results" / "emulated" / "cnn-2x1-1gbit"  # 2 x 1, with a plan
CALIBRATION = ROOT / "tests" / "fixtures" / "calibration-1x2"  # profile --calibrate-only, 1 x 2
CLUSTER = ROOT / "bytecomp" / "configs" / "clusters" / "gbe1.yaml"
FAST_PLAN = ["--no-verify", "--compressor", "fp16", "--algorithm", "greedy", "--budget", "0",
             "--bucket-cap-mb", "25"]


@dataclass
class Case:
    """``mutate(root)`` changes the copied sources under ``root``; ``args`` may name
    ``{profile}``, ``{plan_profile}``, ``{plan}``, ``{cluster}``, ``{calibration}`` and
    ``{out}``."""

    id: str
    mutate: Callable[[Path], None]
    args: list[str]
    expect: str = "error"
    env: dict = field(default_factory=dict)


# -- sources and commands -------------------------------------------------------------------


def materialize(root: Path) -> dict[str, Path]:
    """Copy every source under ``root``; the placeholders' values."""
    shutil.copytree(PROFILE, root / "profile")
    shutil.copytree(PLANNED / "profile", root / "plan_profile")
    shutil.copy(PLANNED / "plan.yaml", root / "plan.yaml")
    shutil.copy(CLUSTER, root / "cluster.yaml")
    shutil.copytree(CALIBRATION, root / "calibration")
    (root / "out").mkdir()
    return {"profile": root / "profile", "plan_profile": root / "plan_profile",
            "plan": root / "plan.yaml", "cluster": root / "cluster.yaml",
            "calibration": root / "calibration", "out": root / "out" / "plan.yaml"}


PLAN_CMD = ["plan", "{profile}", "--out", "{out}", *FAST_PLAN]
SIMULATE_CMD = ["simulate", "{plan_profile}", "{plan}"]
CLUSTER_CMD = ["plan", "{profile}", "--cluster", "{cluster}", "--out", "{out}", *FAST_PLAN]


# -- mutations --------------------------------------------------------------------------------


def _yaml_edit(relative: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / relative
        data = yaml.safe_load(path.read_text())
        edit(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return mutate


def _walk(data, dotted: str):
    keys = dotted.split(".")
    for key in keys[:-1]:
        data = data[int(key)] if isinstance(data, list) else data[key]
    last = keys[-1]
    return data, int(last) if isinstance(data, list) else last


def yaml_set(relative: str, dotted: str, value) -> Callable[[Path], None]:
    def edit(data):
        parent, key = _walk(data, dotted)
        parent[key] = value
    return _yaml_edit(relative, edit)


def yaml_drop(relative: str, dotted: str) -> Callable[[Path], None]:
    def edit(data):
        parent, key = _walk(data, dotted)
        del parent[key]
    return _yaml_edit(relative, edit)


def yaml_rename(relative: str, dotted: str) -> Callable[[Path], None]:
    def edit(data):
        parent, key = _walk(data, dotted)
        parent[f"{key}_renamed"] = parent.pop(key)
    return _yaml_edit(relative, edit)


def write_text(relative: str, text: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        (root / relative).write_text(text)
    return mutate


def write_bytes(relative: str, data: bytes) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        (root / relative).write_bytes(data)
    return mutate


def append_text(relative: str, text: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        with open(root / relative, "a") as out:
            out.write(text)
    return mutate


def special(relative: str, kind: str) -> Callable[[Path], None]:
    """Replace the file by a FIFO, a link to /dev/zero or /dev/urandom, a directory, a
    dangling link, a link loop, or a sparse file over the size limit."""
    def mutate(root: Path) -> None:
        path = root / relative
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind in ("zero", "urandom"):
            path.symlink_to(f"/dev/{kind}")
        elif kind == "directory":
            path.mkdir()
        elif kind == "dangling":
            path.symlink_to(root / "no-such-file")
        elif kind == "loop":
            path.symlink_to(path)
        elif kind == "huge":
            with open(path, "wb") as out:
                out.truncate(65 << 20)
    return mutate


def _rows(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text())))


def _write_rows(path: Path, rows: list[list[str]]) -> None:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    path.write_text(buffer.getvalue())


def csv_edit(relative: str, edit: Callable[[list[list[str]]], list[list[str]]]):
    def mutate(root: Path) -> None:
        path = root / relative
        _write_rows(path, edit(_rows(path)))
    return mutate


def csv_cell(relative: str, column: str, value: str, row: int = 1):
    def edit(rows):
        rows[row][rows[0].index(column)] = value
        return rows
    return csv_edit(relative, edit)


def csv_drop_column(relative: str, column: str):
    def edit(rows):
        index = rows[0].index(column)
        return [r[:index] + r[index + 1:] for r in rows]
    return csv_edit(relative, edit)


def csv_rename_column(relative: str, column: str):
    def edit(rows):
        rows[0][rows[0].index(column)] = column + "_renamed"
        return rows
    return csv_edit(relative, edit)


# -- YAML attacks ----------------------------------------------------------------------------

BILLION_LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["name: *i", "nodes: 2", "ranks_per_node: 1"]) + "\n"
DEEP = "a: " + "[" * 5000 + "]" * 5000 + "\n"
HUGE_INTEGER = "nodes: 1" + "0" * 5000 + "\n"


def _yaml_attacks(relative: str, command: list[str]) -> list[Case]:
    prefix = f"{Path(relative).name}:"
    return [
        Case(f"{prefix}billion-laughs", write_text(relative, BILLION_LAUGHS), command),
        Case(f"{prefix}anchor-and-alias", append_text(relative, "\nx: &anchor 1\ny: *anchor\n"),
             command),
        Case(f"{prefix}deep-nesting", write_text(relative, DEEP), command),
        Case(f"{prefix}huge-integer", write_text(relative, HUGE_INTEGER), command),
        Case(f"{prefix}duplicate-key", append_text(relative, "\nnodes: 3\nnodes: 4\n"), command),
        Case(f"{prefix}not-a-mapping", write_text(relative, "- 1\n- 2\n"), command),
        Case(f"{prefix}empty", write_text(relative, ""), command),
        Case(f"{prefix}scalar", write_text(relative, "just text\n"), command),
        Case(f"{prefix}bad-syntax", write_text(relative, "a: [1, 2\nb: }\n"), command),
        Case(f"{prefix}python-tag", write_text(relative, "a: !!python/object/apply:os.system "
                                                         "['touch pwned']\n"), command),
        Case(f"{prefix}binary", write_bytes(relative, bytes(range(256)) * 4), command),
        Case(f"{prefix}bad-date", write_text(relative, "a: 2001-13-45\n"), command),
        *[Case(f"{prefix}special-{kind}", special(relative, kind), command)
          for kind in ("fifo", "zero", "urandom", "directory", "dangling", "loop", "huge")],
    ]


BAD_NUMBERS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "negative": -1,
               "zero": 0, "huge": 1e300, "huge-int": 10 ** 30, "string": "12", "bool": True,
               "null": None, "list": [1], "mapping": {"a": 1}}


# -- the corpus ------------------------------------------------------------------------------


def _profile_yaml_cases() -> list[Case]:
    cases = []
    required = ["format_version", "model", "device", "backend", "world_size", "nodes",
                "ranks_per_node", "batch_size", "bucket_cap_mb", "times"]
    for key in required:
        cases.append(Case(f"profile.yaml:drop-{key}", yaml_drop("profile/profile.yaml", key),
                          PLAN_CMD))
        cases.append(Case(f"profile.yaml:rename-{key}", yaml_rename("profile/profile.yaml", key),
                          PLAN_CMD))
    for key in ("format_version", "world_size", "nodes", "ranks_per_node", "batch_size",
                "bucket_cap_mb"):
        for name, value in BAD_NUMBERS.items():
            cases.append(Case(f"profile.yaml:{key}={name}",
                              yaml_set("profile/profile.yaml", key, value), PLAN_CMD))
    for key in ("model", "device", "times", "backend"):
        cases.append(Case(f"profile.yaml:{key}=retyped", yaml_set("profile/profile.yaml", key,
                                                                 [1, 2]), PLAN_CMD))
    phases = ["forward", "backward", "optimizer", "iteration", "forward_compute",
              "backward_compute", "optimizer_compute", "iteration_compute"]
    for phase in phases:
        for statistic in ("median_ms", "p90_ms"):
            for name in ("nan", "inf", "negative", "huge", "string", "null"):
                cases.append(Case(f"profile.yaml:times.{phase}.{statistic}={name}",
                                  yaml_set("profile/profile.yaml", f"times.{phase}.{statistic}",
                                           BAD_NUMBERS[name]), PLAN_CMD))
        required_phase = phase in ("forward", "backward", "optimizer", "iteration",
                                   "backward_compute")
        cases.append(Case(f"profile.yaml:drop-times.{phase}",
                          yaml_drop("profile/profile.yaml", f"times.{phase}"), PLAN_CMD,
                          "error" if required_phase else "any"))
        cases.append(Case(f"profile.yaml:times.{phase}=retyped",
                          yaml_set("profile/profile.yaml", f"times.{phase}", "fast"), PLAN_CMD))
    for name in ("nan", "negative", "huge", "string"):
        cases.append(Case(f"profile.yaml:interference.fraction={name}",
                          yaml_set("profile/profile.yaml", "interference.fraction",
                                   BAD_NUMBERS[name]), PLAN_CMD))
    cases += [
        Case("profile.yaml:machine.memory_gib=nan",
             yaml_set("profile/profile.yaml", "machine.memory_gib", math.nan), PLAN_CMD),
        *[Case(f"profile.yaml:probe.steps={name}",
               yaml_set("profile/profile.yaml", "probe", {"steps": BAD_NUMBERS[name]}), PLAN_CMD,
               "any" if name == "zero" else "error")
          for name in ("nan", "negative", "zero", "huge", "huge-int", "string", "bool", "list")],
        Case("profile.yaml:probe=list", yaml_set("profile/profile.yaml", "probe", [1]),
             PLAN_CMD),
        Case("profile.yaml:drop-model.fingerprint",
             yaml_drop("profile/profile.yaml", "model.fingerprint"), PLAN_CMD),
        Case("profile.yaml:device.type=tpu", yaml_set("profile/profile.yaml", "device.type",
                                                      "tpu"), PLAN_CMD),
        Case("profile.yaml:world_size=4", yaml_set("profile/profile.yaml", "world_size", 4),
             PLAN_CMD),
        Case("profile.yaml:nodes=2,ranks_per_node=1",  # collectives say 2 ranks per node
             lambda root: (yaml_set("profile/profile.yaml", "nodes", 2)(root),
                           yaml_set("profile/profile.yaml", "ranks_per_node", 1)(root)),
             PLAN_CMD),
        Case("profile.yaml:unknown-key", yaml_set("profile/profile.yaml", "extra", {"a": 1}),
             PLAN_CMD, "any"),
        Case("profile.yaml:drop-interference", yaml_drop("profile/profile.yaml",
                                                         "interference"), PLAN_CMD, "any"),
        Case("profile:missing-profile.yaml",
             lambda root: (root / "profile" / "profile.yaml").unlink(), PLAN_CMD),
        Case("profile:not-a-directory", lambda root: (shutil.rmtree(root / "profile"),
                                                      (root / "profile").write_text("x")),
             PLAN_CMD),
    ]
    return cases + _yaml_attacks("profile/profile.yaml", PLAN_CMD)


# Per table: its columns and their types (int and float columns are numbers), as the store
# reads them.
TABLE_COLUMNS = TABLES
# The shipped profile has no convergence probe: its cases first write this one.
PROBE_CSV = "spec,steps_factor,steps\nfp16,1.02,100\ntopk:ratio=0.01,1.8,100\n"
# Nor an aggregation sweep (it predates it): likewise.
AGGREGATION_CSV = ("spec,device,numel,one_ms,each_ms\ntopk:ratio=0.01,cpu,1024,0.02,0.001\n"
                   "topk:ratio=0.01,cpu,262144,0.09,0.01\n")
WRITTEN_FIRST = {"probe": PROBE_CSV, "aggregation": AGGREGATION_CSV}
ALLOW_NEGATIVE: set[str] = set()
BAD_STRINGS = {
    "tensors": {"name": "", "shape": "axb", "dtype": "int64"},
    "collectives": {"collective": "bogus", "group": "rack", "dtype": "int4"},
    "compressors": {"spec": "zip:level=9", "device": "tpu"},
    "copies": {"direction": "sideways"},
    "fidelity": {"tensor": "no.such.tensor", "spec": "topk:ratio=7"},
    "probe": {"spec": "zip:level=9"},
    "aggregation": {"spec": "zip:level=9", "device": "tpu"},
}


def _written_first(table: str, mutate: Callable[[Path], None]) -> Callable[[Path], None]:
    def with_table(root: Path) -> None:
        (root / "profile" / f"{table}.csv").write_text(WRITTEN_FIRST[table])
        mutate(root)
    return with_table


def _table_cases() -> list[Case]:
    cases = []
    for table, columns in TABLE_COLUMNS.items():
        relative = f"profile/{table}.csv"
        for column, kind in columns.items():
            cases.append(Case(f"{table}.csv:drop-{column}", csv_drop_column(relative, column),
                              PLAN_CMD))
            cases.append(Case(f"{table}.csv:rename-{column}", csv_rename_column(relative, column),
                              PLAN_CMD))
            if kind is str:
                cases.append(Case(f"{table}.csv:{column}=bad", csv_cell(
                    relative, column, BAD_STRINGS[table][column]), PLAN_CMD))
                continue
            values = {"empty": "", "text": "x", "nan": "nan", "inf": "inf", "huge": "1e20"}
            if column not in ALLOW_NEGATIVE:
                values["negative"] = "-1"
            if kind is int:
                values["fraction"] = "1.5"
            if column in ("gain", "gain_p10", "gain_p90", "norm_share"):
                values["above-one"] = "1.5"
            for name, value in values.items():
                cases.append(Case(f"{table}.csv:{column}={name}", csv_cell(relative, column,
                                                                           value), PLAN_CMD))
        for kind in ("fifo", "zero", "directory", "dangling", "huge"):
            cases.append(Case(f"{table}.csv:special-{kind}", special(relative, kind), PLAN_CMD))
        optional = table in ("copies", "fidelity", "probe", "aggregation")
        cases += [
            Case(f"{table}.csv:missing", lambda root, r=relative: (root / r).unlink(), PLAN_CMD,
                 "any" if optional else "error"),
            Case(f"{table}.csv:empty-file", write_text(relative, ""), PLAN_CMD),
            Case(f"{table}.csv:binary", write_bytes(relative, bytes(range(256)) * 4), PLAN_CMD),
            Case(f"{table}.csv:ragged-row", append_text(relative, "a,b,c,d,e,f,g,h,i,j,k\n"),
                 PLAN_CMD),
            Case(f"{table}.csv:unterminated-quote", append_text(relative, '"open,1,2\n'),
                 PLAN_CMD),
            Case(f"{table}.csv:header-only", csv_edit(relative, lambda rows: rows[:1]), PLAN_CMD,
                 "error" if table in ("tensors", "collectives") else "any"),
            Case(f"{table}.csv:extra-column", csv_edit(
                relative, lambda rows: [r + ["extra" if i == 0 else "1"]
                                        for i, r in enumerate(rows)]), PLAN_CMD, "any"),
            Case(f"{table}.csv:duplicate-row", csv_edit(
                relative, lambda rows: rows + rows[1:2]), PLAN_CMD,
                "error" if table in ("tensors", "probe", "fidelity") else "any"),
        ]
    cases += [
        Case("probe.csv:valid", lambda root: None, PLAN_CMD, "any"),
        Case("probe.csv:steps_factor-above-the-cap", csv_cell("profile/probe.csv",
                                                              "steps_factor", "11"), PLAN_CMD),
        Case("probe.csv:same-spec-spelled-twice", csv_edit(
            "profile/probe.csv", lambda rows: rows + [["topk:ratio=0.010", "1.5", "100"]]),
            PLAN_CMD),
    ]
    for case in cases:
        table = case.id.split(".csv:")[0]
        if table in WRITTEN_FIRST:
            case.mutate = _written_first(table, case.mutate)
    cases += [
        Case("tensors.csv:reversed-rows", csv_edit(
            "profile/tensors.csv", lambda rows: rows[:1] + rows[:0:-1]), PLAN_CMD),
        Case("tensors.csv:numel-mismatch", csv_cell("profile/tensors.csv", "numel", "11"),
             PLAN_CMD),
        Case("tensors.csv:bytes-mismatch", csv_cell("profile/tensors.csv", "bytes", "41"),
             PLAN_CMD),
        Case("tensors.csv:ready-after-backward", csv_cell(
            "profile/tensors.csv", "ready_ms", "9999", row=20), PLAN_CMD),
        Case("tensors.csv:dtype-float16", csv_cell("profile/tensors.csv", "dtype", "float16"),
             PLAN_CMD),  # bytes no longer numel x 2
        Case("collectives.csv:ranks=3", csv_cell("profile/collectives.csv", "ranks", "3"),
             PLAN_CMD),
        Case("collectives.csv:only-a-header-and-a-row", csv_edit(
            "profile/collectives.csv", lambda rows: rows[:2]), PLAN_CMD),
    ]
    return cases


def _plan_cases() -> list[Case]:
    plan = "plan.yaml"
    cases = []
    for key in ("format_version", "model_fingerprint", "world_size", "nodes", "ranks_per_node",
                "bucket_cap_mb", "tensors"):
        cases.append(Case(f"plan.yaml:drop-{key}", yaml_drop(plan, key), SIMULATE_CMD))
    for key in ("predicted_ms", "search", "fidelity", "objective"):
        cases.append(Case(f"plan.yaml:drop-{key}", yaml_drop(plan, key), SIMULATE_CMD, "any"))
    for key in ("world_size", "nodes", "ranks_per_node", "bucket_cap_mb", "format_version",
                "host_workers"):
        for name, value in BAD_NUMBERS.items():
            valid = key == "bucket_cap_mb" and name == "zero"  # one bucket per tensor
            cases.append(Case(f"plan.yaml:{key}={name}", yaml_set(plan, key, value),
                              SIMULATE_CMD, "any" if valid else "error"))
    for name, value in (("other", "f" * 64), ("number", 5), ("null", None)):
        cases.append(Case(f"plan.yaml:model_fingerprint={name}",
                          yaml_set(plan, "model_fingerprint", value), SIMULATE_CMD))
    entry_values = {"name": ["", 5, None, "no.such.tensor"],
                    "action": ["maybe", None, 1], "compressor": ["zip", 7, "topk:ratio=2"],
                    "place": ["moon", None], "collective": ["broadcast", None, 3],
                    "group": [-1, "x", 1.5, None, True]}
    for field_name, values in entry_values.items():
        cases.append(Case(f"plan.yaml:tensors.0.drop-{field_name}",
                          yaml_drop(plan, f"tensors.0.{field_name}"), SIMULATE_CMD))
        for value in values:
            cases.append(Case(f"plan.yaml:tensors.0.{field_name}={value!r}",
                              yaml_set(plan, f"tensors.0.{field_name}", value), SIMULATE_CMD))
    cases += [
        Case("plan.yaml:tensors=[]", yaml_set(plan, "tensors", []), SIMULATE_CMD),
        Case("plan.yaml:tensors=mapping", yaml_set(plan, "tensors", {"a": 1}), SIMULATE_CMD),
        Case("plan.yaml:tensors.0=scalar", yaml_set(plan, "tensors.0", "fc1"), SIMULATE_CMD),
        Case("plan.yaml:duplicate-entry", _yaml_edit(
            plan, lambda d: d["tensors"].append(dict(d["tensors"][0]))), SIMULATE_CMD),
        Case("plan.yaml:drop-an-entry", _yaml_edit(plan, lambda d: d["tensors"].pop()),
             SIMULATE_CMD),
        Case("plan.yaml:spec-without-timings", _yaml_edit(plan, _compress_first(
            "qsgd:levels=16", "allgather")), SIMULATE_CMD),
        Case("plan.yaml:hierarchical-on-one-rank-per-node", _yaml_edit(plan, _compress_first(
            "fp16", "hierarchical")), SIMULATE_CMD),
        Case("plan.yaml:group-mixes-strategies", _yaml_edit(plan, _mix_group), SIMULATE_CMD),
        Case("plan.yaml:shape-1x2-on-a-2x1-profile", lambda root: (
            yaml_set(plan, "nodes", 1)(root), yaml_set(plan, "ranks_per_node", 2)(root)),
            SIMULATE_CMD),
        Case("plan.yaml:unknown-key", yaml_set(plan, "extra", [1, 2]), SIMULATE_CMD, "any"),
        Case("plan.yaml:valid", lambda root: None, SIMULATE_CMD, "any"),
    ]
    return cases + _yaml_attacks(plan, SIMULATE_CMD)


def _to_ladder(data: dict) -> None:
    """The shipped plan as an adaptive plan: fp16 everywhere, then top-k 1% (error
    feedback) everywhere, in the plan's groups."""
    def level(setting: str, spec: str, collective: str) -> dict:
        return {"setting": setting, "predicted_ms": 70.0, "fidelity": 0.9, "tensors": [
            {**entry, "action": "compress", "compressor": spec, "place": "device",
             "collective": collective} for entry in data["tensors"]]}

    data["adaptive"] = {"family": "topk", "threshold": 0.75, "window": 10}
    data["levels"] = [level("fp16", "fp16", "allreduce"),
                      level("topk:ratio=0.01", "topk:ratio=0.01", "allgather")]
    del data["tensors"]


def ladder_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def both(data: dict) -> None:
        _to_ladder(data)
        edit(data)
    return _yaml_edit("plan.yaml", both)


def _ladder_cases() -> list[Case]:
    level1 = [*SIMULATE_CMD, "--level", "1"]

    def setter(dotted: str, value):
        def edit(data):
            parent, key = _walk(data, dotted)
            parent[key] = value
        return edit

    def dropper(dotted: str):
        def edit(data):
            parent, key = _walk(data, dotted)
            del parent[key]
        return edit

    cases = [
        Case("ladder:valid-level-0", ladder_edit(lambda d: None), SIMULATE_CMD, "any"),
        Case("ladder:valid-level-1", ladder_edit(lambda d: None), level1, "any"),
        Case("ladder:level-2", ladder_edit(lambda d: None), [*SIMULATE_CMD, "--level", "2"]),
        Case("ladder:level--1", ladder_edit(lambda d: None), [*SIMULATE_CMD, "--level", "-1"]),
        Case("ladder:level-of-a-static-plan", lambda root: None, level1),
        Case("ladder:one-level", ladder_edit(lambda d: d["levels"].pop()), SIMULATE_CMD),
        Case("ladder:levels=[]", ladder_edit(setter("levels", [])), SIMULATE_CMD),
        Case("ladder:levels=mapping", ladder_edit(setter("levels", {"a": 1})), SIMULATE_CMD),
        Case("ladder:levels.1=scalar", ladder_edit(setter("levels.1", "topk")), SIMULATE_CMD),
        Case("ladder:and-tensors", ladder_edit(lambda d: d.update(tensors=d["levels"][0]
                                                                  ["tensors"])), SIMULATE_CMD),
        Case("ladder:adaptive-without-levels",
             yaml_set("plan.yaml", "adaptive", {"family": "topk"}), SIMULATE_CMD),
        Case("ladder:drop-adaptive", ladder_edit(dropper("adaptive")), SIMULATE_CMD),
        Case("ladder:drop-adaptive.family", ladder_edit(dropper("adaptive.family")),
             SIMULATE_CMD),
        Case("ladder:adaptive.unknown", ladder_edit(setter("adaptive.speed", 3)),
             SIMULATE_CMD),
        Case("ladder:adaptive.timing=guess", ladder_edit(setter("adaptive.timing", "guess")),
             SIMULATE_CMD),
        Case("ladder:drop-levels.1.setting", ladder_edit(dropper("levels.1.setting")),
             SIMULATE_CMD),
        Case("ladder:levels.1.drop-a-tensor", ladder_edit(
            lambda d: d["levels"][1]["tensors"].pop()), level1),
        Case("ladder:levels.1.without-error-feedback", ladder_edit(
            lambda d: [e.update(compressor="topk:ratio=0.01,ef=false")
                       for e in d["levels"][1]["tensors"]]), level1),
        Case("ladder:levels.1.spec-without-timings", ladder_edit(
            lambda d: [e.update(compressor="topk:ratio=0.05")
                       for e in d["levels"][1]["tensors"]]), level1),
        Case("ladder:levels.1.tensors.0.group=-1", ladder_edit(
            setter("levels.1.tensors.0.group", -1)), level1),
    ]
    for key in ("threshold", "tolerance", "window", "explore_every"):
        for name in ("nan", "inf", "negative", "huge", "string", "bool", "null"):
            cases.append(Case(f"ladder:adaptive.{key}={name}", ladder_edit(
                setter(f"adaptive.{key}", BAD_NUMBERS[name])), SIMULATE_CMD))
    for key in ("predicted_ms", "fidelity"):
        for name in ("nan", "inf", "negative", "huge", "string", "bool"):
            cases.append(Case(f"ladder:levels.1.{key}={name}", ladder_edit(
                setter(f"levels.1.{key}", BAD_NUMBERS[name])), level1))
        cases.append(Case(f"ladder:levels.1.{key}=null", ladder_edit(
            setter(f"levels.1.{key}", None)), level1, "any"))
    return cases


def _compress_first(spec: str, collective: str):
    def edit(data):
        entry = data["tensors"][0]
        group = max(e["group"] for e in data["tensors"]) + 1
        entry.update(action="compress", compressor=spec, place="device", collective=collective,
                     group=group)
    return edit


def _mix_group(data):
    first, second = data["tensors"][0], data["tensors"][1]
    second["group"] = first["group"]
    second.update(action="compress", compressor="fp16", collective="allreduce") \
        if first["action"] == "none" else second.update(action="none", compressor=None,
                                                        collective="allreduce")


def _cluster_cases() -> list[Case]:
    config = "cluster.yaml"
    cases = []
    for name, value in BAD_NUMBERS.items():
        cases.append(Case(f"cluster.yaml:cpu_cores={name}", yaml_set(config, "cpu_cores", value),
                          CLUSTER_CMD, "any" if value is None else "error"))  # null: not given
    for key in ("nodes", "ranks_per_node"):
        cases.append(Case(f"cluster.yaml:drop-{key}", yaml_drop(config, key), CLUSTER_CMD))
        for name, value in BAD_NUMBERS.items():
            cases.append(Case(f"cluster.yaml:{key}={name}", yaml_set(config, key, value),
                              CLUSTER_CMD))
    for field_name in ("bandwidth_gbps", "latency_us"):
        cases.append(Case(f"cluster.yaml:drop-links.inter.{field_name}",
                          yaml_drop(config, f"links.inter.{field_name}"), CLUSTER_CMD))
        for name in ("nan", "inf", "negative", "string", "null", "bool"):
            cases.append(Case(f"cluster.yaml:links.inter.{field_name}={name}",
                              yaml_set(config, f"links.inter.{field_name}", BAD_NUMBERS[name]),
                              CLUSTER_CMD))
    cases += [
        Case("cluster.yaml:links.inter.bandwidth_gbps=0",
             yaml_set(config, "links.inter.bandwidth_gbps", 0), CLUSTER_CMD),
        Case("cluster.yaml:drop-links", yaml_drop(config, "links"), CLUSTER_CMD),
        Case("cluster.yaml:links=list", yaml_set(config, "links", [1]), CLUSTER_CMD),
        Case("cluster.yaml:links.inter=text", yaml_set(config, "links.inter", "fast"),
             CLUSTER_CMD),
        Case("cluster.yaml:links.extra", yaml_set(config, "links.extra", {"a": 1}), CLUSTER_CMD),
        Case("cluster.yaml:links.inter.unknown", yaml_set(config, "links.inter.mtu", 9000),
             CLUSTER_CMD),
        Case("cluster.yaml:name=list", yaml_set(config, "name", [1, 2]), CLUSTER_CMD),
        Case("cluster.yaml:name=long", yaml_set(config, "name", "n" * 5000), CLUSTER_CMD),
        Case("cluster.yaml:ranks_per_node=2-without-intra",
             yaml_set(config, "ranks_per_node", 2), CLUSTER_CMD),
        Case("cluster.yaml:links.inter=profile", yaml_set(config, "links.inter", "profile"),
             CLUSTER_CMD),  # the 1 x 2 profile has no inter-node communication to fit
        Case("cluster.yaml:valid", lambda root: None, CLUSTER_CMD, "any"),
    ]
    return cases + _yaml_attacks(config, CLUSTER_CMD)


def _output_cases() -> list[Case]:
    """Outputs that are inputs, or cannot be written."""
    nothing = lambda root: None  # noqa: E731
    long_name = "{out}" + "x" * 300

    def link_out(root: Path) -> None:
        (root / "out" / "target.yaml").write_text("old\n")
        (root / "out" / "plan.yaml").symlink_to(root / "out" / "target.yaml")

    return [
        Case("out:plan-onto-profile.yaml", nothing,
             ["plan", "{profile}", "--out", "{profile}/profile.yaml", *FAST_PLAN]),
        Case("out:plan-onto-tensors.csv", nothing,
             ["plan", "{profile}", "--out", "{profile}/tensors.csv", *FAST_PLAN]),
        Case("out:plan-onto-the-cluster", nothing,
             ["plan", "{profile}", "--cluster", "{cluster}", "--out", "{cluster}", *FAST_PLAN]),
        Case("out:plan-through-a-link-to-tensors.csv",
             lambda root: (root / "out" / "plan.yaml").symlink_to(root / "profile" / "tensors.csv"),
             PLAN_CMD),
        Case("out:plan-onto-a-hard-link-of-profile.yaml",
             lambda root: os.link(root / "profile" / "profile.yaml", root / "out" / "plan.yaml"),
             PLAN_CMD),
        Case("out:simulate-trace-onto-tensors.csv", nothing,
             [*SIMULATE_CMD, "--trace", "{plan_profile}/tensors.csv"]),
        Case("out:simulate-png-onto-the-plan", nothing, [*SIMULATE_CMD, "--png", "{plan}"]),
        Case("out:simulate-trace-and-png-the-same", nothing,
             [*SIMULATE_CMD, "--trace", "{out}", "--png", "{out}"]),
        Case("out:bench-onto-the-profile", nothing,
             ["bench", "{plan_profile}", "--plan", "{plan}", "--out", "{plan_profile}",
              "--force", "--nproc", "2"]),
        Case("out:bench-onto-the-plan", nothing,
             ["bench", "{plan_profile}", "--plan", "{plan}", "--out", "{plan}", "--nproc", "2"]),
        Case("out:bench-onto-the-second-plan",
             lambda root: shutil.copy(root / "plan.yaml", root / "second.yaml"),
             ["bench", "{plan_profile}", "--plan", "{plan}", "--plan", "second.yaml", "--out",
              "second.yaml", "--force", "--nproc", "2"]),
        Case("bench:second-plan-of-another-world-size", lambda root: (
            shutil.copy(root / "plan.yaml", root / "second.yaml"),
            yaml_set("second.yaml", "nodes", 1)(root),
            yaml_set("second.yaml", "world_size", 1)(root)),
            ["bench", "{plan_profile}", "--plan", "{plan}", "--plan", "second.yaml", "--out",
             "{out}.d", "--nproc", "2"]),
        Case("bench:second-plan-for-another-model", lambda root: (
            shutil.copy(root / "plan.yaml", root / "second.yaml"),
            yaml_set("second.yaml", "model_fingerprint", "f" * 64)(root)),
            ["bench", "{plan_profile}", "--plan", "{plan}", "--plan", "second.yaml", "--out",
             "{out}.d", "--nproc", "2"]),
        Case("out:plan-adaptive-onto-the-profile", nothing,
             ["plan", "{profile}", "--adaptive", "topk", "--out", "{profile}/profile.yaml"]),
        Case("out:name-too-long", nothing, ["plan", "{profile}", "--out", long_name,
                                            *FAST_PLAN]),
        Case("out:trace-name-too-long", nothing, [*SIMULATE_CMD, "--trace", long_name]),
        Case("out:profile-name-too-long", nothing, ["profile", "--out", long_name]),
        Case("out:in-proc", nothing, ["plan", "{profile}", "--out", "/proc/bytecomp.yaml",
                                      *FAST_PLAN]),
        Case("out:through-a-link", link_out, PLAN_CMD, "any"),
        Case("out:plan-profile-is-a-file", nothing, ["plan", "{plan}", *FAST_PLAN]),
        Case("out:cluster-name-too-long", nothing,
             ["plan", "{profile}", "--cluster", "c" * 300, *FAST_PLAN]),
        Case("env:world-size-two", nothing, ["profile", "--out", "{out}.d"],
             env={"RANK": "0", "WORLD_SIZE": "two"}),
        Case("env:rank-beyond-world", nothing, ["profile", "--out", "{out}.d"],
             env={"RANK": "5", "WORLD_SIZE": "2"}),
        Case("env:local-world-size-zero", nothing, ["profile", "--out", "{out}.d"],
             env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"}),
        Case("model:factory-calls-sys-exit", nothing,
             ["profile", "--model", "factories:exits", "--out", "{out}.d"]),
    ]


# -- round two (issue 42): runaway options, plan fields, profile consistency, physical
# ranges, options without effect ----------------------------------------------------------

PLAN_NPROC = ["plan", "{plan_profile}", "--out", "{out}", "--nproc"]


def _round_two_cases() -> list[Case]:
    nothing = lambda root: None  # noqa: E731
    plan, profile_yaml = "plan.yaml", "profile/profile.yaml"
    cases = [
        Case("nproc:profile-a-million", nothing, ["profile", "--nproc", "1000000", "--out",
                                                  "{out}.d"]),
        Case("nproc:bench-a-million", nothing, ["bench", "{plan_profile}", "--plan", "{plan}",
                                                "--out", "{out}.d", "--nproc", "1000000"]),
        Case("nproc:plan-a-million", nothing, [*PLAN_NPROC, "1000000"]),
        Case("nproc:profile-zero", nothing, ["profile", "--nproc", "0", "--out", "{out}.d"]),
        Case("nproc:profile-64-on-a-small-machine", nothing,
             ["profile", "--nproc", str(8 * (os.cpu_count() or 1) + 1), "--out", "{out}.d"]),
    ]
    for name in ("nan", "inf", "negative", "huge", "string", "bool", "list"):
        cases.append(Case(f"plan.yaml:predicted_ms.plan={name}", yaml_set(
            plan, "predicted_ms.plan", BAD_NUMBERS[name]), SIMULATE_CMD))
        cases.append(Case(f"plan.yaml:predicted_ms.baselines.fp32={name}", _yaml_edit(
            plan, lambda d, v=BAD_NUMBERS[name]: d["predicted_ms"].setdefault(
                "baselines", {}).update({"fp32 DDP": v})), SIMULATE_CMD))
    for value in (5, -0.1, math.nan, "high"):
        cases.append(Case(f"plan.yaml:objective.min_fidelity={value!r}", _yaml_edit(
            plan, lambda d, v=value: d.setdefault("objective", {"name": "effective"}).update(
                min_fidelity=v)), SIMULATE_CMD))
    cases += [
        Case("plan.yaml:objective.name=foo", _yaml_edit(
            plan, lambda d: d.setdefault("objective", {}).update(name="foo")), SIMULATE_CMD),
        Case("plan.yaml:objective=list", yaml_set(plan, "objective", [1]), SIMULATE_CMD),
        Case("plan.yaml:fidelity.plan=2", yaml_set(plan, "fidelity", {"plan": 2}),
             SIMULATE_CMD),
        Case("plan.yaml:compress-with-none", _yaml_edit(plan, _compress_first(
            "none", "allreduce")), SIMULATE_CMD),
        Case("ladder:adaptive.family=foo", ladder_edit(
            lambda d: d["adaptive"].update(family="foo")), SIMULATE_CMD),
        Case("ladder:levels.1.setting=lots", ladder_edit(
            lambda d: d["levels"][1].update(setting="lots")), SIMULATE_CMD),
        Case("ladder:levels.0.setting=of-level-1", ladder_edit(
            lambda d: d["levels"][0].update(setting=d["levels"][1]["setting"])), SIMULATE_CMD),
        Case("profile.yaml:backend=mpi", yaml_set(profile_yaml, "backend", "mpi"), PLAN_CMD),
        Case("profile.yaml:model.fingerprint=12345",
             yaml_set(profile_yaml, "model.fingerprint", 12345), PLAN_CMD),
        Case("profile.yaml:model.tensors-disagrees",
             yaml_set(profile_yaml, "model.tensors", 3), PLAN_CMD),
        Case("profile.yaml:model.parameters-disagrees",
             yaml_set(profile_yaml, "model.parameters", 5), PLAN_CMD),
        Case("profile.yaml:model.parameters=string",
             yaml_set(profile_yaml, "model.parameters", "many"), PLAN_CMD),
        Case("profile.yaml:backward-longer-than-the-iteration", yaml_set(
            profile_yaml, "times.backward.median_ms", 10_000.0), PLAN_CMD),
        Case("profile.yaml:backward_compute-longer-than-the-iteration", _yaml_edit(
            profile_yaml, lambda d: d["times"]["backward_compute"].update(
                median_ms=2 * d["times"]["iteration_compute"]["median_ms"])), PLAN_CMD),
        Case("compressors.csv:payload_bytes=0", csv_cell("profile/compressors.csv",
                                                         "payload_bytes", "0"), PLAN_CMD),
        Case("fidelity.csv:spec-without-timings", csv_cell(
            "profile/fidelity.csv", "spec", "qsgd:levels=16"), PLAN_CMD),
        Case("fidelity.csv:same-pair-spelled-twice", csv_edit(
            "profile/fidelity.csv", lambda rows: rows + [[rows[1][0], "fp16", *rows[1][2:]]]),
            PLAN_CMD),
        *[Case(f"probe.csv:steps_factor={value}", _written_first("probe", csv_cell(
            "profile/probe.csv", "steps_factor", value)), PLAN_CMD) for value in ("0", "0.01")],
        Case("cluster.yaml:latency_us=1e308", yaml_set("cluster.yaml", "links.inter.latency_us",
                                                       1e308), CLUSTER_CMD),
        Case("cluster.yaml:bandwidth_gbps=1e-300", yaml_set(
            "cluster.yaml", "links.inter.bandwidth_gbps", 1e-300), CLUSTER_CMD),
        Case("cluster.yaml:bandwidth_gbps=1e9", yaml_set(
            "cluster.yaml", "links.inter.bandwidth_gbps", 1e9), CLUSTER_CMD),
        Case("cluster:empty-name", nothing, ["plan", "{profile}", "--cluster", "", "--out",
                                             "{out}", *FAST_PLAN]),
        Case("bench:empty-cluster-name", nothing, [
            "bench", "{plan_profile}", "--plan", "{plan}", "--out", "{out}.d", "--cluster", "",
            "--nproc", "2"]),
        *[Case(f"plan:{option}-without-adaptive", nothing, [*PLAN_CMD, option, value])
          for option, value in (("--window", "5"), ("--gain-threshold", "0.5"),
                                ("--timing", "predicted"), ("--agree-every", "3"))],
        Case("plan:min-fidelity-with-objective-time", nothing,
             [*PLAN_CMD, "--objective", "time", "--min-fidelity", "0.5"]),
        Case("plan:verify-steps-with-no-verify", nothing, [*PLAN_CMD, "--verify-steps", "10"]),
    ]
    return cases


# -- round three, class 5: plan and profile fields still unchecked ----------------------------

ESCAPE = "\x1b[2J\x1b[31mcluster\x1b[0m\a"  # clears the screen, rings the bell


def _verified(data: dict) -> None:
    """The shipped plan as a verified one: its finalists (fp32 DDP, and the plan, chosen)
    and the record of their training."""
    fp32, planned = data["predicted_ms"]["baselines"]["fp32 DDP"], data["predicted_ms"]["plan"]
    cap = data["bucket_cap_mb"]
    data["finalists"] = [
        {"name": "fp32 DDP", "source": "baseline", "bucket_cap_mb": cap, "predicted_ms": fp32,
         "fidelity": 1.0, "steps_factor": 1.0, "value": fp32, "chosen": False},
        {"name": "bytecomp plan", "source": "search", "bucket_cap_mb": cap,
         "predicted_ms": planned, "fidelity": 0.99, "steps_factor": 1.02,
         "value": round(planned * 1.02, 4), "chosen": True}]
    data["verification"] = {"steps": 60, "batches": "validation", "seconds": 12.5,
                            "fp32_improvement": 0.5, "fp32_last_quarter": 0.01,
                            "chosen": "bytecomp plan", "reason": "the least predicted time x "
                                                                "measured steps"}


def _trial(data: dict) -> None:
    """The verified plan with its runtime trial: fp32 DDP as level 0, the plan as level 1
    (where it starts)."""
    _verified(data)
    entries = data.pop("tensors")
    fp32 = [{**e, "action": "none", "compressor": None, "place": "device",
             "collective": "allreduce"} for e in entries]
    data["adaptive"] = {"family": "finalists", "threshold": 0.75, "window": 10,
                        "explore_every": 10 ** 9, "start": 1, "trial": [0, 1],
                        "trial_steps": 20, "trial_warmup": 10}
    data["levels"] = [
        {"setting": "fp32 DDP", "predicted_ms": 92.7, "fidelity": 1.0, "gain": 1.0,
         "steps_factor": 1.0, "tensors": fp32},
        {"setting": "bytecomp plan", "predicted_ms": 68.7, "fidelity": 0.99, "gain": 0.99,
         "steps_factor": 1.02, "tensors": entries}]


def verified_edit(edit: Callable[[dict], None], trial: bool = False) -> Callable[[Path], None]:
    def both(data: dict) -> None:
        (_trial if trial else _verified)(data)
        edit(data)
    return _yaml_edit("plan.yaml", both)


def _set_in(dotted: str, value) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        parent, key = _walk(data, dotted)
        parent[key] = value
    return edit


QUALITY = {"min_r2": 0.9, "max_worst_relative_error": 0.25, "retries": 2,
           "remeasured": ["collective alltoall/world/float32", "compressor fp16/cpu"],
           "poor": [{"fit": "collective alltoall/world/float32", "r2": 0.97,
                     "worst_relative_error": 0.38}]}


def quality_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """profile.yaml with a quality section (the shipped cnn profile predates it), edited."""
    def both(data: dict) -> None:
        import copy

        data["quality"] = copy.deepcopy(QUALITY)
        edit(data)
    return _yaml_edit("profile/profile.yaml", both)


def _fields_cases() -> list[Case]:
    nothing = lambda data: None  # noqa: E731
    cases = [
        Case("verified:valid", verified_edit(nothing), SIMULATE_CMD, "any"),
        Case("verified:valid-trial", verified_edit(nothing, trial=True), SIMULATE_CMD, "any"),
        Case("verified:verification-without-finalists", verified_edit(
            lambda d: d.pop("finalists")), SIMULATE_CMD),
        Case("verified:verification=list", verified_edit(_set_in("verification", [1])),
             SIMULATE_CMD),
        Case("verified:verification.drop-chosen", verified_edit(
            lambda d: d["verification"].pop("chosen")), SIMULATE_CMD),
        Case("verified:verification.chosen=another-finalist", verified_edit(
            _set_in("verification.chosen", "fp32 DDP")), SIMULATE_CMD),
        Case("verified:verification.chosen=no-finalist", verified_edit(
            _set_in("verification.chosen", "the best plan")), SIMULATE_CMD),
        Case("verified:verification.batches=random", verified_edit(
            _set_in("verification.batches", "random")), SIMULATE_CMD),
        Case("verified:finalists.0.source=magic", verified_edit(
            _set_in("finalists.0.source", "magic")), SIMULATE_CMD),
        Case("verified:finalists.1.value-not-time-x-steps", verified_edit(
            _set_in("finalists.1.value", 1.0)), SIMULATE_CMD),
        Case("verified:finalists.1.value=1e9", verified_edit(
            _set_in("finalists.1.value", 1e9)), SIMULATE_CMD),
        Case("verified:finalists-two-of-one-name", verified_edit(
            _set_in("finalists.0.name", "bytecomp plan")), SIMULATE_CMD),
        Case("verified:finalists.0.name-with-escapes", verified_edit(
            _set_in("finalists.0.name", ESCAPE)), SIMULATE_CMD),
        Case("verified:trial-two-levels-claim-one-finalist", verified_edit(
            _set_in("levels.0.setting", "bytecomp plan"), trial=True), SIMULATE_CMD),
        Case("verified:trial-starts-away-from-the-chosen", verified_edit(
            _set_in("adaptive.start", 0), trial=True), SIMULATE_CMD),
        Case("plan.yaml:tensors.0.name-with-escapes", yaml_set(
            "plan.yaml", "tensors.0.name", ESCAPE), SIMULATE_CMD),
    ]
    for key, values in (("steps", {"negative": -1, "huge-int": 10 ** 9, "string": "many",
                                   "float": 60.5, "bool": True}),
                        ("seconds", {"negative": -1, "huge": 1e30, "string": "long",
                                     "nan": math.nan, "inf": math.inf}),
                        ("fp32_improvement", {"negative": -0.5, "inf": math.inf,
                                              "string": "lots"})):
        for name, value in values.items():
            cases.append(Case(f"verified:verification.{key}={name}", verified_edit(
                _set_in(f"verification.{key}", value)), SIMULATE_CMD))
    for key in ("window", "agree_every", "explore_every"):
        for name, value in (("huge-int", 10 ** 30), ("above-the-range", 10 ** 9 + 1)):
            cases.append(Case(f"ladder:adaptive.{key}={name}", ladder_edit(
                _set_in(f"adaptive.{key}", value)), SIMULATE_CMD))
    cases += [
        Case("profile.yaml:quality-valid", quality_edit(nothing), PLAN_CMD, "any"),
        Case("profile.yaml:quality=list", quality_edit(_set_in("quality", [1])), PLAN_CMD),
        *[Case(f"profile.yaml:quality.{key}={name}", quality_edit(_set_in(f"quality.{key}",
                                                                          value)), PLAN_CMD)
          for key, name, value in (("min_r2", "above-one", 2), ("min_r2", "string", "high"),
                                   ("max_worst_relative_error", "negative", -1),
                                   ("retries", "negative", -1), ("retries", "huge-int", 10 ** 30),
                                   ("retries", "float", 2.5), ("remeasured", "string", "all"),
                                   ("remeasured", "numbers", [1, 2]),
                                   ("remeasured", "unknown-fit", ["collective gossip/world/x"]),
                                   ("poor", "mapping", {"a": 1}),
                                   ("poor.0.fit", "unknown", "compressor zip/cpu"),
                                   ("poor.0.fit", "number", 5),
                                   ("poor.0.r2", "above-one", 1.5),
                                   ("poor.0.r2", "string", "bad"),
                                   ("poor.0.worst_relative_error", "negative", -0.1),
                                   ("poor.0.worst_relative_error", "huge-int", 10 ** 30))],
        Case("profile.yaml:quality.poor.0-drop-fit", quality_edit(
            lambda d: d["quality"]["poor"][0].pop("fit")), PLAN_CMD),
        Case("tensors.csv:name-with-escapes", csv_cell("profile/tensors.csv", "name", ESCAPE),
             PLAN_CMD),
        Case("cluster.yaml:name-with-escapes", yaml_set("cluster.yaml", "name", ESCAPE),
             CLUSTER_CMD),
        Case("cluster.yaml:name-with-a-bidi-override", yaml_set("cluster.yaml", "name",
                                                                "gbe1\u202egnp.exe"), CLUSTER_CMD),
        Case("spec:compressor-empty-items", lambda root: None,
             [*PLAN_CMD[:-len(FAST_PLAN)], "--no-verify", "--compressor", "topk:ratio=0.01,,,"]),
        Case("spec:compressor-leading-comma", lambda root: None,
             ["compressors", "topk:,ratio=0.01"]),
        Case("spec:optimizer-empty-items", lambda root: None,
             ["profile", "--optimizer", "sgd:lr=0.1,,", "--out", "{out}.d"]),
        Case("spec:model-empty-items", lambda root: None,
             ["profile", "--model", "mlp:inputs=8,,", "--out", "{out}.d"]),
        Case("plan.yaml:tensors.0.compressor-empty-items", yaml_set(
            "plan.yaml", "tensors.0.compressor", "int8,,"), SIMULATE_CMD),
        Case("compressors.csv:spec-empty-items", csv_cell(
            "profile/compressors.csv", "spec", "fp16,,"), PLAN_CMD),
        *[Case(f"compressors:numel={name}", lambda root: None, ["compressors", "--numel", value])
          for name, value in (("10**30", str(10 ** 30)), ("2**50+1", str(2 ** 50 + 1)),
                              ("1e30", "1e30"))],
    ]
    return cases


# -- round three, class 6: options without effect, factories ----------------------------------

def _misuse_cases() -> list[Case]:
    nothing = lambda root: None  # noqa: E731
    plan = ["plan", "{profile}", "--out", "{out}"]
    return [
        Case("plan:static-with-adaptive", nothing, [*plan, "--adaptive", "topk", "--static"]),
        Case("plan:nproc-with-no-verify", nothing, [*plan, "--no-verify", "--nproc", "2"]),
        Case("plan:static-with-no-verify", nothing, [*plan, "--no-verify", "--static"]),
        Case("plan:nproc-with-adaptive", nothing, [*plan, "--adaptive", "topk", "--nproc", "2"]),
        Case("plan:verify-steps-with-adaptive", nothing,
             [*plan, "--adaptive", "topk", "--verify-steps", "60"]),
        Case("model:factory-raises-a-base-exception", nothing,
             ["profile", "--model", "factories:raises_base_exception", "--out", "{out}.d"]),
    ]


# -- cluster calibrations: the directory profile --calibration reads, and the record --------

# a profile's record of a calibration it used (1 node x 2 ranks: the world group alone)
CALIBRATION_RECORD = {
    "tables": {"collectives": "calibration", "compressors": "calibration",
               "aggregation": "calibration", "copies": "calibration", "executor": "calibration"},
    "directory": "/data/calibrations/ci-1x2", "kind": "calibration",
    "created": "2026-11-28T05:37:27+00:00", "measured": "2026-11-28T05:37:27+00:00",
    "link": {"tolerance": 3.0, "checks": [{"group": "world", "bytes": 16777216, "samples": 9,
                                           "calibration_ms": 11.734, "measured_ms": 8.1047,
                                           "ratio": 0.6907}]}}
EXECUTOR_PATHS = ("direct", "fifo", "host")
EXECUTOR = {"bucket_ms": 0.14, "paths": {p: {"hook_ms": 0.02, "tail_ms": 0.5}
                                         for p in EXECUTOR_PATHS},
            "measured": {"added_ms": dict.fromkeys(EXECUTOR_PATHS, 0.9),
                         "hook_added_ms": dict.fromkeys(EXECUTOR_PATHS, 0.05),
                         "busy_added_ms": dict.fromkeys(EXECUTOR_PATHS, 0.8),
                         "bucket_ms": 0.14}}
CALIBRATE_CMD = ["profile", "--model", "mlp", "--nproc", "2", "--calibration", "{calibration}",
                 "--out", "{out}.d"]


def recorded_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """profile.yaml with a calibration record and an executor section (the shipped cnn
    profile predates both), edited."""
    def both(data: dict) -> None:
        import copy

        data["calibration"] = copy.deepcopy(CALIBRATION_RECORD)
        data["executor"] = copy.deepcopy(EXECUTOR)
        edit(data)
    return _yaml_edit("profile/profile.yaml", both)


def _calibration_cases() -> list[Case]:
    nothing = lambda data: None  # noqa: E731
    cal_yaml = "calibration/calibration.yaml"
    cases = [Case("profile.yaml:calibration-valid", recorded_edit(nothing), PLAN_CMD, "any"),
             Case("profile.yaml:calibration-all-measured", recorded_edit(_set_in(
                 "calibration", {"tables": dict.fromkeys(CALIBRATION_RECORD["tables"],
                                                         "measured")})), PLAN_CMD, "any"),
             Case("profile.yaml:calibration-measured-with-a-directory", recorded_edit(
                 lambda d: d["calibration"]["tables"].update(
                     dict.fromkeys(CALIBRATION_RECORD["tables"], "measured"))), PLAN_CMD),
             Case("profile.yaml:calibration-drop-tables", recorded_edit(
                 lambda d: d["calibration"].pop("tables")), PLAN_CMD),
             Case("profile.yaml:calibration-drop-link", recorded_edit(
                 lambda d: d["calibration"].pop("link")), PLAN_CMD),
             Case("profile.yaml:calibration.link.checks.0-ratio-beyond-the-tolerance",
                  recorded_edit(lambda d: d["calibration"]["link"]["checks"][0].update(
                      measured_ms=50.0, ratio=4.2611)), PLAN_CMD),
             Case("profile.yaml:executor-valid", recorded_edit(nothing), PLAN_CMD, "any"),
             Case("profile.yaml:executor.measured-drop-hook_added_ms", recorded_edit(
                 lambda d: d["executor"]["measured"].pop("hook_added_ms")), PLAN_CMD)]
    for key, name, value in (
            ("calibration", "list", [1]), ("calibration.tables", "list", ["collectives"]),
            ("calibration.tables.sideways", "unknown-table", "calibration"),
            ("calibration.tables.collectives", "elsewhere", "elsewhere"),
            ("calibration.directory", "number", 5), ("calibration.directory", "empty", " "),
            ("calibration.directory", "escapes", ESCAPE), ("calibration.kind", "magic", "magic"),
            ("calibration.created", "yesterday", "yesterday"), ("calibration.measured", "int", 12),
            ("calibration.link", "list", [1]), ("calibration.link.tolerance", "one", 1),
            ("calibration.link.tolerance", "string", "loose"),
            ("calibration.link.tolerance", "huge-int", 10 ** 30),
            ("calibration.link.checks", "empty", []),
            ("calibration.link.checks.0", "string", "fine"),
            ("calibration.link.checks.0.group", "inter", "inter"),
            ("calibration.link.checks.0.bytes", "negative", -1),
            ("calibration.link.checks.0.bytes", "float", 1.5),
            ("calibration.link.checks.0.samples", "zero", 0),
            ("calibration.link.checks.0.measured_ms", "zero", 0),
            ("calibration.link.checks.0.measured_ms", "huge", 1e30),
            ("calibration.link.checks.0.calibration_ms", "string", "fast"),
            ("calibration.link.checks.0.ratio", "not-measured-over-calibration", 2.0),
            ("executor.measured", "list", [1]),
            ("executor.measured.added_ms.direct", "string", "slow"),
            ("executor.measured.bucket_ms", "huge", 1e30),
            ("executor.measured.busy_added_ms", "one-path", {"direct": 1.0}),
            ("executor.measured.added_ms.fifo", "bool", True)):
        cases.append(Case(f"profile.yaml:{key}={name}", recorded_edit(_set_in(key, value)),
                          PLAN_CMD))
    for key in ("format_version", "kind", "created", "device", "backend", "world_size",
                "nodes", "ranks_per_node", "compressor_specs"):
        cases.append(Case(f"calibration.yaml:drop-{key}", yaml_drop(cal_yaml, key),
                          CALIBRATE_CMD))
    for name, value in BAD_NUMBERS.items():
        cases.append(Case(f"calibration.yaml:world_size={name}",
                          yaml_set(cal_yaml, "world_size", value), CALIBRATE_CMD))
    for key, name, value in (
            ("format_version", "2", 2), ("kind", "profile", "profile"),
            ("created", "yesterday", "yesterday"), ("world_size", "3", 3),
            ("backend", "mpi", "mpi"), ("device.type", "tpu", "tpu"),
            ("device.name", "escapes", ESCAPE), ("compressor_specs", "string", "fp16"),
            ("compressor_specs.0", "unknown", "zip:level=9"), ("machine", "list", [1]),
            ("machine.threads_per_rank", "zero", 0), ("quality.min_r2", "above-one", 2),
            ("quality.remeasured", "unknown-fit", ["collective gossip/world/x"]),
            ("executor", "list", [1]), ("executor.measured.added_ms.direct", "string", "slow"),
            ("executor.measured.bucket_ms", "huge", 1e30)):
        cases.append(Case(f"calibration.yaml:{key}={name}", yaml_set(cal_yaml, key, value),
                          CALIBRATE_CMD))
    tables = "calibration/{}.csv".format
    cases += [
        Case("calibration:missing-collectives.csv",
             lambda root: (root / tables("collectives")).unlink(), CALIBRATE_CMD),
        Case("calibration:missing-calibration.yaml",
             lambda root: (root / cal_yaml).unlink(), CALIBRATE_CMD),
        Case("calibration:also-a-profile.yaml",
             lambda root: shutil.copy(root / cal_yaml, root / "calibration" / "profile.yaml"),
             CALIBRATE_CMD),
        Case("calibration:no-float32-allreduce", csv_edit(tables("collectives"), lambda rows: [
            r for r in rows if r[0] != "allreduce" or r[2] != "float32"]), CALIBRATE_CMD),
        Case("collectives.csv:calibration-time_ms=nan",
             csv_cell(tables("collectives"), "time_ms", "nan"), CALIBRATE_CMD),
        Case("collectives.csv:calibration-group=inter",
             csv_cell(tables("collectives"), "group", "inter"), CALIBRATE_CMD),
        Case("compressors.csv:calibration-spec=unknown",
             csv_cell(tables("compressors"), "spec", "zip:level=9"), CALIBRATE_CMD),
        Case("compressors.csv:calibration-no-rows",
             csv_edit(tables("compressors"), lambda rows: rows[:1]), CALIBRATE_CMD),
        Case("copies.csv:calibration-direction=sideways",
             csv_cell(tables("copies"), "direction", "sideways"), CALIBRATE_CMD),
        Case("aggregation.csv:calibration-each_ms=negative",
             csv_cell(tables("aggregation"), "each_ms", "-1"), CALIBRATE_CMD),
        *[Case(f"collectives.csv:calibration-special-{kind}", special(tables("collectives"),
                                                                     kind), CALIBRATE_CMD)
          for kind in ("fifo", "zero", "directory", "huge")],
        Case("out:profile-onto-its-calibration", lambda root: None,
             [*CALIBRATE_CMD[:-2], "--out", "{calibration}", "--force"]),
        Case("calibration:not-a-directory", lambda root: None,
             [*CALIBRATE_CMD[:-4], "--calibration", "{cluster}", "--out", "{out}.d"]),
    ]
    prefixed = [Case(case.id.replace("calibration.yaml:", "calibration.yaml:yaml-", 1),
                     case.mutate, case.args, case.expect)
                for case in _yaml_attacks(cal_yaml, CALIBRATE_CMD)]
    return cases + prefixed


# -- round four: numbers past the stated maximum, model fields, built-in sizes -------------

HUGE_MLP = "mlp:inputs=100000,width=100000,depth=2"  # 2 x 10^10 parameters


def _round_four_cases() -> list[Case]:
    nothing = lambda root: None  # noqa: E731
    plan = ["plan", "{profile}", "--out", "{out}", "--no-verify"]
    added = "executor.measured.added_ms.direct"
    return [
        Case("profile:budget=1e308", nothing,
             ["profile", "--model", "mlp", "--budget", "1e308", "--out", "{out}.d"]),
        Case("plan:verify-budget=1e308", nothing,
             ["plan", "{profile}", "--out", "{out}", "--verify-budget", "1e308"]),
        Case("plan:budget=nan", nothing, [*plan, "--budget", "nan"]),
        Case("plan:evaluations=huge-int", nothing, [*plan, "--evaluations", "1" + "0" * 400]),
        Case("profile.yaml:drop-model.spec", yaml_drop("profile/profile.yaml", "model.spec"),
             PLAN_CMD),
        Case("profile.yaml:drop-model.name", yaml_drop("profile/profile.yaml", "model.name"),
             PLAN_CMD),
        Case("profile.yaml:model.spec=int", yaml_set("profile/profile.yaml", "model.spec", 5),
             PLAN_CMD),
        Case("profile:model=huge-built-in", nothing,
             ["profile", "--model", HUGE_MLP, "--out", "{out}.d"]),
        Case(f"calibration.yaml:{added}=below-noise",
             yaml_set("calibration/calibration.yaml", added, -5.0), CALIBRATE_CMD),
        Case(f"profile.yaml:{added}=below-noise", recorded_edit(_set_in(added, -5.0)),
             PLAN_CMD),
    ]


def all_cases() -> list[Case]:
    """The whole corpus, ids unique."""
    cases = (_profile_yaml_cases() + _table_cases() + _plan_cases() + _ladder_cases()
             + _cluster_cases() + _output_cases() + _round_two_cases() + _fields_cases()
             + _misuse_cases() + _calibration_cases() + _round_four_cases())
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    return cases
