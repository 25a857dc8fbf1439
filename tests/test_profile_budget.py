"""The profile inside its budget: the stages' shares, sweeps sized by time, the progress
lines of a piped profile, and the per-user cache of a cluster's tables."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from bytecomp.profiler import budget as budget_module
from bytecomp.profiler.budget import (
    CLUSTER_SHARE,
    PROBE_SHARE,
    SHARES,
    Allowance,
    describe_split,
)
from bytecomp.profiler.cache import CACHE_ENV, ClusterKey, cache_root, lookup
from bytecomp.profiler.calibration_file import load_calibration
from bytecomp.profiler.sweeps import (
    MAX_OP_S,
    MIN_OP_S,
    SweepSettings,
    more_rounds,
    op_limit,
    settled,
    sizes,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
CALIBRATION = FIXTURES / "calibration-1x2"
BYTECOMP = [sys.executable, "-m", "bytecomp"]


# -- the split -------------------------------------------------------------------------------


def test_the_stages_share_the_budget_and_leave_the_probe_at_least_forty_percent():
    assert CLUSTER_SHARE == pytest.approx(0.40)
    assert PROBE_SHARE >= 0.4 - 1e-9 and sum(SHARES.values()) + PROBE_SHARE == pytest.approx(1)
    line = describe_split(240, 200)
    assert "of the 200 s start-up left" in line and "at most 40%" in line
    assert "at least 40%" in line
    allowance = Allowance.of("collective sweeps", 100.0)
    assert allowance is not None and allowance.seconds == pytest.approx(20.0)
    assert 19 < allowance.left() <= 20
    assert Allowance.of("collective sweeps", None) is None
    # --calibrate-only: the cluster's stages are the whole job
    whole = Allowance.of("collective sweeps", 100.0, scale=1 / CLUSTER_SHARE)
    assert whole is not None and whole.seconds == pytest.approx(50.0)


# -- sweeps sized by time ---------------------------------------------------------------------


def test_a_series_stops_at_the_largest_array_the_plan_can_use():
    settings = SweepSettings(max_bytes=5 << 20)  # a 1.3M-parameter model's gradient
    grid = sizes(settings, 1 << 40)
    assert grid[0] == 1 << 10 and grid[-1] == 8 << 20 and grid[-2] < 5 << 20
    assert sizes(settings, 2 << 20)[-1] == 2 << 20  # the memory's cap still holds
    assert settings.numels_up_to_max() == (1 << 8, 1 << 12, 1 << 16, 1 << 20, 1 << 24)
    small = SweepSettings(max_bytes=1 << 20)  # 262,144 float32 elements
    assert small.numels_up_to_max() == (1 << 8, 1 << 12, 1 << 16, 1 << 20)


def test_the_per_operation_limit_comes_from_the_stage_s_share():
    fixed = SweepSettings()
    assert op_limit(fixed, 15) == fixed.budget_s  # no budget: the fixed limit
    timed = replace(fixed, allowance=Allowance(48.0, time.time()))
    # 48 s over 11 series: the pilot and 3 rounds of series costing twice their largest op
    assert op_limit(timed, 11) == pytest.approx(48 / (2 * 4 * 11))
    assert op_limit(replace(fixed, allowance=Allowance(0.01, time.time())), 30) == MIN_OP_S
    assert op_limit(replace(fixed, allowance=Allowance(1e5, time.time())), 1) == MAX_OP_S


def test_rounds_stop_once_the_medians_settle_or_the_time_is_spent():
    assert settled([1.0, 10.0], [1.04, 9.6]) and not settled([1.0, 10.0], [1.1, 10.0])
    assert more_rounds(1, 10, None, [1.0], 0.1, None)  # fewer than three: always
    assert more_rounds(3, 10, [1.0], [1.2], 0.1, None)  # still moving
    assert not more_rounds(3, 10, [1.0], [1.01], 0.1, None)  # settled
    assert not more_rounds(10, 10, [1.0], [2.0], 0.1, None)  # the most
    late = Allowance(1.0, time.time() - 0.95)
    assert not more_rounds(4, 10, [1.0], [2.0], 0.1, late)  # another round would end past it
    assert more_rounds(4, 10, [1.0], [2.0], 0.01, Allowance(60.0, time.time()))


def test_fits_that_stay_poor_are_one_line_that_says_what_to_do():
    from bytecomp.costs.fit_quality import FitQuality
    from bytecomp.profiler.quality import poor_summary

    assert poor_summary([]) is None
    fits = [FitQuality("collective allgather/world/float32", 0.5, 0.3),
            FitQuality("compressor fp16/cpu", 0.8, 0.4)]
    line = poor_summary(fits)
    assert line is not None and "\n" not in line
    assert line.startswith("2 sweep fits stay poor") and "allgather/world/float32" in line
    assert "priced less surely" in line and "--budget" in line and "quality.poor" in line


# -- the stage lines ---------------------------------------------------------------------------


def test_piped_a_stage_shows_its_time_against_its_allowance_and_a_line_every_while(
        monkeypatch, capsys):
    from bytecomp import ui

    monkeypatch.setattr(ui, "HEARTBEAT_S", 0.1)
    reporter = ui.Reporter()
    with reporter.session():
        advance = reporter.phase("collective sweeps", 40, 0.05, "a larger --budget gives it more")
        advance()
        time.sleep(0.3)  # past its allowance, and past a heartbeat
        advance(total=12)
        reporter.phase("gradient fidelity", 3, 10.0)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "collective sweeps: 40 steps, at most 0.1 s"
    assert any(line.startswith("  collective sweeps: 1 of 40 steps, 0.") and
               line.endswith("s of 0.1 s allowed") for line in lines), err
    assert "  collective sweeps: 12 steps, as the time allows" in lines
    ends = [line for line in lines if line.startswith("  collective sweeps: ") and
            line.endswith(" s of 0.1 s allowed") and "steps" not in line]
    assert len(ends) == 1, err
    warnings = [line for line in lines if line.startswith("warning: collective sweeps took ")]
    assert len(warnings) == 1 and warnings[0].endswith(
        " s of the 0.1 s it is allowed: a larger --budget gives it more"), err
    assert "  gradient fidelity: 0.0 s of 10 s allowed" in lines  # at the session's end
    assert not any("fidelity" in line and "warning" in line for line in lines)


# -- the cache ---------------------------------------------------------------------------------


def _key(**changes) -> ClusterKey:
    key = ClusterKey(2, 1, 2, "gloo", "cpu", "AMD EPYC", "torch", 1, True)
    return replace(key, **changes)


def _entry(key: ClusterKey) -> Path:
    """The shipped calibration fixture, as the cache entry of ``key``."""
    path = key.path()
    shutil.copytree(CALIBRATION, path)
    meta = yaml.safe_load((path / "calibration.yaml").read_text())
    meta["cache_key"] = asdict(key)
    (path / "calibration.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return path


def test_the_cache_lives_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine" / "clusters"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "bytecomp" / "clusters"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "bytecomp" / "clusters"
    assert _key().digest() != _key(threads_per_rank=2).digest() != _key(quick=False).digest()


def test_a_cache_entry_serves_only_the_job_it_was_made_for():
    said: list[str] = []
    key = _key()
    assert lookup(key, ["fp16"], 1 << 10, said.append) is None and not said  # none yet
    path = _entry(key)
    assert lookup(key, ["fp16", "topk:ratio=0.01"], 1 << 10, said.append) == path and not said
    assert lookup(key, ["fp16", "qsgd"], 1 << 10, said.append) is None
    assert "no timings of qsgd" in said[-1]
    assert lookup(key, ["fp16"], 1 << 40, said.append) is None
    assert "swept up to" in said[-1] and "measuring the cluster afresh" in said[-1]
    other = _key(world_size=4, ranks_per_node=4)  # written for another job: never trusted
    shutil.copytree(path, other.path())
    assert lookup(other, ["fp16"], 1 << 10, said.append) is None
    assert "made for another job" in said[-1]


def test_a_damaged_cache_entry_is_refused_in_one_line():
    said: list[str] = []
    key = _key()
    path = _entry(key)
    (path / "collectives.csv").write_text("collective,group\nallreduce\n")
    assert lookup(key, ["fp16"], 1 << 10, said.append) is None
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith(f"the cached cluster tables in {path} are damaged and not used")
    assert said[0].endswith("measuring them afresh")


def test_the_cache_option_is_declared_and_documented():
    from bytecomp.options import ProfileOptions

    assert ProfileOptions.build().cache is True
    assert ProfileOptions.build(cache=False).cache is False
    page = (ROOT / "docs" / "commands" / "profile.md").read_text()
    assert "`--cache`, `--no-cache`" in page
    profiling = (ROOT / "docs" / "profiling.md").read_text()
    for label in ("`training iterations`", "`collective sweeps`", "`compressor sweeps`",
                  "`aggregation sweeps`", "`copy sweeps`", "`executor fixed costs`",
                  "`gradient fidelity`", "`convergence probe (N)`"):
        assert label in profiling, label  # every stage label is explained
    assert set(SHARES) == {label.strip("`") for label in (
        "`training iterations`", "`collective sweeps`", "`compressor sweeps`",
        "`aggregation sweeps`", "`copy sweeps`", "`executor fixed costs`",
        "`gradient fidelity`")}
    assert budget_module.OVERRUN == 1.2


# -- on spawned ranks ----------------------------------------------------------------------------

SHORT = ["--model", "factories:with_recipe", "--quick", "--probe-steps", "0",
         "--fidelity-iterations", "1", "--compressor", "fp16"]


def bytecomp(*args, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*BYTECOMP, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "COLUMNS": "160", CACHE_ENV: str(cache),
                               "PYTHONPATH": str(FIXTURES)})


@pytest.mark.slow  # imports the command's modules
def test_no_cache_is_an_option_of_the_command(cli, tmp_path):
    done = cli("profile", "--no-cache", "--model", "no_such_model", "--out", tmp_path / "p")
    assert done.returncode == 2 and "no_such_model" in done.stderr, done.stderr
    assert "No such option" not in done.stderr


@pytest.mark.clock
@pytest.mark.multirank
def test_the_cluster_is_measured_once_and_a_damaged_entry_measured_again(tmp_path):
    """A first profile measures the cluster and keeps its tables; a damaged entry is
    refused in one line and measured again (and replaced); the next profile reuses
    them, says so and names --no-cache (one rank: the cache's logic is the same)."""
    cache = tmp_path / "cache"
    first = bytecomp("profile", *SHORT, "--out", tmp_path / "first", cache=cache)
    assert first.returncode == 0, first.stderr
    (entry,) = (cache / "clusters").iterdir()
    load_calibration(entry)  # a valid calibration
    (entry / "compressors.csv").write_text("spec,device\nfp16\n")  # damaged
    second = bytecomp("profile", *SHORT, "--out", tmp_path / "second", cache=cache)
    assert second.returncode == 0, second.stderr
    refusals = [line for line in second.stderr.splitlines() if "damaged and not used" in line]
    assert len(refusals) == 1 and "measuring them afresh" in refusals[0], second.stderr
    meta = yaml.safe_load((tmp_path / "second" / "profile.yaml").read_text())
    assert set(meta["calibration"]["tables"].values()) == {"measured"}
    assert "collective sweeps" in second.stderr
    load_calibration(entry)  # replaced, whole
    third = bytecomp("profile", *SHORT, "--out", tmp_path / "third", cache=cache)
    assert third.returncode == 0, third.stderr
    assert "the cluster's tables come from the cache" in third.stderr
    assert "--no-cache measures them afresh" in third.stderr
    assert "collective sweeps" not in third.stderr
    meta = yaml.safe_load((tmp_path / "third" / "profile.yaml").read_text())
    assert meta["calibration"]["cache"] is True
    assert set(meta["calibration"]["tables"].values()) == {"calibration"}
    for name in ("collectives", "compressors", "aggregation", "copies"):
        assert (entry / f"{name}.csv").read_bytes() == \
            (tmp_path / "third" / f"{name}.csv").read_bytes(), name


@pytest.mark.slow  # imports the benchmark's modules (scipy)
def test_the_pipeline_cost_benchmark_judges_the_issue_s_targets():
    """benchmarks/pipeline_cost.py's verdicts on a made-up table: a profile over its
    budget, a probe below its share and a cached profile within 40% are each called so."""
    import pandas as pd

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pipeline_cost

    rows = [
        {"link": "100mbit", "task": "charlstm", "command": "profile", "seconds": 250.0,
         "probe_s": 110.0, "probe_steps": 40, "probe_step_s": 0.5},
        {"link": "100mbit", "task": "charlstm", "command": "plan (default)",
         "time_to_fp32_final_s": 10.0, "step_error": -0.05},
        {"link": "100mbit", "task": "charlstm", "command": "plan (reference)",
         "time_to_fp32_final_s": 10.2, "step_error": 0.06},
        {"link": "100mbit", "task": "transformer", "command": "profile (cache)",
         "seconds": 400.0, "probe_s": 100.0, "probe_steps": 20, "probe_step_s": 0.5},
    ]
    lines = pipeline_cost.verdicts(pd.DataFrame(rows))
    assert "`profile` 250 s (target <= 288 s: met)" in lines[0]
    assert "probe 44% of the profile, 40 steps" in lines[1] and lines[1].endswith("met)")
    assert "step error 5.0%, the reference's 6.0% (met)" in lines[2]
    assert "`profile (cache)` 400 s (target <= 288 s: MISSED)" in lines[3]
    assert lines[4].endswith("MISSED)")  # 25%, 20 steps
    assert "with the cache 400 s, 160% of the first profile's" in lines[5]
    assert lines[5].endswith("MISSED)")


def test_the_probe_trains_only_compressors_a_plan_could_use(tmp_path):
    """On a link so fast that no compressor sends any tensor sooner than fp32, and for a
    cluster the plans are for as fast, the probe trains none of them; for a 1 GbE
    cluster, all of them."""
    from bytecomp.profiler.candidates import probe_candidates
    from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile

    specs = ["fp16", "powersgd:rank=4", "signsgd"]
    fast = tmp_path / "fast.yaml"
    fast.write_text("name: fast\nnodes: 2\nranks_per_node: 1\n"
                    "links:\n  inter: {bandwidth_gbps: 100000, latency_us: 1}\n")
    for bandwidth, skipped in ((1e5, specs), (0.1, [])):
        profile = synthetic_profile(mlp_shapes(), world_size=2, bandwidth_gbps=bandwidth,
                                    latency_us=1.0, device="cpu", specs=specs)
        tables = (profile.meta, profile.tensors, profile.collectives.to_dict("records"),
                  profile.compressors.to_dict("records"), specs)
        found = probe_candidates(*tables, [str(fast)])
        assert found.skipped == skipped and found.trained == [s for s in specs
                                                             if s not in skipped]
        if skipped:
            line = found.line([str(fast)])
            assert line is not None and "leaves out 3 of 3 compressors" in line
            assert f"sooner than fp32 on the profiled ranks or {fast}" in line
            assert "--cluster" in line
            kept = probe_candidates(*tables, ["gbe1"])
            assert kept.trained == specs and kept.line(["gbe1"]) is None
        else:
            assert found.line([str(fast)]) is None


DTYPE_CHECK = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from bytecomp.comm.compat import collective_call
    from bytecomp.profiler.sweeps import BYTE_COLLECTIVES, DTYPES
    from bytecomp.profiler.timing import Clock, time_call_ms
    clock, least = Clock(torch.device("cpu")), {}
    for name in BYTE_COLLECTIVES:
        for nbytes in (1 << 20, 4 << 20):
            calls = {d: collective_call(name, nbytes, t, None, 2, torch.device("cpu"))
                     for d, t in DTYPES.items()}
            for _ in range(7):  # interleaved: drift hits every dtype alike
                for dtype, call in calls.items():
                    dist.barrier()
                    time_ms = time_call_ms(call, clock, 1)[0]
                    key = (name, nbytes, dtype)
                    least[key] = min(least.get(key, 1e9), time_ms)
    if rank == 0:
        with open(out, "w") as f:
            for (name, nbytes, dtype), ms in least.items():
                f.write(f"{name},{nbytes},{dtype},{ms}\n")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2)
'''


@pytest.mark.clock
@pytest.mark.multirank
def test_collectives_without_arithmetic_take_the_same_time_in_every_dtype(tmp_path):
    """What lets the sweep measure allgather, alltoall and broadcast once per byte count:
    on 2 gloo ranks the same bytes take the same time in float32, float16 and uint8
    (the least of 7 interleaved samples each, within 2.5x: a shared machine's noise, which
    put a 1 MiB allgather at 0.78 ms in float32 and 1.30 ms in uint8 in one CI run; the
    difference of a reduction's arithmetic would be systematic)."""
    import socket

    import pandas as pd

    script = tmp_path / "dtypes.py"
    script.write_text(DTYPE_CHECK)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "least.csv"
    done = subprocess.run([sys.executable, str(script), str(port), str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_csv(out, names=["collective", "bytes", "dtype", "ms"])
    for (collective, nbytes), rows in table.groupby(["collective", "bytes"]):
        assert len(rows) == 3
        assert rows.ms.max() <= 2.5 * rows.ms.min(), (collective, nbytes, rows.to_dict())


def test_piped_a_phase_the_time_decides_says_at_most_then_what_it_trains(capsys):
    from bytecomp import ui

    reporter = ui.Reporter()
    with reporter.session():
        advance = reporter.phase("training 6 finalists", 1000, most=True)
        advance(0, total=10)
        advance(10)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["training 6 finalists: at most 1,000 steps",
                         "  training 6 finalists: 10 steps, as the time allows"]


def test_a_cache_that_cannot_be_written_is_one_line_not_an_error(monkeypatch, tmp_path):
    from bytecomp.profiler.cache import keep

    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(CACHE_ENV, str(blocked))
    said: list[str] = []

    def write(path: Path) -> None:
        path.mkdir(parents=True)

    keep(_key(), write, said.append)
    assert len(said) == 1 and said[0].startswith("the cluster's tables could not be kept")
    assert CACHE_ENV in said[0]


def test_a_series_keeps_the_next_size_past_the_limit_only_when_it_is_not_far_slower():
    from bytecomp.profiler.sweeps import _within_budget

    sizes_ = [1, 2, 3, 4]
    assert _within_budget(sizes_, [10, 100, 900, 2000], 0.5) == [1, 2, 3]  # 900 ms: kept
    assert _within_budget(sizes_, [10, 100, 1500, 2000], 0.5) == [1, 2]  # 3x: left out
    assert _within_budget(sizes_, [5000, 6000, 7000, 8000], 0.5) == [1]  # always the first
    assert _within_budget(sizes_, [1, 2, 3, 4], 0.5) == sizes_
