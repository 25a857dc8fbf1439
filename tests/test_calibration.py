"""Cluster calibration: ``bytecomp profile --calibrate-only`` measures the cluster's tables
once, ``bytecomp profile --calibration DIR`` reuses them (and records where each came
from) on a job of the same world, backend, device and link, and refuses in one line
otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from refusal import one_line_error

from bytecomp.errors import BytecompError
from bytecomp.launch import free_port
from bytecomp.profiler import load_profile
from bytecomp.profiler.calibration import (
    LINK_MAX_BYTES,
    LINK_MAX_MS,
    LINK_TOLERANCE,
    _link_size,
)
from bytecomp.profiler.calibration_file import load_calibration

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# bytecomp profile --calibrate-only --quick --nproc 2 --compressor fp16
#   --compressor topk:ratio=0.01 (1 node x 2 ranks, gloo, this project's CI machine)
CALIBRATION = FIXTURES / "calibration-1x2"
BYTECOMP = [sys.executable, "-m", "bytecomp"]
SPECS = ["--compressor", "fp16", "--compressor", "topk:ratio=0.01"]
# a profile as short as one gets: no probe, one fidelity step
SHORT = ["--model", "mlp", "--quick", "--probe-steps", "0", "--fidelity-iterations", "1"]
CLUSTER_TABLES = ("collectives", "compressors", "aggregation", "copies")


def bytecomp(*args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run([*BYTECOMP, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "160", **(env or {})})


def here(tmp_path: Path) -> Path:
    """The fixture as if made on this machine (its CPU's name and threads per rank), so
    that a refusal is for what a test changes alone."""
    import torch

    from bytecomp.launch import threads_per_rank
    from bytecomp.profiler.job import device_name

    copy = tmp_path / "calibration"
    shutil.copytree(CALIBRATION, copy)
    meta = yaml.safe_load((copy / "calibration.yaml").read_text())
    meta["device"]["name"] = device_name(torch.device("cpu"))
    meta["machine"]["threads_per_rank"] = threads_per_rank(2)
    (copy / "calibration.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return copy




# -- in this process, before any rank ---------------------------------------------------------


def test_the_shipped_fixture_loads_as_a_calibration():
    calibration = load_calibration(CALIBRATION)
    assert calibration.kind == "calibration"
    assert calibration.specs == ["fp16", "topk:ratio=0.01"]
    assert calibration.executor() is not None
    assert (calibration.meta["world_size"], calibration.meta["nodes"],
            calibration.meta["ranks_per_node"]) == (2, 1, 2)


def test_the_link_check_times_a_bandwidth_bound_size():
    """The largest swept size up to LINK_MAX_BYTES whose median took at most
    LINK_MAX_MS, against the calibration's p10 there."""
    calibration = load_calibration(CALIBRATION)
    nbytes, p10 = _link_size(calibration, "world")
    rows = calibration.collectives
    rows = rows[(rows["collective"] == "allreduce") & (rows["dtype"] == "float32")
                & (rows["group"] == "world")]
    fitting = rows[(rows["bytes"] <= LINK_MAX_BYTES) & (rows["time_ms"] <= LINK_MAX_MS)]
    assert nbytes == fitting["bytes"].max()
    assert p10 == float(rows[rows["bytes"] == nbytes]["p10_ms"].iloc[0])


def test_a_world_size_mismatch_is_one_line_before_any_rank(cli, tmp_path):
    calibration = here(tmp_path)
    result = cli("profile", *SHORT, "--nproc", "1", "--calibration", calibration,
                 "--out", tmp_path / "p")
    line = one_line_error(result, f"calibration {calibration} does not match this job",
                    "2 ranks (1 node x 2) there, 1 rank (1 node x 1) here",
                    "bytecomp profile --calibrate-only")
    assert not (tmp_path / "p").exists(), line
    meta = yaml.safe_load((calibration / "calibration.yaml").read_text())
    meta["device"]["name"] = "a TPU of some kind"
    (calibration / "calibration.yaml").write_text(yaml.safe_dump(meta))
    one_line_error(cli("profile", *SHORT, "--nproc", "2", "--calibration", calibration,
                 "--out", tmp_path / "p"), "device cpu 'a TPU of some kind' there")


def test_compressors_the_calibration_did_not_time_are_refused(cli, tmp_path):
    one_line_error(cli("profile", *SHORT, "--nproc", "2", "--calibration", here(tmp_path),
                 "--compressor", "int8", "--out", tmp_path / "p"),
             "has no timings of int8", "leave it out")


def test_calibration_inputs_and_options_are_checked(cli, tmp_path):
    one_line_error(cli("profile", "--calibration", tmp_path, "--out", tmp_path / "p"),
             "holds neither calibration.yaml nor profile.yaml")
    one_line_error(cli("profile", "--calibration", tmp_path / "none", "--out", tmp_path / "p"),
             "does not exist")
    one_line_error(cli("profile", "--calibrate-only", "--calibration", CALIBRATION),
             "--calibration and --calibrate-only do not go together")
    one_line_error(cli("profile", "--calibrate-only", "--model", "cnn", "--out", tmp_path / "c"),
             "--model has no effect with --calibrate-only")
    copy = here(tmp_path)
    one_line_error(cli("profile", *SHORT, "--nproc", "2", "--calibration", copy, "--out", copy,
                 "--force"), "which replacing it would delete")
    one_line_error(cli("plan", copy), "is a calibration", "not a profile")


def test_a_damaged_calibration_is_one_line(tmp_path):
    copy = tmp_path / "calibration"
    shutil.copytree(CALIBRATION, copy)
    (copy / "compressors.csv").unlink()
    with pytest.raises(BytecompError, match="compressors.csv: missing"):
        load_calibration(copy)
    shutil.copy(CALIBRATION / "compressors.csv", copy)
    table = pd.read_csv(copy / "collectives.csv")
    table[table["collective"] != "allreduce"].to_csv(copy / "collectives.csv", index=False)
    with pytest.raises(BytecompError, match="no float32 allreduce of the world group"):
        load_calibration(copy)
    shutil.copy(CALIBRATION / "collectives.csv", copy)
    meta = yaml.safe_load((copy / "calibration.yaml").read_text())
    meta["nodes"] = 2
    (copy / "calibration.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(BytecompError, match="nodes x ranks_per_node must equal world_size"):
        load_calibration(copy)


def test_executor_measurement_gives_the_fixed_costs_as_before():
    """The executor's measurement turns into fixed costs as the profile always derived
    them: the added time less the model's charge, its hook part, and on a CPU job the
    busy backward's share less the charged compute and the collectives' longer waits."""
    from bytecomp.profiler.overheads import ExecutorMeasurement

    measured = ExecutorMeasurement({"direct": 1.0, "fifo": 2.0, "host": 0.2},
                                   {"direct": 0.3, "fifo": -0.1, "host": 0.1},
                                   {"direct": 0.9, "fifo": 3.0, "host": 0.5}, -0.05)
    charges = {"direct": 0.5, "fifo": 1.0, "host": 0.4}
    compute = {"direct": 0.1, "fifo": 0.2, "host": 0.0}
    costs = measured.costs(charges, compute, {"direct": 1, "fifo": 2, "host": 1}, 0.25)
    assert costs.bucket_ms == 0.0
    # direct: fixed 0.5, hook min(0.5, 0.3) = 0.3, busy 0.9 - 0.1 - 0.25 = 0.55 -> 0.55
    assert costs.hook_ms["direct"] == pytest.approx(0.55)
    assert costs.tail_ms["direct"] == pytest.approx(0.0)
    # fifo: fixed 1.0, hook 0 (negative), busy 3.0 - 0.2 - 0.5 = 2.3
    assert costs.hook_ms["fifo"] == pytest.approx(2.3) and costs.tail_ms["fifo"] == 0.0
    # host: fixed 0 (charged more than measured): hook min(0, 0.1) = 0, busy 0.25
    assert costs.hook_ms["host"] == pytest.approx(0.25) and costs.tail_ms["host"] == 0.0
    idle = ExecutorMeasurement(measured.added_ms, measured.hook_added_ms, {}, 0.2)
    costs = idle.costs(charges, compute)  # a GPU job: no busy backward
    assert costs.hook_ms["direct"] == pytest.approx(0.3)
    assert costs.tail_ms["direct"] == pytest.approx(0.2) and costs.bucket_ms == 0.2
    assert ExecutorMeasurement.from_meta(measured.to_meta()) == measured


# -- on spawned ranks ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A calibration made here, and a profile made with it."""
    root = tmp_path_factory.mktemp("calibrated")
    result = bytecomp("profile", "--calibrate-only", "--quick", "--nproc", "2", *SPECS,
                      "--out", str(root / "calibration"))
    assert result.returncode == 0, result.stderr[-3000:]
    result = bytecomp("profile", *SHORT, "--nproc", "2", "--calibration",
                      str(root / "calibration"), "--out", str(root / "profile"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "calibration", root / "profile"


def assert_same_tables(calibration: Path, profile: Path) -> None:
    for name in CLUSTER_TABLES:
        assert (calibration / f"{name}.csv").read_bytes() == \
            (profile / f"{name}.csv").read_bytes(), name


@pytest.mark.clock
@pytest.mark.multirank
def test_a_profile_reuses_the_calibrations_tables_and_says_so(calibrated):
    calibration_dir, profile_dir = calibrated
    calibration = load_calibration(calibration_dir)
    assert calibration.kind == "calibration" and calibration.specs == ["fp16", "topk:ratio=0.01"]
    assert_same_tables(calibration_dir, profile_dir)
    profile = load_profile(profile_dir)
    meta = profile.meta
    record = meta["calibration"]
    assert record["tables"] == dict.fromkeys((*CLUSTER_TABLES, "executor"), "calibration")
    assert Path(record["directory"]) == calibration_dir.resolve()
    assert record["kind"] == "calibration"
    assert record["created"] == record["measured"] == calibration.meta["created"]
    (check,) = record["link"]["checks"]  # 1 node: the world group alone
    assert check["group"] == "world" and record["link"]["tolerance"] == LINK_TOLERANCE
    assert 1 / LINK_TOLERANCE <= check["ratio"] <= LINK_TOLERANCE
    assert meta["executor"]["measured"] == calibration.meta["executor"]["measured"]
    assert meta["compressor_specs"] == ["fp16", "topk:ratio=0.01"]  # the calibration's
    assert meta["quality"] == calibration.meta["quality"]
    assert meta["sweep"] == calibration.meta["sweep"]
    assert set(profile.fidelity["spec"]) == {"fp16", "topk:ratio=0.01"}


@pytest.mark.clock
@pytest.mark.multirank
def test_a_profile_made_without_a_calibration_says_every_table_was_measured(calibrated):
    """... and a profile directory serves as a calibration, its tables' time carried on."""
    calibration_dir, profile_dir = calibrated
    out = profile_dir.parent / "again"
    result = bytecomp("profile", *SHORT, "--nproc", "2", "--calibration", str(profile_dir),
                      "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_tables(calibration_dir, out)
    record = load_profile(out).meta["calibration"]
    assert record["kind"] == "profile" and Path(record["directory"]) == profile_dir.resolve()
    assert record["created"] == load_profile(profile_dir).meta["created"]
    assert record["measured"] == load_calibration(calibration_dir).meta["created"]


def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for network namespaces"
    probe = subprocess.run(["ip", "netns", "add", "bccalprobe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces unavailable: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "bccalprobe"], capture_output=True)
    return None


@pytest.mark.clock
@pytest.mark.multirank
def test_a_100mbit_calibration_is_refused_on_loopback(tmp_path):
    """Made on 2 emulated nodes of 1 rank at 100 Mbit/s, used by 2 ranks of 1 node each
    on plain loopback (the same shape, device and backend): the link check refuses it,
    on every rank, before anything is measured."""
    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    calibration = tmp_path / "calibration"
    result = bytecomp("emulate", "--nodes", "2", "--bandwidth", "100mbit", "--", *BYTECOMP,
                      "profile", "--calibrate-only", "--quick", "--compressor", "fp16",
                      "--out", str(calibration))
    assert result.returncode == 0, result.stderr[-3000:]
    port = str(free_port())
    ranks = [subprocess.Popen(
        [*BYTECOMP, "profile", *SHORT, "--calibration", str(calibration),
         "--out", str(tmp_path / "profile")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "160", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
             "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
             "GROUP_RANK": str(rank), "OMP_NUM_THREADS": "1"})
        for rank in range(2)]
    for rank in ranks:
        stdout, stderr = rank.communicate(timeout=300)
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert rank.returncode == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
        assert "was made on another link" in errors[0] and "faster here" in errors[0], stderr
    assert not (tmp_path / "profile").exists()
