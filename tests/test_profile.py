"""``bytecomp profile`` on real gloo ranks: contents of the profile, torchrun, errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from refusal import one_line_error
from torch.nn.parallel import DistributedDataParallel

from bytecomp.compress import default_specs, from_spec
from bytecomp.plan_types import fingerprint
from bytecomp.profiler import load_profile
from bytecomp.profiler.sweeps import COLLECTIVES, DTYPES, EXTRA_SAMPLES, samples_per_round
from bytecomp.training.workloads import load_workload

from ranks import free_port, run_ranks

# every test here spawns ranks (profiles them, or emulates a cluster): make test-all
pytestmark = pytest.mark.multirank

FIXTURES = str(Path(__file__).parent / "fixtures")
BUCKET_CAP_MB = 5.0


def bytecomp(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": FIXTURES, "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "bytecomp", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def assert_one_line_error(result, *fragments, code=2):
    # a torch warning (and the source line it quotes) is torch's, not a second error line
    return one_line_error(result, *fragments, code=code, ignore=("Warning", "return func"))


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles") / "mlp"
    # no convergence probe: test_bench's profile tests it (here 4/5 of the run's time)
    result = bytecomp("profile", "--model", "mlp", "--nproc", "2", "--quick", "--out", str(out),
                      "--bucket-cap-mb", str(BUCKET_CAP_MB), "--probe-steps", "0")
    assert result.returncode == 0, result.stderr
    return load_profile(out)


def ddp_rebuilt_buckets(rank, world_size, bucket_cap_mb):
    """The bucket of every parameter as DDP itself reports it after the rebuild."""
    workload = load_workload("mlp")
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=bucket_cap_mb)
    for _ in range(3):
        inputs, target = workload.make_batch(8)
        workload.loss(ddp(inputs), target).backward()
    data = ddp._get_ddp_logging_data()
    names = [name for name, _ in workload.model.named_parameters()]
    buckets = {}
    for index, members in enumerate(data["rebuilt_per_bucket_param_indices"].split(",")):
        for param_index in members.split():
            buckets[names[int(param_index)]] = index
    return buckets


def test_one_row_per_parameter_with_its_shape(mlp_profile):
    model = load_workload("mlp").model
    params = dict(model.named_parameters())
    tensors = mlp_profile.tensors
    assert sorted(tensors["name"]) == sorted(params)
    for row in tensors.itertuples():
        assert row.numel == params[row.name].numel()
        assert row.shape == "x".join(map(str, params[row.name].shape))
        assert row.bytes == 4 * row.numel and row.dtype == "float32"
    assert mlp_profile.fingerprint == fingerprint(model)


def test_ready_times_are_non_decreasing_in_ready_order(mlp_profile):
    ready = mlp_profile.tensors["ready_ms"]
    assert ready.is_monotonic_increasing
    assert (ready >= 0).all() and ready.iloc[-1] > 0
    # The output layer's gradients are ready first, the input layer's last.
    assert mlp_profile.tensors["name"].iloc[0].startswith("head.")
    assert mlp_profile.tensors["name"].iloc[-1].startswith("hidden.0.")


def test_bucket_membership_equals_what_ddp_used(mlp_profile):
    expected = run_ranks(ddp_rebuilt_buckets, 2, BUCKET_CAP_MB)[0]
    profiled = dict(zip(mlp_profile.tensors["name"], mlp_profile.tensors["bucket"]))
    assert profiled == expected
    assert len(set(expected.values())) > 1  # the cap really split the model


def test_every_collective_and_compressor_row_is_present_and_positive(mlp_profile):
    collectives = mlp_profile.collectives
    for collective in COLLECTIVES:
        for dtype in DTYPES:
            rows = collectives[(collectives.collective == collective) &
                               (collectives.dtype == dtype) & (collectives.group == "world")]
            assert len(rows) >= 3, (collective, dtype)
            assert (rows.time_ms > 0).all() and (rows.ranks == 2).all()
            assert rows.bytes.is_monotonic_increasing and rows.bytes.iloc[0] == 1024
    compressors = mlp_profile.compressors
    numels = mlp_profile.meta["sweep"]["numels"]
    for spec in default_specs():
        rows = compressors[compressors.spec == spec]
        assert list(rows.numel) == numels, spec
        assert (rows.encode_ms > 0).all() and (rows.decode_ms > 0).all(), spec
        assert (rows.payload_bytes > 0).all(), spec
        # the encode's part between the collectives: only compressors of several rounds
        assert (rows.advance_ms <= rows.encode_ms).all(), spec
        several = len(from_spec(spec).collectives_of_rounds()) > 1
        assert (rows.advance_ms > 0).all() if several else (rows.advance_ms == 0).all(), spec


def test_the_aggregation_of_gathered_payloads_is_swept(mlp_profile):
    """The executor's decode of a gathered exchange, for the one-round gatherable specs
    only, at every sweep size; it loads back and prices allgather decodes."""
    from bytecomp.costs.fits import fit_piecewise
    from bytecomp.costs.fitted import ComputeModel
    from bytecomp.profiler.sweeps import gathered_specs

    table = mlp_profile.aggregation
    numels = mlp_profile.meta["sweep"]["numels"]
    assert set(table.spec) == set(gathered_specs(default_specs())) != set(default_specs())
    for spec in set(table.spec):
        rows = table[table.spec == spec]
        assert list(rows.numel) == numels and (rows.one_ms > 0).all(), spec
        assert (rows.each_ms >= 0).all(), spec
    model = ComputeModel(mlp_profile)
    rows = table[table.spec == "int8"]  # fitted as decode is: monotone through the medians
    expected = fit_piecewise(rows.numel, rows.one_ms)(numels[-1]) + \
        3 * fit_piecewise(rows.numel, rows.each_ms)(numels[-1])
    assert model.aggregate_ms("int8", "cpu", numels[-1], 4) == pytest.approx(expected)


def test_an_older_profile_gets_the_aggregation_sweep_added(mlp_profile, tmp_path):
    """benchmarks/add_aggregation.py measures the sweep for a profile that predates it,
    on the profile's ranks and sizes, and writes a table that loads."""
    import shutil

    older = tmp_path / "older"
    shutil.copytree(mlp_profile.path, older)
    (older / "aggregation.csv").unlink()
    assert load_profile(older).aggregation.empty
    script = Path(__file__).parents[1] / "benchmarks" / "add_aggregation.py"
    result = subprocess.run([sys.executable, str(script), str(older), "--nproc", "2"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    added = load_profile(older).aggregation
    assert set(added.spec) == set(mlp_profile.aggregation.spec)
    assert set(added.numel) == set(mlp_profile.meta["sweep"]["numels"])
    for args, message in (([str(tmp_path / "nothing")], "does not exist"),
                          ([str(older), "--nproc", "1"], "taken on 2 ranks")):
        failed = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                                text=True, timeout=120)
        assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
        assert message in failed.stderr.strip().splitlines()[-1]


def test_cheap_collectives_get_more_samples_per_round():
    assert samples_per_round(0.3) == EXTRA_SAMPLES  # sub-millisecond: heavy-tailed times
    assert samples_per_round(0.9) == 2
    assert samples_per_round(5.0) == samples_per_round(1e4) == 1
    assert samples_per_round(0.0) == EXTRA_SAMPLES


def test_profile_yaml_describes_the_run(mlp_profile):
    meta = mlp_profile.meta
    assert (meta["world_size"], meta["nodes"], meta["ranks_per_node"]) == (2, 1, 2)
    assert meta["backend"] == "gloo" and meta["device"]["type"] == "cpu"
    assert meta["bucket_cap_mb"] == BUCKET_CAP_MB and meta["batch_size"] == 64
    assert meta["torch_version"] == str(torch.__version__)
    assert meta["compress_kernels"] == "torch"  # the compressors' path when timed (CPU)
    for name in ("forward", "backward", "optimizer", "iteration"):
        stats = meta["times"][name]
        assert 0 < stats["p10_ms"] <= stats["median_ms"] <= stats["p90_ms"]
    assert meta["machine"]["logical_cores"] >= 1


def test_the_executors_fixed_costs_are_measured_and_load(mlp_profile):
    """Measured with the real executor on the job's ranks: one figure per bucket and,
    per path, on the hook's thread and on the channel, beside what the model charges."""
    from bytecomp.costs.executor_costs import PATHS, ExecutorCosts

    executor = mlp_profile.meta["executor"]
    costs = ExecutorCosts.from_meta(executor)
    for path in PATHS:
        assert 0 <= costs.hook_ms[path] < 50 and 0 <= costs.tail_ms[path] < 50
        assert 0 <= executor["charged_compute_ms"][path] <= executor["charged_ms"][path] < 50
    assert 0 <= costs.bucket_ms < 50


def test_the_busy_calibration_model_computes_between_its_gradients():
    """On the CPU the calibration exchanges groups while the backward computes: each
    weight's gradient comes after the matrix products of the layers behind it, last
    layer first, and every weight gets one (DDP would otherwise wait for it)."""
    from bytecomp.profiler.overheads import NUMEL, TinyModel

    model = TinyModel(4, busy=True)
    order = []
    for index, weight in enumerate(model.weights):
        weight.register_post_accumulate_grad_hook(lambda p, i=index: order.append(i))
    model(torch.ones(NUMEL)).backward()
    assert order == [3, 2, 1, 0]
    assert all(w.grad is not None for w in model.weights)
    idle = TinyModel(4)
    assert not idle.busy and idle.mixing.numel() == 1  # no products when idle


def test_same_command_works_under_torchrun(tmp_path):
    out = tmp_path / "mlp"
    env = {**os.environ, "PYTHONPATH": FIXTURES}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), "-m", "bytecomp", "profile", "--model", "mlp",
         "--quick", "--probe-steps", "0", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    profile = load_profile(out)
    assert profile.world_size == 2 and profile.ranks_per_node == 2 and len(profile.tensors) == 10


def test_a_users_factory_is_profiled(cli, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(FIXTURES)  # the spawned ranks get this sys.path too
    result = cli("profile", "--model", "factories:tiny", "--nproc", "2", "--quick",
                 "--out", str(tmp_path / "tiny"), "--compressor", "topk:ratio=0.1",
                 "--probe-steps", "0")
    assert result.returncode == 0, result.stderr
    profile = load_profile(tmp_path / "tiny")
    assert list(profile.tensors["name"]) == ["2.bias", "2.weight", "0.bias", "0.weight"]
    assert set(profile.compressors["spec"]) == {"topk:ratio=0.1"}


# Errors found before any rank is spawned: the command runs in this process (``cli``).


def test_unknown_model_is_one_line(cli, tmp_path):
    assert_one_line_error(cli("profile", "--model", "alexnet", "--out", str(tmp_path / "x")),
                          "unknown model 'alexnet'", "mlp, cnn, transformer")


CWD_FACTORY = ("def factory():\n"
               "    raise RuntimeError('found in the current directory')\n")


def test_a_factory_in_the_current_directory_is_found(tmp_path, monkeypatch):
    """The console script's module path holds its own directory, not the current one:
    bytecomp looks there too (after the path), as ``python -m bytecomp`` does; a module
    found nowhere says where it was looked for and how to make it found."""
    from bytecomp.errors import BytecompError

    (tmp_path / "cwd_models").mkdir()
    (tmp_path / "cwd_models" / "__init__.py").write_text("")
    (tmp_path / "cwd_models" / "tiny.py").write_text(CWD_FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in ("cwd_models", "cwd_models.tiny"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(BytecompError, match="cwd_models.tiny:factory failed: RuntimeError: "
                                            "found in the current directory"):
        load_workload("cwd_models.tiny:factory")
    with pytest.raises(BytecompError) as raised:
        load_workload("cwd_nowhere.tiny:factory")
    assert "then in the current directory" in str(raised.value)
    assert "run from the directory that holds cwd_nowhere, or put that directory on " \
           "PYTHONPATH" in str(raised.value)


@pytest.mark.slow
def test_the_console_script_finds_a_factory_in_the_current_directory(tmp_path):
    """The same through the installed ``bytecomp`` command, run where the module is."""
    (tmp_path / "cwd_factory.py").write_text(CWD_FACTORY)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(Path(sys.executable).with_name("bytecomp")), "profile",
                           "--model", "cwd_factory:factory", "--out", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "cwd_factory:factory failed: RuntimeError: found in the current directory" in \
        done.stderr and "Traceback" not in done.stderr


def test_factory_that_fails_to_import_is_one_line(cli, monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)  # what PYTHONPATH does for a process
    assert_one_line_error(cli("profile", "--model", "no_such_module:factory"),
                          "cannot import model factory module 'no_such_module'")
    assert_one_line_error(cli("profile", "--model", "factories:broken"),
                          "factories:broken failed", "this factory is broken")
    assert_one_line_error(cli("profile", "--model", "factories:wrong_return"),
                          "must return a bytecomp.Recipe, (model, make_batch)")


def test_bad_nproc_and_existing_output_are_one_line(cli, tmp_path):
    assert_one_line_error(cli("profile", "--nproc", "0"), "--nproc must be from 1 to")
    (tmp_path / "taken").mkdir()
    assert_one_line_error(cli("profile", "--out", str(tmp_path / "taken")),
                          "already exists", "--force")


def test_a_failing_rank_stops_every_rank_without_a_hang(tmp_path):
    out = tmp_path / "failing"
    result = bytecomp("profile", "--model", "factories:fails_on_rank_one", "--nproc", "2",
                      "--quick", "--out", str(out), "--timeout", "60", timeout=90)
    # the stage lines (what it is doing) come first; the failure is one line, no traceback
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 1 failed" in errors[0] and \
        "deliberate failure on rank 1" in errors[0], result.stderr
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert not out.exists()
    assert not list(tmp_path.glob(".failing.*"))  # no partial output either



def interference_on_two_nodes_of_two(rank: int, world_size: int) -> dict:
    from bytecomp.comm.topology import Topology
    from bytecomp.profiler.iteration_times import TrainingSettings, measure_training

    topology = Topology.build(nodes=2, ranks_per_node=2)
    settings = TrainingSettings(batch_size=8, bucket_cap_mb=1.0, warmup=1, iterations=2)
    _, _, interference = measure_training(load_workload("mlp"), torch.device("cpu"), settings,
                                          intra_group=topology.intra)
    return interference


def test_interference_is_measured_over_the_world_and_inside_a_node():
    for interference in run_ranks(interference_on_two_nodes_of_two, 4):
        assert 0 <= interference["fraction"] <= 0.9
        assert 0 <= interference["intra_fraction"] <= 0.9
        assert interference["backward_alone_ms"] > 0
        # on the CPU: small allreduces timed beside an idle and a computing main thread
        assert interference["collective_alone_ms"] > 0
        assert interference["collective_busy_ms"] > 0
        assert interference["busy_collective_ms"] == pytest.approx(max(
            0.0, interference["collective_busy_ms"] - interference["collective_alone_ms"]),
            abs=1e-3)


def test_the_profile_summary_title_holds_no_path_to_wrap():
    """Piped (80 columns) a title wraps at the table's width: the path written goes on a
    line of its own (``wrote PATH``), and the title's words stay whole."""
    import io

    from rich.console import Console

    from bytecomp.profiler.runner import _summary

    profile = load_profile(str(Path(__file__).resolve().parents[1] / "profiles" / "cnn"))
    shown = io.StringIO()
    Console(file=shown, width=80).print(_summary(profile))
    text = shown.getvalue()
    title = f"profile of {profile.meta['model']['spec']} on {profile.world_size} ranks"
    assert " ".join(text.split()).startswith(title) and "->" not in text
