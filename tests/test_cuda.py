"""The CUDA path, checked where a GPU is (``make gpu-check``): compressors on CUDA
tensors against the CPU, state moving between devices, apply_plan with device and
host placement, and the profiler on one GPU. Skipped, with the reason, elsewhere."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bytecomp.compress import default_specs, from_spec
from bytecomp.compress.local import encode, roundtrip
from bytecomp.profiler.fidelity import gain
from bytecomp.runtime.state import to_device

from ranks import run_ranks

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (make gpu-check runs these there)")]

# Results that do not depend on a random generator (CUDA's streams differ from the CPU's).
DETERMINISTIC = ("none", "fp16", "bf16", "int8", "topk", "threshold", "signsgd", "signum",
                 "efsignsgd", "onebit")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CUDA = torch.device("cuda")


def _tensors_of(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _tensors_of(v)]
    if isinstance(state, list):
        return [t for v in state for t in _tensors_of(v)]
    return []


def _assert_same_result(name: str, x: torch.Tensor, on_gpu: torch.Tensor,
                        on_cpu: torch.Tensor) -> None:
    """What a deterministic compressor transmits (error feedback on) is the same on both
    devices, up to what the devices may legitimately do differently: top-k keeps any of
    the elements tied at its k-th magnitude (16-bit gradients have many ties), and a
    quantizer's code can differ by one step where the scaled value lies within rounding
    of a half."""
    gpu, cpu = on_gpu.float(), on_cpu.float()
    tolerance = 1e-5 if x.dtype == torch.float32 else 2e-2
    if name == "topk":  # tied elements swap places (in the residuals too): same |values|
        assert int((gpu != 0).sum()) == int((cpu != 0).sum())
        assert torch.equal(gpu.abs().sort().values, cpu.abs().sort().values)
        return
    if name == "int8":
        step = float((cpu.max() - cpu.min()) / 255)  # of the compensated gradient
        differing = (gpu - cpu).abs() > tolerance
        assert float((gpu - cpu).abs().max()) <= step * 1.001 + tolerance
        assert int(differing.sum()) <= max(1, x.numel() // 1000)
        return
    assert torch.allclose(gpu, cpu, rtol=tolerance, atol=tolerance), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", default_specs())
def test_compressor_on_cuda_matches_the_cpu(spec, dtype):
    compressor = from_spec(spec)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 128, generator=generator).to(dtype)
    state_cpu = {"salt": 7, "shapes": [(256, 128)]}
    state_gpu = {"salt": 7, "shapes": [(256, 128)]}
    for _ in range(3):  # several steps: residuals, factors and counters carried
        on_cpu, sent_cpu = roundtrip(compressor, x.reshape(-1).clone(), state_cpu)
        on_gpu, sent_gpu = roundtrip(compressor, x.reshape(-1).to(CUDA), state_gpu)
        assert on_gpu.device.type == "cuda" and on_gpu.dtype == on_cpu.dtype
        assert on_gpu.shape == on_cpu.shape and bool(on_gpu.isfinite().all())
        if compressor.fixed_size:
            assert sent_gpu == sent_cpu  # the same payload sizes
        elif compressor.name == "dgc":  # at most k pass its sampled threshold
            bound = compressor.payload_bytes(x.numel(), x.element_size())
            assert max(sent_gpu, sent_cpu) <= bound, spec
        # (ExDyna's count follows a threshold started from a sample: it varies around
        # its target, differently with each device's draw)
        assert all(t.device.type == "cuda" for t in _tensors_of(state_gpu))
        if compressor.name in DETERMINISTIC:
            _assert_same_result(compressor.name, x.reshape(-1), on_gpu.cpu(), on_cpu)
        else:  # random draws differ between devices: what they keep must not
            assert gain(x.reshape(-1).float().to(CUDA), on_gpu.float()) == pytest.approx(
                gain(x.reshape(-1).float(), on_cpu.float()), abs=0.1), spec


@pytest.mark.parametrize("spec", default_specs())
def test_state_round_trips_between_devices(spec):
    """Moving the state to the CPU and back (a checkpoint) changes nothing."""
    compressor = from_spec(spec)
    x = torch.randn(64 * 96, device=CUDA)
    state = {"salt": 3, "shapes": [(64, 96)]}
    encode(compressor, x, state)
    moved = to_device(to_device(state, torch.device("cpu")), CUDA)
    first, _ = roundtrip(compressor, x * 0.5, state)
    second, _ = roundtrip(compressor, x * 0.5, moved)
    assert torch.equal(first, second), spec


def _train_on_cuda(rank, world, host_share: int):
    """A few steps of an MLP on CUDA tensors under a plan rotating compressors, schemes
    and placements over the tensors; the parameters, on the CPU."""
    from torch.nn.parallel import DistributedDataParallel

    import bytecomp
    from bytecomp.comm.schemes import supported_schemes
    from bytecomp.plan_file import plan_for_model
    from bytecomp.plan_types import Option
    from bytecomp.training.workloads import load_workload

    torch.manual_seed(0)
    workload = load_workload("mlp:inputs=32,width=64,depth=3")
    model = workload.model.to(CUDA)
    specs = ["fp16", "topk:ratio=0.1", "powersgd:rank=2", "int8", "efsignsgd"]
    names = [n for n, _ in model.named_parameters()]

    def choose(name, param):
        index = names.index(name)
        spec = specs[index % len(specs)]
        schemes = [s for s in supported_schemes(from_spec(spec)) if s != "hierarchical"]
        place = "host" if host_share and index % host_share == 0 else "device"
        return Option(spec, place, schemes[index % len(schemes)])

    plan = plan_for_model(model, choose, world, bucket_cap_mb=0.01)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(8):
        generator = torch.Generator().manual_seed(100 * rank + step)
        inputs = torch.randn(16, 32, generator=generator).to(CUDA)
        target = torch.randint(0, 10, (16,), generator=generator).to(CUDA)
        workload.loss(ddp(inputs), target).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    executor.close()
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("host_share", [0, 2])
def test_apply_plan_on_cuda_is_repeatable_and_agrees_across_ranks(world, host_share):
    """Device and host placement (pinned copies, the worker pool, copies back) on CUDA
    tensors; 2 ranks share one GPU over gloo. The same run twice gives the same
    parameters (no race between the executor's streams), on every rank."""
    first = run_ranks(_train_on_cuda, world, host_share)
    second = run_ranks(_train_on_cuda, world, host_share)
    assert all(torch.equal(first[0], other) for other in first + second)
    assert bool(first[0].isfinite().all())


def _train_and_save(path: str, host_share: int) -> None:
    torch.save(_train_on_cuda(0, 1, host_share), path)


@pytest.mark.parametrize("host_share", [0, 2])
def test_apply_plan_on_the_nccl_and_gloo_group_bytecomp_launches(tmp_path, host_share):
    """bytecomp's own CUDA jobs (profile, bench) run on one group with NCCL for CUDA
    tensors and gloo for CPU ones (an NCCL-only group refused the profiler's CPU
    tensors): the executor there (NCCL's in-kernel average, host payloads on gloo)
    trains as on gloo alone. One rank: NCCL cannot put two ranks on one GPU."""
    from bytecomp.launch import backend_for, spawn

    out = tmp_path / "parameters.pt"
    spawn(_train_and_save, (str(out), host_share), 1, backend_for("cuda"), 120)
    on_nccl = torch.load(out)
    on_gloo = run_ranks(_train_on_cuda, 1, host_share)[0]
    assert backend_for("cuda") == "cpu:gloo,cuda:nccl" and backend_for("cpu") == "gloo"
    assert torch.equal(on_nccl, on_gloo)


def test_the_profiler_on_one_gpu(tmp_path):
    out = tmp_path / "profile"
    result = subprocess.run([sys.executable, "-m", "bytecomp", "profile", "--model",
                             "transformer:layers=2,width=128,seq_len=64", "--nproc", "1",
                             "--device", "cuda", "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    from bytecomp.profiler import load_profile

    profile = load_profile(out)
    assert profile.device_type == "cuda"
    assert set(profile.copies.direction) >= {"d2h", "h2d", "d2d"}
    assert set(profile.compressors.device) == {"cuda", "cpu"}
    assert profile.has_fidelity
    assert (profile.tensors.ready_ms >= 0).all()


def test_an_adaptive_plan_on_cuda_takes_the_decisions_it_takes_on_the_cpu():
    """The controller on CUDA tensors (gains metered on the device, 2 ranks over gloo on one
    GPU): the same levels at the same steps as on the CPU, the same switches."""
    from test_adaptive import run_phases

    phases = [(15, True), (30, False), (45, True)]
    on_gpu = run_ranks(run_phases, 2, phases, {}, "cuda")
    on_cpu = run_ranks(run_phases, 2, phases, {}, "cpu")
    assert on_gpu[0][1], "no switch happened: the test shows nothing"
    assert all(run == on_gpu[0] for run in on_gpu)
    levels = [run[0] for run in on_gpu]
    switches = [[move[:3] for move in run[1]] for run in on_gpu]  # step, from, to
    assert levels == [run[0] for run in on_cpu]
    assert switches == [[move[:3] for move in run[1]] for run in on_cpu]
    for gpu, cpu in zip(on_gpu[0][1], on_cpu[0][1]):
        assert gpu[3] == pytest.approx(cpu[3], rel=1e-4)  # the gain at the switch


def test_an_adaptive_plan_on_cuda_resumes_bit_for_bit_across_a_switch(tmp_path):
    from test_adaptive import resume

    for equal, same_levels, same_switches, steps in run_ranks(resume, 2, str(tmp_path),
                                                              "cuda"):
        assert any(s <= 12 for s in steps) and any(s > 12 for s in steps), steps
        assert equal and same_levels and same_switches
