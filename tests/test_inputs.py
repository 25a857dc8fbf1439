"""Hostile inputs and outputs, item by item (the corpus in tests/hostile has many more):
special and oversized files, YAML bombs, profile numbers and consistency, outputs that
are inputs or links, a full disk, temporaries left by a killed run, plans of another
shape, and the planner's own corner cases."""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from refusal import one_line_error

from bytecomp.errors import BytecompError
from bytecomp.files import read_text_file
from bytecomp.plan_file import load_plan
from bytecomp.profiler import load_profile
from bytecomp.safe_yaml import load_yaml
from bytecomp.search import Planner
from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "cnn"
PLANNED = ROOT / "benchmarks" / "results" / "emulated" / "cnn-2x1-1gbit"
FAST = ["--compressor", "fp16", "--algorithm", "greedy", "--budget", "0", "--bucket-cap-mb", "25"]




@pytest.fixture
def profile(tmp_path) -> Path:
    copy = tmp_path / "profile"
    shutil.copytree(PROFILE, copy)
    return copy


def edit_meta(profile: Path, edit) -> None:
    path = profile / "profile.yaml"
    meta = yaml.safe_load(path.read_text())
    edit(meta)
    path.write_text(yaml.safe_dump(meta, sort_keys=False))


def edit_cell(path: Path, column: str, row: int, value: str) -> None:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


# -- every file read is a regular file of sane size ------------------------------------------


def test_special_files_are_refused_without_reading_or_blocking(tmp_path):
    fifo = tmp_path / "tensors.csv"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.csv"
    zero.symlink_to("/dev/zero")
    started = time.monotonic()
    for path in (fifo, zero):
        with pytest.raises(BytecompError, match="not a regular file"):
            read_text_file(path, "profile table")
    assert time.monotonic() - started < 1
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" * 100)
    with pytest.raises(BytecompError, match="too large"):
        read_text_file(big, "plan file", limit=100)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_special_file_as_a_profile_table_is_one_line(cli, profile, tmp_path, kind):
    table = profile / "tensors.csv"
    table.unlink()
    os.mkfifo(table) if kind == "fifo" else table.symlink_to("/dev/zero")
    one_line_error(cli("plan", "--no-verify", profile, "--out", tmp_path / "plan.yaml", *FAST), "tensors.csv",
             "not a regular file")


# -- YAML: no anchors or aliases, bounded depth, no duplicate keys ------------------------------

BILLION_LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["name: *i", "nodes: 2", "ranks_per_node: 1"]) + "\n"


def test_a_billion_laughs_cluster_config_is_refused_at_once(cli, tmp_path):
    config = tmp_path / "laughs.yaml"
    config.write_text(BILLION_LAUGHS)
    started = time.monotonic()
    one_line_error(cli("plan", "--no-verify", PROFILE, "--cluster", config, "--out", tmp_path / "p.yaml", *FAST),
             "laughs.yaml: not valid YAML", "anchors and aliases")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("text,reason", [
    ("a: &x 1\nb: *x\n", "anchors and aliases"),
    ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nested more than"),
    ("nodes: 1\nnodes: 2\n", "duplicate key 'nodes'"),
    ("nodes: 1" + "0" * 5000 + "\n", "ValueError"),
    ("a: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
])
def test_the_yaml_loader_refuses_what_no_bytecomp_file_needs(text, reason):
    with pytest.raises(BytecompError, match="not valid YAML") as error:
        load_yaml(text, "file.yaml")
    assert reason in str(error.value)


# -- profile numbers and consistency ---------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, "fast", None])
def test_every_phase_time_is_validated_not_only_four(cli, profile, tmp_path, value):
    edit_meta(profile, lambda m: m["times"]["backward_compute"].update(median_ms=value))
    one_line_error(cli("plan", "--no-verify", profile, "--out", tmp_path / "plan.yaml", *FAST),
             "times.backward_compute.median_ms")


def test_a_missing_backward_compute_is_one_line(cli, profile, tmp_path):
    edit_meta(profile, lambda m: m["times"].pop("backward_compute"))
    one_line_error(cli("plan", "--no-verify", profile, *FAST), "missing field 'times.backward_compute'")


def test_a_nan_anywhere_in_profile_yaml_is_refused(profile):
    edit_meta(profile, lambda m: m["machine"].update(memory_gib=math.nan))
    with pytest.raises(BytecompError, match="'machine.memory_gib' is nan"):
        load_profile(profile)


@pytest.mark.parametrize("column,row,value,reason", [
    ("numel", 1, "1e20", "is not an integer"),
    ("numel", 1, "10.5", "is not an integer"),
    ("numel", 1, "0", "must be at least 1"),
    ("numel", 1, "11", "does not hold numel elements"),
    ("shape", 1, "axb", "is not a shape"),
    ("bytes", 1, "41", "is not numel x the dtype's element size"),
    ("dtype", 1, "int64", "is not a supported dtype"),
    ("ready_ms", 2, "0.0", "is earlier than the row before"),
    ("ready_ms", 20, "500", "is after the backward pass"),
])
def test_a_profiles_tensors_are_checked_for_consistency(profile, column, row, value, reason):
    edit_cell(profile / "tensors.csv", column, row, value)
    with pytest.raises(BytecompError, match=reason):
        load_profile(profile)


def test_collectives_rank_counts_must_match_the_world(profile):
    edit_meta(profile, lambda m: m.update(world_size=4, ranks_per_node=4))
    with pytest.raises(BytecompError, match="column 'ranks', row 1: 2 does not match"):
        load_profile(profile)


def test_bytecomp_reads_back_a_profile_whose_meta_shares_an_object(tmp_path):
    """The loader refuses YAML aliases, so the writers must not emit them."""
    from bytecomp.profile_store import save_profile

    profile = synthetic_profile(mlp_shapes(2, 16), world_size=2)
    shared = [1, 2, 3]
    profile.meta["extra"] = {"a": shared, "b": shared}
    save_profile(profile, tmp_path / "p")
    assert "&" not in (tmp_path / "p" / "profile.yaml").read_text()
    assert load_profile(tmp_path / "p").meta["extra"] == {"a": shared, "b": shared}


def test_every_shipped_profile_still_loads():
    directories = [PROFILE, ROOT / "profiles" / "transformer"] + sorted(
        p.parent for p in (ROOT / "benchmarks" / "results").rglob("profile.yaml"))
    for directory in directories:
        load_profile(directory)


def test_the_probe_table_goes_through_the_same_checks(profile):
    """probe.csv (the convergence probe) is read like every table: numbers finite and in
    range, specs known and not repeated, steps factors at most the probe's cap."""
    from bytecomp.schema import MAX_STEPS_FACTOR
    from bytecomp.training.probe import MAX_FACTOR

    assert MAX_STEPS_FACTOR == MAX_FACTOR
    table = profile / "probe.csv"
    good = "spec,steps_factor,steps\nfp16,1.02,100\ntopk:ratio=0.01,1.8,100\n"
    table.write_text(good)
    assert load_profile(profile).steps_factors == {"fp16": 1.02, "topk:ratio=0.01": 1.8}
    for row, reason in (("fp16,nan,100", "column 'steps_factor', row 3: 'nan' is not a number"),
                        ("fp16,-1,100", "column 'steps_factor', row 3: must not be negative"),
                        ("int8,11,100", "column 'steps_factor', row 3: 11.0 is not from 0.1 to 10"),
                        ("int8,0,100", "column 'steps_factor', row 3: 0.0 is not from 0.1 to 10"),
                        ("int8,1.1,1e30", "column 'steps', row 3: "),
                        ("zip:level=9,1.1,100", "column 'spec', row 3: "),
                        ("topk:ratio=0.010,1,100", "column 'spec', row 3: 'topk:ratio=0.010' appears twice")):
        table.write_text(good + row + "\n")
        with pytest.raises(BytecompError, match=f"probe.csv: {re.escape(reason)}"):
            load_profile(profile)
    # the gain column (optional: probes before it had none) is a fraction
    table.write_text("spec,steps_factor,steps,gain\nfp16,1.02,100,1.0\n")
    assert load_profile(profile).probe_gains == {"fp16": 1.0}
    table.write_text("spec,steps_factor,steps,gain\nfp16,1.02,100,1.5\n")
    with pytest.raises(BytecompError, match="probe.csv: column 'gain', row 1: must be between"):
        load_profile(profile)
    table.unlink()
    os.mkfifo(table)
    with pytest.raises(BytecompError, match="not a regular file"):
        load_profile(profile)
    table.unlink()
    for steps in ("nan", "-1", "'x'", "[1]"):
        edit_meta(profile, lambda meta, s=steps: meta.update(probe={"steps": yaml.safe_load(s)}))
        with pytest.raises(BytecompError, match="field 'probe.steps' must be an integer"):
            load_profile(profile)


@pytest.mark.parametrize("section,value,message", [
    ("probe", {"informative": "yes"}, "field 'probe.informative' must be true or false"),
    ("probe", {"length": "forever"}, "field 'probe.length' must be budget or --probe-steps"),
    ("probe", {"fp32_improvement": 1.5},
     "field 'probe.fp32_improvement' must be a fraction from 0 to 1, got 1.5"),
    ("interference", {"fraction": 1}, "field 'interference.fraction' must be a number in [0, 1)"),
    ("quality", {"retries": 101}, "field 'quality.retries' must be an integer from 0 to 100, "
                                  "got 101"),
    ("quality", {"remeasured": [1]}, "field 'quality.remeasured' must be a list of fit names"),
    ("stages_s", {"probe": -1}, "field 'stages_s.probe' must be seconds from 0 to 1e7, got -1"),
])
def test_the_declared_fields_of_profile_yaml_refuse_in_their_own_words(profile, section, value,
                                                                       message):
    """The optional sections' fields are declared (profile_meta's *_FIELDS: a default and a
    check each); a bad value is one line naming the field, in the words it always had."""
    edit_meta(profile, lambda meta: meta.update(
        {section: value if section == "stages_s" else {**(meta.get(section) or {}), **value}}))
    with pytest.raises(BytecompError) as raised:
        load_profile(profile)
    assert str(raised.value) == f"{profile / 'profile.yaml'}: {message}"


def test_the_compressors_advance_column_is_optional_and_checked(profile):
    """compressors.csv's advance_ms (a multi-round encode's part between its
    collectives): profiles before it load without it; it is a non-negative part of
    the encode; it survives a save."""
    from bytecomp.profile_store import save_profile

    table = profile / "compressors.csv"
    rows = pd.read_csv(table)
    assert "advance_ms" not in rows.columns  # the fixture is an older profile
    rows["advance_ms"] = rows["encode_ms"] / 2
    rows.to_csv(table, index=False)
    loaded = load_profile(profile)
    assert list(loaded.compressors["advance_ms"]) == pytest.approx(list(rows["encode_ms"] / 2))
    save_profile(loaded, profile, force=True)
    assert "advance_ms" in pd.read_csv(table).columns
    for value, reason in ((-1.0, "must not be negative"), (None, "is more than encode_ms")):
        bad = rows.copy()
        bad.loc[1, "advance_ms"] = value if value is not None else bad.loc[1, "encode_ms"] * 2
        bad.to_csv(table, index=False)
        with pytest.raises(BytecompError,
                           match=f"compressors.csv: column 'advance_ms', row 2: .*{reason}"):
            load_profile(profile)


def _ladder_plan(path: Path, edit=None) -> Path:
    """The shipped 2 x 1 plan as an adaptive one: fp16, then top-k 1% everywhere."""
    data = yaml.safe_load((PLANNED / "plan.yaml").read_text())
    entries = data.pop("tensors")
    data["adaptive"] = {"family": "topk"}
    data["levels"] = [{"setting": spec, "predicted_ms": 70.0, "fidelity": 0.9, "tensors": [
        {**e, "action": "compress", "compressor": spec, "collective": collective}
        for e in entries]} for spec, collective in (("fp16", "allreduce"),
                                                    ("topk:ratio=0.01", "allgather"))]
    if edit:
        edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_ladders_levels_are_validated_like_the_rest(cli, tmp_path):
    path = _ladder_plan(tmp_path / "ladder.yaml")
    assert len(load_plan(path).levels) == 2
    result = cli("simulate", PLANNED / "profile", path, "--level", "1")
    assert result.returncode == 0, result.stderr
    for key, value in (("predicted_ms", math.nan), ("predicted_ms", -1.0),
                       ("predicted_ms", math.inf), ("fidelity", 1.5), ("fidelity", math.nan)):
        _ladder_plan(path, lambda d, k=key, v=value: d["levels"][1].update({k: v}))
        with pytest.raises(BytecompError, match=rf"levels\[1\]\.{key}: must be a number from"):
            load_plan(path)
    _ladder_plan(path, lambda d: d.update(bucket_cap_mb=math.nan))
    with pytest.raises(BytecompError, match="bucket_cap_mb: must be a number of MB from 0"):
        load_plan(path)
    _ladder_plan(path, lambda d: d.update(nodes=1, ranks_per_node=2))
    one_line_error(cli("simulate", PLANNED / "profile", path, "--level", "1"), "is for 1 x 2 ranks")
    one_line_error(cli("simulate", PLANNED / "profile", _ladder_plan(path), "--level", "2"),
             "has no level 2")
    one_line_error(cli("simulate", PLANNED / "profile", path, "--png", path), "is the input")


def test_a_damaged_controller_state_is_refused():
    from bytecomp.plan_types import Adaptive
    from bytecomp.runtime.controller import Controller

    def controller() -> Controller:
        return Controller(Adaptive("topk"), 2, [50.0, 40.0])

    saved = controller().state_dict()
    controller().load_state_dict(saved)
    for damage in ({"gain": [math.nan, None]}, {"time_ms": [None, -3.0]},
                   {"steps_here": -1}, {"switches": [[1, 0, 1, math.inf, "climb"]]}):
        with pytest.raises(BytecompError, match="controller is damaged"):
            controller().load_state_dict({**saved, **damage})


@pytest.mark.multirank
def test_bench_checks_every_plan_before_any_rank_starts(cli, tmp_path):
    """Main's repeated --plan: the first (whose predictions are compared) fits the profile's
    shape, every one its model and world size, and --out spares each."""
    second = tmp_path / "second.yaml"
    plan = yaml.safe_load((PLANNED / "plan.yaml").read_text())
    started = time.monotonic()
    for edit, fragment in (({"nodes": 1, "ranks_per_node": 1, "world_size": 1}, "is for 1 x 1"),
                           ({"model_fingerprint": "f" * 64}, "another model")):
        second.write_text(yaml.safe_dump({**plan, **edit}))
        one_line_error(cli("bench", PLANNED / "profile", "--plan", PLANNED / "plan.yaml", "--plan",
                     second, "--out", tmp_path / "bench", "--nproc", "2"), "second.yaml",
                 fragment)
    second.write_text(yaml.safe_dump({**plan, "nodes": 1, "ranks_per_node": 2}))
    one_line_error(cli("bench", PLANNED / "profile", "--plan", second, "--plan", PLANNED / "plan.yaml",
                 "--out", tmp_path / "bench", "--nproc", "2"), "second.yaml", "is for 1 x 2")
    second.write_text(yaml.safe_dump(plan))
    before = second.read_bytes()
    one_line_error(cli("bench", PLANNED / "profile", "--plan", PLANNED / "plan.yaml", "--plan", second,
                 "--out", second, "--force", "--nproc", "2"), "is the input")
    assert second.read_bytes() == before and time.monotonic() - started < 20
    assert not (tmp_path / "bench").exists()


# -- planning corner cases ------------------------------------------------------------------------


def test_plans_with_no_compressor_are_fp32_and_one_without_timings_one_line(
        cli, profile, tmp_path):
    table = profile / "compressors.csv"
    table.write_text(table.read_text().splitlines()[0] + "\n")
    (profile / "fidelity.csv").unlink()
    one_line_error(cli("plan", "--no-verify", profile, "--compressor", "none", "--strict", "--out",
                 tmp_path / "a.yaml"), "compressor none has no cpu timings")
    result = cli("plan", "--no-verify", profile, "--out", tmp_path / "b.yaml", "--algorithm", "greedy")
    assert result.returncode == 0, result.stderr
    assert {e.action for e in load_plan(tmp_path / "b.yaml").entries} == {"none"}
    result = cli("plan", "--no-verify", PROFILE, "--compressor", "none", "--strict", "--out", tmp_path / "c.yaml")
    assert result.returncode == 0, result.stderr  # nothing to compress with: fp32
    assert {e.action for e in load_plan(tmp_path / "c.yaml").entries} == {"none"}


def test_host_options_need_cpu_timings():
    profile = synthetic_profile(mlp_shapes(3, 256), world_size=8, nodes=2, device="cuda",
                                specs=["fp16", "topk:ratio=0.01", "powersgd:rank=4"])
    cuda_only = {"fp16", "topk:ratio=0.01"}  # no cpu rows: they cannot run on the host
    profile.compressors = profile.compressors[
        ~(profile.compressors.spec.isin(cuda_only) & (profile.compressors.device == "cpu"))]
    planner = Planner(profile, specs=["topk:ratio=0.01", "powersgd:rank=4"])  # and fp16
    hosts = {o.spec for o in planner.problem.options if o.place == "host"}
    assert hosts == {"powersgd:rank=4"}
    planner.search(algorithm="greedy", budget_s=0)


def test_a_nan_bucket_cap_in_a_plan_is_refused(tmp_path):
    for value in (".nan", ".inf", "-1", "10000000", "0"):
        text = (PLANNED / "plan.yaml").read_text()
        path = tmp_path / "plan.yaml"
        path.write_text(text.replace("bucket_cap_mb: ", f"bucket_cap_mb: {value} #", 1))
        # 0 is one bucket per tensor, which this plan's merged groups contradict
        message = ("merges no tensors" if value == "0" else
                   "bucket_cap_mb: must be a number of MB from 0")
        with pytest.raises(BytecompError, match=message):
            load_plan(path)


def test_a_hierarchical_plan_on_one_rank_per_node_is_one_line(cli, tmp_path):
    plan = yaml.safe_load((PLANNED / "plan.yaml").read_text())
    plan["tensors"][0].update(action="compress", compressor="fp16", place="device",
                              collective="hierarchical", group=999)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    one_line_error(cli("simulate", PLANNED / "profile", tmp_path / "plan.yaml"), "hierarchical")


def test_a_plan_of_another_shape_is_refused(cli, tmp_path):
    plan = yaml.safe_load((PLANNED / "plan.yaml").read_text())
    plan.update(nodes=1, ranks_per_node=2)  # the profile is 2 nodes x 1
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    one_line_error(cli("simulate", PLANNED / "profile", tmp_path / "plan.yaml"),
             "is for 1 x 2 ranks", "has 2 x 1", "pass --cluster")


# -- outputs ---------------------------------------------------------------------------------------


def test_an_output_that_is_an_input_is_refused_before_any_work(cli, profile, tmp_path):
    before = {p.name: p.read_bytes() for p in profile.iterdir()}
    one_line_error(cli("plan", "--no-verify", profile, "--out", profile / "profile.yaml", *FAST),
             "is the input", "profile.yaml")
    one_line_error(cli("simulate", PLANNED / "profile", PLANNED / "plan.yaml", "--trace",
                 profile / "tensors.csv", "--png", PLANNED / "plan.yaml"), "is the input")
    assert {p.name: p.read_bytes() for p in profile.iterdir()} == before


def test_an_output_through_a_link_is_followed_and_the_link_kept(cli, tmp_path):
    target = tmp_path / "plans" / "real.yaml"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "plan.yaml"
    link.symlink_to(target)
    result = cli("plan", "--no-verify", PROFILE, "--out", link, *FAST)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert load_plan(target).entries


def test_simulate_draws_a_plan_with_the_executors_fixed_costs(cli, tmp_path):
    """Their 'hook' op had no colour: the PNG raised ValueError."""
    trace, png = tmp_path / "trace.json", tmp_path / "gantt.png"
    result = cli("simulate", PLANNED / "profile", PLANNED / "plan.yaml", "--trace", trace,
                 "--png", png)
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and b"hook" in trace.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gantt.png", "trace.json"]


def test_a_full_disk_writes_neither_the_trace_nor_the_png(cli, tmp_path, monkeypatch):
    import matplotlib.figure

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    trace, png = tmp_path / "trace.json", tmp_path / "gantt.png"
    one_line_error(cli("simulate", PLANNED / "profile", PLANNED / "plan.yaml", "--trace", trace,
                 "--png", png), "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_too_long_output_name_is_one_line(cli, tmp_path):
    one_line_error(cli("plan", "--no-verify", PROFILE, "--out", tmp_path / ("p" * 300), *FAST), "too long")


# Stale temporaries, bytecomp's own and a user's named like them: tests/hostile/test_side_files.py
