"""bytecomp.autotune on real gloo ranks: it measures, plans beside the job and hands over
at the same step on every rank; the saved plan loads with apply_plan; a model that cannot
gain keeps fp32 DDP and says so; a run resumed from a checkpoint continues bit for bit.
The settings' refusals, and the in-job planner on measurements alone."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.errors import BytecompError

from ranks import run_ranks

# Big matrices and little compute: on localhost, low rank pays for its encoding
GAINS = "mlp:inputs=1024,width=1024,depth=2"
NO_GAIN = "mlp:inputs=32,width=64,depth=2"  # latency-bound: nothing compresses a latency


def _batch(rank, step, inputs):
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(32, inputs, generator=generator), torch.randint(0, 10, (32,),
                                                                        generator=generator)


def _tuned(model, out, margin):
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    return ddp, bytecomp.autotune(ddp, measure_steps=20, share=0.5, plan_out=out,
                                  margin=margin)


def _steps(workload, ddp, tuner, optimizer, rank, steps, first=0, tie=False):
    """Train ``steps`` steps from step ``first``; each step reported to the trial as its
    level's fixed time, the higher levels faster (``tie``: all the same), so that the
    decisions depend on no clock. The phases seen."""
    inputs = next(workload.model.parameters()).shape[1]
    phases = []
    for step in range(first, first + steps):
        x, y = _batch(rank, step, inputs)
        workload.loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        phases.append(tuner.phase)
        tuner.report_step_ms(10.0 if tie else 10.0 - tuner.level)
    return phases


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _run(rank, world, spec, out, tie=False, margin=-1.0, steps=5000):
    """Train ``spec`` with one autotune line until the trial decided and some steps after,
    checkpointing in the trial and after it; then resume each checkpoint in a new DDP
    and tuner and train to the same step. Everything each rank saw. ``margin=-1``: the
    trial times every finalist, whatever the prediction (on localhost the predicted gaps
    are a few percent either way)."""
    from bytecomp.training.workloads import load_workload

    torch.manual_seed(0)
    workload = load_workload(spec)
    ddp, tuner = _tuned(workload.model, out, margin)
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.05)
    checkpoints, phases = {}, []
    while len(phases) < steps:
        phases += _steps(workload, ddp, tuner, optimizer, rank, 1, len(phases), tie)
        phase = phases[-1]
        if phase in ("trial", "watch") and phase not in checkpoints:
            saved = io.BytesIO()
            torch.save({"bytecomp": tuner.state_dict()}, saved)
            checkpoints[phase] = (len(phases), saved.getvalue(),
                                  copy.deepcopy(workload.model.state_dict()),
                                  copy.deepcopy(optimizer.state_dict()))
        if phase == "fp32" and len(phases) > phases.index("fp32") + 3:
            break
        if "watch" in checkpoints and len(phases) >= checkpoints["watch"][0] + 6:
            break
    final, log = _flat(workload.model), list(tuner.log)
    tuner.close()
    resumed = {}
    for phase, (at, saved, weights, optimizer_state) in checkpoints.items():
        workload.model.load_state_dict(weights)
        optimizer.load_state_dict(optimizer_state)
        ddp, tuner = _tuned(workload.model, None, margin)
        tuner.load_state_dict(torch.load(io.BytesIO(saved), weights_only=False)["bytecomp"])
        again = _steps(workload, ddp, tuner, optimizer, rank, len(phases) - at, at, tie)
        resumed[phase] = (torch.equal(_flat(workload.model), final), again == phases[at:],
                          tuner.phase)
        tuner.close()
    rank_figures = ("measuring cost", ": planned (")  # this rank's own clock
    return final, phases, [line for line in log if not any(f in line for f in rank_figures)], \
        resumed


def _apply_saved(rank, world, out, spec):
    from bytecomp.training.workloads import load_workload

    torch.manual_seed(0)
    workload = load_workload(spec)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=1)
    with bytecomp.apply_plan(ddp, out) as runner:
        x, y = _batch(rank, 0, next(workload.model.parameters()).shape[1])
        workload.loss(ddp(x), y).backward()
        return runner.stats.steps


@pytest.mark.multirank
@pytest.mark.slow
def test_every_rank_decides_the_same_resumes_bit_for_bit_and_the_plan_loads(tmp_path):
    out = tmp_path / "plan.yaml"
    runs = run_ranks(_run, 2, GAINS, str(out))
    (final, phases, log, resumed), (final_1, phases_1, log_1, resumed_1) = runs
    assert torch.equal(final, final_1) and phases == phases_1 and log == log_1
    assert phases[0] == "measure" and "trial" in phases and "watch" in phases, phases
    assert phases.index("plan") < phases.index("trial") < phases.index("watch")
    assert any("the trial keeps level" in line for line in log), log
    for phase in ("trial", "watch"):  # bit for bit, the same phases, on every rank
        assert resumed[phase][:2] == (True, True) and resumed_1[phase][:2] == (True, True)
    saved = bytecomp.load_plan(out)
    assert not saved.levels and saved.search["autotune"]["kept"]
    assert run_ranks(_apply_saved, 2, str(out), GAINS) == [1, 1]


@pytest.mark.multirank
@pytest.mark.slow
def test_a_model_that_cannot_gain_keeps_fp32_and_says_so(tmp_path):
    """Latency-bound, and every candidate measured as fast as fp32 DDP: whether the
    prediction already refuses them or the trial finds them tied, fp32 DDP stays."""
    out = tmp_path / "plan.yaml"
    (final, phases, log, _), (final_1, phases_1, _, _) = run_ranks(_run, 2, NO_GAIN,
                                                                   str(out), True)
    assert torch.equal(final, final_1) and phases == phases_1
    assert any("keeps fp32 DDP" in line or "(fp32 DDP)" in line for line in log), log
    plan = bytecomp.load_plan(out)
    assert not plan.levels and all(e.compressor is None and e.scheme == "allreduce"
                                   for e in plan.entries)
    record = plan.search["autotune"]
    assert record["reason"].startswith("keeps fp32 DDP") or record["kept"] == "fp32 DDP"


@pytest.mark.parametrize("setting, words", [
    ({"share": 0.0}, "share must be a number above 0"),
    ({"share": 0.9}, "share must be a number above 0"),
    ({"measure_steps": 0}, "measure_steps must be a whole number"),
    ({"measure_steps": 2.5}, "measure_steps must be a whole number"),
    ({"start": "int8"}, "start must be one of fp32, fp16"),
    ({"compressors": "topk"}, "compressors must be a list"),
    ({"min_fidelity": 1.5}, "min_fidelity must be a number"),
    ({"evaluations": True}, "evaluations must be a whole number"),
    ({"margin": -2.0}, "margin must be a number from -1 to 0.5"),
])
def test_its_settings_are_refused_in_one_line(setting, words):
    with pytest.raises(BytecompError, match=words):
        bytecomp.autotune(torch.nn.Linear(2, 2), **setting)


def test_it_takes_only_a_ddp_model():
    with pytest.raises(BytecompError, match="wrap it"):
        bytecomp.autotune(torch.nn.Linear(2, 2))


def _measurements(bandwidth_mb_per_ms, specs=("none", "fp16", "topk:ratio=0.01")):
    """What a job of two 1024 x 1024 layers would measure on a link of this bandwidth:
    the tensors, the collectives (latency + bytes / bandwidth), the compressors (a fixed
    cost + elements / rate) and their gains."""
    from bytecomp.compress import from_spec

    shapes = {"hidden.0.weight": [1024, 1024], "hidden.0.bias": [1024],
              "head.weight": [10, 1024], "head.bias": [10]}
    tensors = [{"name": n, "shape": s, "dtype": "float32", "element_size": 4,
                "ready_ms": 1.0 + i, "bucket": 0} for i, (n, s) in enumerate(
                    reversed(shapes.items()))]
    sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 22]
    collectives = [{"collective": c, "bytes": b, "time_ms": 0.05 + b / 1e6 / bandwidth_mb_per_ms,
                    "p10_ms": 0.05, "p90_ms": 0.05}
                   for c in ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast")
                   for b in sizes]
    compressors, fidelity = [], []
    for spec in specs:
        for name, shape in shapes.items():
            numel = 1
            for d in shape:
                numel *= d
            compressors.append({"spec": spec, "numel": numel, "encode_ms": 0.01 + numel / 1e6,
                                "decode_ms": 0.01 + numel / 1e7,
                                "payload_bytes": from_spec(spec).payload_bytes(numel)})
            if from_spec(spec).compresses:
                fidelity.append({"tensor": name, "spec": spec,
                                 "gain": 0.999 if spec == "fp16" else 0.8,
                                 "norm_share": 0.25})
    return {"format": 1, "model": {"name": "MLP", "fingerprint": "f" * 64},
            "device": "cpu", "device_name": "cpu", "backend": "gloo", "world_size": 2,
            "nodes": 1, "ranks_per_node": 2, "bucket_cap_mb": 25.0,
            "settings": {"min_fidelity": 0.75, "evaluations": 300, "margin": 0.03}, "steps": 30,
            "specs": list(specs), "left_out": [],
            "times": {"forward": 2.0, "backward": 4.0, "backward_compute": 4.0,
                      "optimizer": 0.5, "iteration": 7.0},
            "tensors": tensors, "collectives": collectives, "compressors": compressors,
            "fidelity": fidelity}


def test_the_in_job_planner_times_candidates_where_the_link_is_slow_and_keeps_fp32_where_fast():
    from bytecomp.search.in_job import plan_in_job

    slow = plan_in_job(_measurements(0.01))  # 10 MB/s: the 4 MB allreduce takes 400 ms
    assert slow.levels and slow.levels[0].setting == "fp32 DDP"
    assert slow.adaptive.trial == tuple(range(len(slow.levels))) and len(slow.levels) >= 2
    assert all(level.steps_factor >= 1.0 for level in slow.levels)
    assert slow.search["autotune"]["reason"].startswith("times")
    fast = plan_in_job(_measurements(1e4))  # 10 GB/s: nothing to win
    assert not fast.levels and fast.search["autotune"]["reason"].startswith("keeps fp32 DDP")


def test_the_in_job_planner_refuses_damaged_measurements_in_one_line(tmp_path):
    import json

    from bytecomp.search.in_job import main

    damaged = _measurements(0.01)
    del damaged["tensors"][0]["ready_ms"]
    (tmp_path / "measurements.json").write_text(json.dumps(damaged))
    assert main([str(tmp_path)]) == 1
    error = (tmp_path / "error.txt").read_text()
    assert error.count("\n") == 1 and "measurements are incomplete" in error


def _registered_by_hand(rank, world):
    """comm_hook(autotune=...) registered as a framework does: no DDP object given."""
    from bytecomp.training.workloads import load_workload

    torch.manual_seed(0)
    workload = load_workload(NO_GAIN)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=1)
    state, hook = bytecomp.comm_hook(autotune={"measure_steps": 20, "share": 0.5,
                                               "plan_out": None})
    ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.05)
    phases = _steps(workload, ddp, state, optimizer, rank, 30)
    with state:
        return phases, state.step, state.stats.steps


@pytest.mark.multirank
def test_comm_hook_autotune_measures_from_the_first_bucket():
    (phases, step, counted), other = run_ranks(_registered_by_hand, 2)
    assert phases == other[0] and step == 30 and counted == 30
    assert phases[0] == "measure"


def test_comm_hook_takes_a_plan_or_autotune_not_both(tmp_path):
    with pytest.raises(BytecompError, match="give no plan, fallback or native"):
        bytecomp.comm_hook("plan.yaml", autotune=True)
    with pytest.raises(BytecompError, match="share must be a number above 0"):
        bytecomp.comm_hook(autotune={"share": 2})
    with pytest.raises(BytecompError, match="no setting named 'sharee'"):
        bytecomp.comm_hook(autotune={"sharee": 0.1})
    with pytest.raises(BytecompError, match="give a plan"):
        bytecomp.comm_hook()


def _page_script() -> str:
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "autotune.md").read_text()
    marker = "<!-- run by tests/test_autotune.py::test_the_autotune_page_script_runs_on_two_ranks -->"
    block = page.split(marker, 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


@pytest.mark.multirank
@pytest.mark.slow
def test_the_autotune_page_script_runs_on_two_ranks(tmp_path):
    """docs/autotune.md's script, as written, under torchrun: it measures, plans, prints
    a line per phase on rank 0 and saves a plan apply_plan loads."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from bytecomp.launch import free_port

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "script.py").write_text(_page_script())
    environment = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "--master_port", str(free_port()), "script.py"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("bytecomp autotune:")]
    assert any("measured" in line for line in lines) and \
        any("planning beside the job" in line for line in lines), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    if any(": planned (" in line for line in lines):  # within the run (the machine's load)
        assert bytecomp.load_plan(tmp_path / "autotune-plan.yaml").search["autotune"]["reason"]
