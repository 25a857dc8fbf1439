"""Faults while ranks run: a stuck peer, a killed parent, a stuck or killed rank, a peer
that never comes, a corrupted checkpoint. Nothing may hang, outlive its parent, or
blame the wrong rank."""

from __future__ import annotations

import datetime
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from refusal import one_line_error
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.comm.topology import Topology, job_timeout
from bytecomp.errors import BytecompError
from bytecomp.launch import RankFailed, spawn, threads_per_rank
from bytecomp.plan_file import ladder_for_model, plan_for_model
from bytecomp.plan_types import Adaptive, Option

from ranks import free_port, run_ranks

# every test here kills, stops or starves ranks: make test-all
pytestmark = pytest.mark.faults

FIXTURES = str(Path(__file__).parent / "fixtures")


def _tiny_plan(model, world: int):
    """fp16 allreduce on the weights (issued from the hook), top-k two-shot on the biases
    (the FIFO thread): both of the executor's paths and its own process groups."""
    def choose(name, param):
        return Option("fp16", "device", "allreduce") if name.endswith("weight") else \
            Option("topk:ratio=0.5", "device", "twoshot")
    return plan_for_model(model, choose, world, bucket_cap_mb=0.001)


def _step(ddp, optimizer) -> None:
    inputs = torch.randn(4, 32)
    ddp(inputs).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


# -- process groups inherit the job's timeout ---------------------------------------------------


def group_timeouts(rank, world):
    model = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    executor = bytecomp.apply_plan(ddp, _tiny_plan(model, world))
    topology = Topology.build(1, world)
    adaptive_model = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 4))
    adaptive = bytecomp.apply_plan(
        DistributedDataParallel(adaptive_model, bucket_cap_mb=0.001),
        ladder_for_model(adaptive_model, [lambda n, p: Option(), lambda n, p: Option(
            "topk:ratio=0.5", "device", "allgather")], world, Adaptive("topk"),
            bucket_cap_mb=0.001))

    def seconds(group) -> float:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    timeouts = {"job": job_timeout().total_seconds(), "topology": seconds(topology.world),
                "intra": seconds(topology.intra), "executor direct": seconds(
                    executor.device_path.direct), "executor FIFO": seconds(
                    executor.device_path.topology.world),
                "adaptive control": seconds(adaptive.adaptation.control)}
    executor.close()
    adaptive.close()
    return timeouts


def test_every_group_bytecomp_creates_has_the_jobs_timeout():
    for timeouts in run_ranks(group_timeouts, 2):  # the ranks' job: a 60 s timeout
        assert set(timeouts.values()) == {60.0}, timeouts


def test_bytecomp_creates_groups_only_through_the_one_that_sets_the_timeout():
    """``dist.new_group`` without a timeout waits 30 minutes: every call goes through
    bytecomp.comm.topology.new_group (an adaptive plan's control group did not)."""
    package = Path(bytecomp.__file__).parent
    calls = [f"{path.relative_to(package)}:{number}"
             for path in sorted(package.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "dist.new_group(" in line or "new_subgroups(" in line]
    assert len(calls) == 1 and calls[0].startswith("comm/topology.py:"), calls
    assert "return dist.new_group(ranks, backend=backend, timeout=job_timeout())" in \
        (package / "comm" / "topology.py").read_text().splitlines()[int(calls[0][17:]) - 1]


def _stuck_peer_rank(rank: int, world: int, port: int, timeout_s: float, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    executor = bytecomp.apply_plan(ddp, _tiny_plan(model, world))
    assert not executor.native
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # DDP rebuilds its buckets in the second step
        _step(ddp, optimizer)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # stuck until the test lets it go on
    started = time.monotonic()
    try:
        _step(ddp, optimizer)
        outcome = "finished"
    except Exception as error:
        outcome = f"{type(error).__name__}: {str(error)[:200]}"
    results.put((rank, outcome, time.monotonic() - started))
    results.close()
    results.join_thread()
    os._exit(0)


def test_a_stuck_peer_fails_apply_plans_step_within_the_timeout_on_every_rank():
    timeout_s = 3.0
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_stuck_peer_rank, args=(r, 2, port, timeout_s, results),
                             daemon=True) for r in range(2)]
    for process in ranks:
        process.start()
    try:
        reports = {}
        deadline = time.monotonic() + 60 + timeout_s + 10  # spawning takes its time
        while 0 not in reports and time.monotonic() < deadline:
            try:
                rank, outcome, seconds = results.get(timeout=0.5)
                reports[rank] = (outcome, seconds)
            except Exception:
                assert all(p.is_alive() for p in ranks) or 0 in reports, \
                    [p.exitcode for p in ranks]
        assert 0 in reports, "rank 0 still waits for its stuck peer"
        os.kill(ranks[1].pid, signal.SIGCONT)
        rank, outcome, seconds = results.get(timeout=timeout_s + 10)
        reports[rank] = (outcome, seconds)
    finally:
        for process in ranks:
            with_signal = process.pid is not None and process.is_alive()
            if with_signal:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.join(5)
    for rank, (outcome, seconds) in sorted(reports.items()):  # rank 1's clock: from SIGCONT
        assert outcome != "finished", f"rank {rank} finished a step without its peer"
        assert seconds <= timeout_s + 10, (rank, outcome, seconds)


# -- spawned ranks: killed parent, stuck rank, the rank to blame ------------------------------


def _children(pid: int) -> set[int]:
    children = set()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.add(int(stat_file.parent.name))
    return children


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_parent_leaves_no_rank_alive_and_no_output(tmp_path, sig):
    out = tmp_path / "profile"
    parent = subprocess.Popen(
        [sys.executable, "-m", "bytecomp", "profile", "--model", "mlp:inputs=32,width=32,depth=1",
         "--nproc", "2", "--quick", "--out", str(out)], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the ranks, not multiprocessing's helpers
            ranks = {c for c in _children(parent.pid) if b"spawn_main" in _cmdline(c)}
            if len(ranks) == 2:
                break
            time.sleep(0.2)
        assert len(ranks) == 2, "the ranks did not start"
        time.sleep(2)  # they are importing torch, or measuring
        parent.send_signal(sig)
        parent.wait(30)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks), "a rank outlived its parent"
        time.sleep(1)
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir()] == []
    finally:
        for pid in ranks | {parent.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait(5)


def _stuck_after_finishing(nodes, ranks_per_node) -> None:
    if dist.get_rank() == 1:  # finishes its work, then hangs on the way out
        dist.destroy_process_group = lambda *a, **k: time.sleep(600)


def _killed_on_rank_one(nodes, ranks_per_node) -> None:
    dist.barrier()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(50):
        dist.barrier()  # rank 0 only sees its peer go
        time.sleep(0.1)


def _stuck_on_rank_one(nodes, ranks_per_node) -> None:
    if dist.get_rank() == 1:
        time.sleep(600)


def _run_spawned(fn, timeout_s: float) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        spawn(fn_wrapper, (fn,), 2, "gloo", timeout_s)
    return str(failure.value), time.monotonic() - started


def fn_wrapper(fn) -> None:
    torch.set_num_threads(1)
    fn(1, 2)


def test_a_rank_stuck_after_the_others_finished_is_killed_after_the_timeout():
    message, seconds = _run_spawned(_stuck_after_finishing, timeout_s=2)
    assert message.startswith("rank 1 failed: was still running"), message
    assert seconds < 60, seconds


def test_the_rank_that_died_is_named_not_the_one_that_saw_it():
    message, _ = _run_spawned(_killed_on_rank_one, timeout_s=30)
    assert message.startswith("rank 1 failed: was killed by SIGKILL"), message


def test_a_stuck_rank_is_named_not_the_one_whose_collective_timed_out():
    message, seconds = _run_spawned(_stuck_on_rank_one, timeout_s=2)
    assert message.startswith("rank 1 failed: stopped responding (rank 0:"), message
    assert seconds < 60, seconds


def test_a_missing_peer_at_rendezvous_is_one_line(cli, tmp_path, monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    result = cli("profile", "--model", "mlp:inputs=8,width=8,depth=1", "--timeout", "2",
                 "--out", str(tmp_path / "p"))
    one_line_error(result, "cannot join the job as rank 0 of 2")
    assert time.monotonic() - started < 30
    assert not dist.is_initialized()


def test_a_parameter_without_gradient_is_one_line_saying_what_to_do(cli, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(FIXTURES)
    result = cli("profile", "--model", "factories:unused_parameter", "--nproc", "2", "--quick",
                 "--out", str(tmp_path / "p"), "--timeout", "30")
    one_line_error(result, "'b.weight' gets no gradient", "requires_grad=False")
    assert not (tmp_path / "p").exists()


# -- checkpoints -------------------------------------------------------------------------------


def corrupted_state(rank, world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    executor = bytecomp.apply_plan(ddp, _tiny_plan(model, world))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _step(ddp, optimizer)
    state = executor.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=True)  # tensors, numbers, lists, dicts only
    executor.load_state_dict(restored)
    outcomes = []
    for corrupt in ({**state, "ranks": state["ranks"][:1]},
                    {**state, "ranks": [state["ranks"][0], "garbage"]},
                    {**state, "step": -4},
                    {**state, "ranks": [{"g": {"residual": object()}}] * world}):
        try:
            executor.load_state_dict(corrupt)
            outcomes.append("loaded")
        except BytecompError as error:
            outcomes.append(str(error))
    executor.close()
    return outcomes


def test_a_corrupted_checkpoint_fails_alike_on_every_rank():
    first, second = run_ranks(corrupted_state, 2)
    assert first == second, (first, second)
    assert all(outcome.startswith("this executor state is corrupted") for outcome in first), first


def _record_threads(folder: str) -> None:
    Path(folder, os.environ["RANK"]).write_text(str(torch.get_num_threads()))


def test_spawned_ranks_share_the_cores(tmp_path):
    """Each spawned rank runs torch on its share of the cores, not on every core (two
    ranks of torch's default on two cores ran a notebook's training 30x slower while a
    third process held one core)."""
    spawn(_record_threads, (str(tmp_path),), 2, "gloo", 60)
    assert [int((tmp_path / str(rank)).read_text()) for rank in range(2)] == \
        [threads_per_rank(2)] * 2
    assert threads_per_rank(2) == max(1, (os.cpu_count() or 1) // 2)


# A dead or stopped peer under apply_plan, in the example training script: the hostile
# corpus's peer-fault class, tests/hostile/test_peer_faults.py
