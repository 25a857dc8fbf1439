"""The hostile corpus from Python, round four: the library's functions given values of the
wrong type, and Profile objects edited in memory.

Every option of :func:`bytecomp.profile`, :func:`bytecomp.plan`, :func:`bytecomp.simulate`
and :func:`bytecomp.bench` gets bad values generated from its declaration in
:mod:`bytecomp.options` (a new option is covered without a line here): bools, strings,
NaN, infinities, huge ints where a number belongs; strings and numbers where a flag
does; numbers where a string or a path does. Each must be one
:class:`~bytecomp.errors.BytecompError` line naming the option as the command line
spells it, before any work (nothing written). An edited :class:`Profile` is refused by
the same checks :func:`bytecomp.load_profile` applies to a directory.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from pathlib import Path

import pandas as pd
import pytest
from refusal import one_line_error

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.option_fields import MAX_NUMBER, cli_name
from bytecomp.options import (
    BenchOptions,
    PlanOptions,
    ProfileOptions,
    SimulateOptions,
)
from bytecomp.profile_store import check_profile, load_profile

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "cnn"
PLANNED = ROOT / "benchmarks" / "results" / "emulated" / "cnn-2x1-1gbit"
CLUSTER = ROOT / "bytecomp" / "configs" / "clusters" / "gbe1.yaml"
FAST = {"verify": False, "compressor": ["fp16"], "algorithm": "greedy", "budget": 0,
        "bucket_cap_mb": 25, "announce": lambda line: None}

# the public function of each options class, called with one bad option
CALLS = {
    ProfileOptions: lambda **bad: bytecomp.profile(**bad),
    PlanOptions: lambda **bad: bytecomp.plan(PROFILE, **bad),
    SimulateOptions: lambda **bad: bytecomp.simulate(PLANNED / "profile",
                                                     PLANNED / "plan.yaml", **bad),
    BenchOptions: lambda **bad: bytecomp.bench(PLANNED / "profile", PLANNED / "plan.yaml",
                                               **bad),
}
NOT_NUMBERS = {"bool-true": True, "bool-false": False, "string": "5", "nan": math.nan,
               "inf": math.inf, "-inf": -math.inf, "huge-int": 10**400, "huge-float": 1e308,
               "none-in-a-list": [None], "list-of-strings": ["1", "2"]}
NOT_INTEGERS = {"float": 1.5, "negative-zero": -0.0, "float-integral": 2.0}
NOT_FLAGS = {"string-no": "no", "string-true": "True", "int-0": 0, "int-2": 2, "none": None,
             "float": 1.0}
NOT_STRINGS = {"int": 5, "float": 1.5, "bool": True, "bytes": b"x", "list-of-ints": [5]}


def _kind(hint) -> tuple[type, bool, bool]:
    """An option's declared type: its value type, whether None is allowed, whether it is
    repeatable."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    optional = type(None) in members
    kind = next(m for m in members if m is not type(None))
    if typing.get_origin(kind) is tuple:
        return typing.get_args(kind)[0], optional, True
    return kind, optional, False


def _cases() -> list:
    """(options class, field name, case name, bad value) for every option's bad values."""
    cases = []
    for cls in CALLS:
        hints = typing.get_type_hints(cls)
        for item in dataclasses.fields(cls):
            kind, optional, repeatable = _kind(hints[item.name])
            bad = {int: {**NOT_NUMBERS, **NOT_INTEGERS}, float: NOT_NUMBERS, bool: NOT_FLAGS,
                   str: NOT_STRINGS}[kind]
            for case, value in bad.items():
                if repeatable and case == "list-of-strings" and kind is str:
                    continue  # a valid value of a repeatable string option
                cases.append((cls, item.name, case, value))
            if kind is str and not optional and not repeatable:
                cases.append((cls, item.name, "none", None))
    return cases


CASES = _cases()


@pytest.fixture
def no_work(monkeypatch):
    """A value that got through would start the work: it fails at once instead."""
    def work(*args, **kwargs):
        raise AssertionError("a bad value got through to the work")

    import bytecomp.api
    import bytecomp.commands.bench
    import bytecomp.commands.profile

    monkeypatch.setattr(bytecomp.commands.profile, "run_profile", work)
    monkeypatch.setattr(bytecomp.commands.bench, "run_bench", work)
    monkeypatch.setattr(bytecomp.api, "run_plan", work)


def _one_line(call, option: str, tmp_path: Path) -> str:
    with pytest.raises(BytecompError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and option in message, message
    assert not list(tmp_path.iterdir()), "written before the refusal"
    return message


@pytest.mark.parametrize("cls,name,case,value", CASES,
                         ids=[f"{c.command}-{n}-{k}" for c, n, k, _ in CASES])
def test_every_option_refuses_a_value_of_another_type_in_one_line(cls, name, case, value,
                                                                   tmp_path, monkeypatch,
                                                                   no_work):
    monkeypatch.chdir(tmp_path)
    _one_line(lambda: CALLS[cls](**{name: value}), cli_name(cls, name), tmp_path)


def test_every_numeric_option_is_covered():
    """The generated cases reach every option; each number option gets the huge int,
    NaN and a bool."""
    for cls in CALLS:
        names = {item.name for item in dataclasses.fields(cls)}
        assert names == {n for c, n, _, _ in CASES if c is cls}
        hints = typing.get_type_hints(cls)
        for name in names:
            if _kind(hints[name])[0] in (int, float):
                got = {k for c, n, k, _ in CASES if c is cls and n == name}
                assert {"huge-int", "nan", "bool-true", "string"} <= got, name


# -- the issue's own cases, by name -------------------------------------------------------

@pytest.mark.parametrize("call,option", [
    (lambda: bytecomp.plan(PROFILE, verify="no"), "--verify is a flag"),
    (lambda: bytecomp.plan(PROFILE, budget="5"), "--budget must be a number"),
    (lambda: bytecomp.plan(PROFILE, budget=True), "--budget must be a number"),
    (lambda: bytecomp.plan(PROFILE, budget=10**400), "--budget must be a finite number"),
    (lambda: bytecomp.plan(PROFILE, evaluations=True), "--evaluations must be an integer"),
    (lambda: bytecomp.plan(PROFILE, evaluations=-0.0), "--evaluations must be an integer"),
    (lambda: bytecomp.plan(PROFILE, min_gain=True), "--min-gain must be a number"),
    (lambda: bytecomp.plan(PROFILE, adaptive="topk", window=True), "--window must be"),
    (lambda: bytecomp.plan(PROFILE, verify_steps=True), "--verify-steps must be an integer"),
    (lambda: bytecomp.plan(PROFILE, verify_budget=True), "--verify-budget must be a number"),
    (lambda: bytecomp.plan(PROFILE, verify_budget=1e308), f"at most {MAX_NUMBER:,}"),
    (lambda: bytecomp.plan(PROFILE, strict="no"), "--strict is a flag"),
    (lambda: bytecomp.plan(PROFILE, probe=2), "--probe is a flag"),
    (lambda: bytecomp.plan(PROFILE, bucket_cap_mb=math.nan), "--bucket-cap-mb must be"),
    (lambda: bytecomp.plan(PROFILE, compressor=5), "--compressor must be a string"),
    (lambda: bytecomp.plan(PROFILE, out=5), "--out must be a path"),
    (lambda: bytecomp.plan(PROFILE, options="gbe1"), "options must be a PlanOptions"),
    (lambda: bytecomp.plan(PROFILE, options=SimulateOptions()), "options must be a PlanOptions"),
    (lambda: bytecomp.plan(5), "the profile (a directory, or a Profile) must be a path"),
    (lambda: bytecomp.plan(None), "the profile (a directory, or a Profile) must be a path"),
    (lambda: bytecomp.plan(PROFILE, announce="loud"), "announce must be a function"),
    (lambda: bytecomp.simulate(PROFILE, "plan.yaml", level="0"), "--level must be an integer"),
    (lambda: bytecomp.simulate(PROFILE, "plan.yaml", cluster=5), "--cluster must be a path"),
    (lambda: bytecomp.simulate(PROFILE, 5), "the plan file must be a path"),
    (lambda: bytecomp.bench(PROFILE, "plan.yaml", nproc="2"), "--nproc must be an integer"),
    (lambda: bytecomp.bench(PROFILE, ["plan.yaml", 5]), "a plan file must be a path"),
    (lambda: bytecomp.profile(budget="5"), "--budget must be a number"),
    (lambda: bytecomp.profile(budget=1e308), f"at most {MAX_NUMBER:,}"),
    (lambda: bytecomp.profile(machine=5), "--machine must be a string"),
    (lambda: bytecomp.profile(5), "--model must be a string"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_the_reported_cases_are_one_line_each(call, option, tmp_path, monkeypatch, no_work):
    monkeypatch.chdir(tmp_path)
    _one_line(call, option, tmp_path)


def test_path_like_values_are_paths_and_numbers_are_stored_as_declared(tmp_path):
    built = PlanOptions.build(cluster=CLUSTER, out=tmp_path / "p.yaml", budget=5,
                              bucket_cap_mb=25, compressor="fp16", min_gain=-0.0)
    assert (built.cluster, built.out) == (str(CLUSTER), str(tmp_path / "p.yaml"))
    assert built.budget == 5.0 and isinstance(built.budget, float)
    assert built.bucket_cap_mb == (25.0,) and built.compressor == ("fp16",)
    assert math.copysign(1, built.min_gain) == 1  # -0.0 is 0
    assert SimulateOptions.build(trace=tmp_path / "t.json").trace == str(tmp_path / "t.json")


PATH_NAMES = {"out", "cluster", "calibration", "trace", "png"}  # files and directories


@pytest.mark.parametrize("cls", [ProfileOptions, PlanOptions, SimulateOptions, BenchOptions])
def test_every_file_or_directory_option_takes_a_path_like(cls, tmp_path):
    """An option named for a file, a directory or a cluster config (a name or a file) is
    declared a path, so an os.PathLike is taken as its str, a repeatable one's too."""
    import dataclasses

    for item in dataclasses.fields(cls):
        if item.name in PATH_NAMES:
            assert item.metadata["path"], f"{cls.__name__}.{item.name} is not declared a path"
            built = cls.build(**{item.name: tmp_path / "x"})
            value = getattr(built, item.name)
            assert value in (str(tmp_path / "x"), (str(tmp_path / "x"),)), (item.name, value)


def test_a_profile_planned_by_path_like_arguments_writes_the_plan(tmp_path):
    result = bytecomp.plan(load_profile(PROFILE), cluster=CLUSTER, out=tmp_path / "plan.yaml",
                           **FAST)
    assert result.written == tmp_path / "plan.yaml" and result.written.exists()


# -- Profile objects edited in memory -------------------------------------------------------

@pytest.fixture(scope="module")
def loaded():
    return load_profile(PROFILE)


def _set(table: str, column: str, value, row: int | None = None):
    def edit(profile) -> None:
        frame = getattr(profile, table)
        if row is None:
            frame[column] = value
        else:
            frame.loc[row, column] = value
    return edit


EDITS = {
    "tensors.ready_ms=nan": _set("tensors", "ready_ms", math.nan),
    "tensors.ready_ms=negative": _set("tensors", "ready_ms", -1.0, row=0),
    "tensors.numel=nan": _set("tensors", "numel", math.nan, row=0),
    "tensors.name=int": lambda p: (p.tensors.__setitem__("name", p.tensors["name"]
                                                         .astype(object)),
                                   p.tensors.loc.__setitem__((0, "name"), 5)),
    "tensors-duplicated": lambda p: setattr(p, "tensors", pd.concat([p.tensors,
                                                                     p.tensors.iloc[:1]])),
    "tensors=none": lambda p: setattr(p, "tensors", None),
    "collectives.time_ms=nan": _set("collectives", "time_ms", math.nan),
    "collectives.time_ms=negative": _set("collectives", "time_ms", -1.0, row=0),
    "collectives-empty": lambda p: setattr(p, "collectives", p.collectives.iloc[:0]),
    "compressors.encode_ms=nan": _set("compressors", "encode_ms", math.nan),
    "compressors.decode_ms=negative": _set("compressors", "decode_ms", -1.0, row=0),
    "compressors-empty-spec": _set("compressors", "spec", "", row=0),
    "fidelity.gain=nan": _set("fidelity", "gain", math.nan),
    "fidelity.gain=negative": _set("fidelity", "gain", -0.5, row=0),
    "fidelity.gain=above-one": _set("fidelity", "gain", 1.5, row=0),
    "meta.world_size=0": lambda p: p.meta.update(world_size=0),
    "meta.world_size=nan": lambda p: p.meta.update(world_size=math.nan),
    "meta.world_size=bool": lambda p: p.meta.update(world_size=True),
    "meta.model.spec-dropped": lambda p: p.meta["model"].pop("spec"),
    "meta.times-dropped": lambda p: p.meta.pop("times"),
    "meta.times.backward_compute=nan": lambda p: p.meta["times"]["backward_compute"].update(
        median_ms=math.nan),
    "meta=list": lambda p: setattr(p, "meta", [1]),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_profile_is_refused_in_one_line_when_planned(loaded, edit, tmp_path,
                                                                no_work):
    edited = copy.deepcopy(loaded)
    EDITS[edit](edited)
    with pytest.raises(BytecompError) as raised:
        bytecomp.plan(edited, out=str(tmp_path / "plan.yaml"), **FAST)
    message = str(raised.value)
    assert message.startswith(f"Profile({PROFILE})."), message
    assert "\n" not in message and not list(tmp_path.iterdir())


def test_an_unedited_profile_plans_and_checks_as_read(loaded):
    checked = check_profile(loaded)
    for name in ("tensors", "collectives", "compressors", "fidelity", "copies"):
        assert getattr(checked, name).equals(getattr(loaded, name)), name
    assert bytecomp.plan(loaded, out=None, **FAST).plan is not None


@pytest.mark.parametrize("table,column,value", [
    ("tensors", "ready_ms", "-1"), ("collectives", "time_ms", "-1"),
    ("compressors", "encode_ms", "-1"), ("fidelity", "gain", "2")])
def test_the_object_and_the_directory_are_refused_by_the_same_check(loaded, tmp_path, table,
                                                                    column, value):
    """One validator: a cell made bad in memory and in the file gives the same reason."""
    import shutil

    shutil.copytree(PROFILE, tmp_path / "p")
    frame = pd.read_csv(tmp_path / "p" / f"{table}.csv", dtype=str, keep_default_na=False)
    frame.loc[0, column] = value
    frame.to_csv(tmp_path / "p" / f"{table}.csv", index=False)
    with pytest.raises(BytecompError) as from_file:
        load_profile(tmp_path / "p")
    edited = copy.deepcopy(loaded)
    getattr(edited, table).loc[0, column] = float(value)
    with pytest.raises(BytecompError) as from_object:
        check_profile(edited)
    assert str(from_file.value).split(": ", 1)[1] == str(from_object.value).split(": ", 1)[1]


# -- built-in specs and calibration fields --------------------------------------------------

@pytest.mark.parametrize("spec,message", [
    ("mlp:inputs=100000,width=100000,depth=2", "20,001,200,010 parameters and buffers"),
    ("transformer:seq_len=100000", "more than the 1,073,741,824 a built-in may have"),
    ("mlp:width=" + "9" * 50, "width must be from 1 to 1,048,576"),
    ("bow:vocab=2000000", "vocab must be from 1 to 1,048,576"),
])
def test_a_built_in_too_large_for_memory_is_refused_before_it_is_built(spec, message):
    from bytecomp.training.workloads import load_workload

    with pytest.raises(BytecompError, match=message) as raised:
        load_workload(spec)
    assert "\n" not in str(raised.value)


def test_plan_refuses_a_huge_built_in_that_the_profile_names_before_any_work(cli, tmp_path):
    """The finalists' model size is checked from the spec's arguments (nothing built)
    with the other checks of the spec, before the search: one line, nothing written."""
    import shutil

    import yaml

    shutil.copytree(PROFILE, tmp_path / "p")
    meta = yaml.safe_load((tmp_path / "p" / "profile.yaml").read_text())
    meta["model"]["spec"] = "mlp:inputs=100000,width=100000,depth=2"
    (tmp_path / "p" / "profile.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    done = cli("plan", tmp_path / "p", "--out", tmp_path / "plan.yaml", "--cluster", CLUSTER,
               "--compressor", "topk:ratio=0.01", "--algorithm", "greedy", "--budget", "0",
               "--bucket-cap-mb", "25")
    one_line_error(done, "20,001,200,010 parameters and buffers", "smaller arguments")
    assert not (tmp_path / "plan.yaml").exists()


@pytest.mark.slow  # builds each model at its defaults (seconds)
def test_the_size_check_counts_what_the_built_model_holds():
    from bytecomp.training.builtin_models import BUILTINS, SIZES, model_elements
    from bytecomp.training.workloads import load_workload

    for name, args in (("mlp", {}), ("cnn", {}), ("transformer", {}), ("lstm", {}),
                       ("bow", {}), ("mlp", {"inputs": 8, "width": 16, "depth": 3}),
                       ("cnn", {"width": 4, "classes": 3}),
                       ("transformer", {"layers": 1, "width": 16, "heads": 2, "seq_len": 8,
                                        "vocab": 50}),
                       ("lstm", {"layers": 3, "width": 8, "vocab": 30}), ("digits", {}),
                       ("digits", {"width": 3, "classes": 4}),
                       ("bow", {"vocab": 100, "width": 4, "hidden": 8, "classes": 3})):
        model = load_workload(name + ":" + ",".join(f"{k}={v}" for k, v in args.items())).model
        held = sum(t.numel() for t in [*model.parameters(), *model.buffers()])
        assert model_elements(name, args) == held, name
    assert set(SIZES) == set(BUILTINS)


def test_a_calibrations_executor_difference_far_below_zero_is_refused():
    from bytecomp.profile_meta import MIN_DIFFERENCE_MS, check_executor_measured

    measured = {"added_ms": {"direct": 0.9, "fifo": 0.9, "host": 0.9},
                "hook_added_ms": {"direct": 0.05, "fifo": 0.05, "host": 0.05},
                "bucket_ms": 0.14}
    check_executor_measured(Path("c.yaml"), measured)
    for value in (-5.0, MIN_DIFFERENCE_MS - 0.01, math.nan, 1e308):
        bad = copy.deepcopy(measured)
        bad["added_ms"]["direct"] = value
        with pytest.raises(BytecompError, match=r"c.yaml: field 'executor.measured.added_ms"
                                                r".direct' must be a number of ms from -1"):
            check_executor_measured(Path("c.yaml"), bad)
    measured["added_ms"]["direct"] = -0.2  # noise: kept
    check_executor_measured(Path("c.yaml"), measured)
