"""apply_plan on real gloo ranks: exactness, agreement, convergence, checkpoints, errors."""

from __future__ import annotations

import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import bytecomp  # noqa: E402
from bytecomp.comm.schemes import supported_schemes  # noqa: E402
from bytecomp.compress import default_specs, from_spec  # noqa: E402
from bytecomp.errors import BytecompError  # noqa: E402
from bytecomp.plan_file import plan_for_model
from bytecomp.plan_types import Option  # noqa: E402
from bytecomp.training.workloads import load_workload  # noqa: E402

from ranks import run_ranks  # noqa: E402

SMALL = "mlp:inputs=32,width=64,depth=2"


def batch(rank: int, step: int, inputs: int = 32):
    generator = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, inputs, generator=generator), torch.randint(0, 10, (8,),
                                                                       generator=generator)


def flat_parameters(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def sgd_step_side_by_side(runs, inputs, target) -> None:
    """One plain SGD step (lr 0.1) of each (workload, ddp) on the same batch."""
    for workload, ddp in runs:
        workload.loss(ddp(inputs), target).backward()
        for p in workload.model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
            p.grad = None


def parameters_agree(model) -> bool:
    flat = flat_parameters(model)
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], other) for other in everyone)


# -- fp32 plans are exact -----------------------------------------------------------------


def fp32_plan_gradients(rank, world, collective, nodes):
    """The worst gradient difference, through the hook and (for a flat allreduce plan)
    through DDP's own allreduce."""
    return max(fp32_plan_difference(rank, world, collective, nodes, native)
               for native in (False, True))


def fp32_plan_difference(rank, world, collective, nodes, native):
    reference = load_workload("mlp:width=256,depth=3")
    planned = load_workload("mlp:width=256,depth=3")
    ddp_reference = DistributedDataParallel(reference.model, bucket_cap_mb=1)
    ddp_planned = DistributedDataParallel(planned.model, bucket_cap_mb=1)
    plan = plan_for_model(planned.model, lambda n, p: Option("none", "device", collective), world,
                          nodes, bucket_cap_mb=1)
    executor = bytecomp.apply_plan(ddp_planned, plan, native=native)
    assert executor.native == (native and collective == "allreduce")
    worst = 0.0
    for step in range(3):
        inputs, target = batch(rank, step, 512)
        for workload, ddp in ((reference, ddp_reference), (planned, ddp_planned)):
            workload.loss(ddp(inputs), target).backward()
        for a, b in zip(reference.model.parameters(), planned.model.parameters()):
            assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), (step, a.shape)
            worst = max(worst, (a.grad - b.grad).abs().max().item())
            for p in (a, b):
                p.data.add_(p.grad, alpha=-0.1)
                p.grad = None
    assert executor.stats.steps == 3
    if executor.native:
        assert executor.stats.summary()["bytes_vs_fp32"] == pytest.approx(1.0)
    executor.close()
    return worst


@pytest.mark.multirank
@pytest.mark.parametrize("world,collective,nodes", [(2, "allreduce", 1), (4, "allreduce", 1),
                                                    (4, "hierarchical", 2)])
def test_fp32_plan_gives_ddp_default_gradients(world, collective, nodes):
    for worst in run_ranks(fp32_plan_gradients, world, collective, nodes):
        assert worst < 1e-5


def fp16_plan_against_the_fp16_hook(rank, world, native):
    """Parameters after 3 steps of an fp16-everywhere plan and of DDP with PyTorch's
    fp16_compress_hook (same weights and batches); native or not, bytes per step."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    reference = load_workload("mlp:width=256,depth=3")
    planned = load_workload("mlp:width=256,depth=3")
    ddp_reference = DistributedDataParallel(reference.model, bucket_cap_mb=1)
    ddp_reference.register_comm_hook(None, default_hooks.fp16_compress_hook)
    ddp_planned = DistributedDataParallel(planned.model, bucket_cap_mb=1)
    plan = plan_for_model(planned.model, lambda n, p: Option("fp16", "device", "allreduce"),
                          world, bucket_cap_mb=1)
    executor = bytecomp.apply_plan(ddp_planned, plan, native=native)
    for step in range(3):
        sgd_step_side_by_side(((reference, ddp_reference), (planned, ddp_planned)),
                              *batch(rank, step, 512))
    flat = [flat_parameters(w.model) for w in (reference, planned)]
    summary = executor.stats.summary()
    executor.close()
    return executor.native, flat[0], flat[1], summary["bytes_vs_fp32"], summary["steps"]


@pytest.mark.multirank
@pytest.mark.smoke
@pytest.mark.parametrize("native", [True, False])
def test_an_fp16_plan_is_pytorchs_fp16_hook(native):
    # fp16 on every tensor, allreduced: apply_plan registers PyTorch's own hook for it
    for is_native, hooked, planned, ratio, steps in run_ranks(
            fp16_plan_against_the_fp16_hook, 2, native):
        assert is_native == native and steps == 3 and ratio == pytest.approx(0.5)
        if native:
            assert torch.equal(hooked, planned)
        else:  # the executor's own fp16 exchange: the same up to fp16 rounding
            assert torch.allclose(hooked, planned, rtol=1e-3, atol=1e-4)


def powersgd_plan_against_the_powersgd_hook(rank, world, native, resume, cap=25.0):
    """Parameters after 5 steps of a plan that is PowerSGD rank 2 on the matrices
    PyTorch's powerSGD_hook compresses (fp32 on the rest) and of DDP with that hook
    (same weights and batches); with ``resume``, the plan's run is checkpointed after 3
    steps and resumed on a new DDP, the reference runs on uninterrupted. Native or not,
    bytes per step."""
    import io

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    from bytecomp.compress.lowrank import powersgd_compresses
    from bytecomp.plan_types import NO_COMPRESSION

    reference = load_workload("mlp:width=256,depth=3")
    planned = load_workload("mlp:width=256,depth=3")
    ddp_reference = DistributedDataParallel(reference.model, bucket_cap_mb=cap)
    state = powersgd.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                   min_compression_rate=2, random_seed=0)
    if cap >= 25.0:  # in several buckets the hook itself may abort (its rounds interleave)
        ddp_reference.register_comm_hook(state, powersgd.powerSGD_hook)
    ddp_planned = DistributedDataParallel(planned.model, bucket_cap_mb=cap)
    plan = plan_for_model(planned.model, lambda n, p: Option("powersgd:rank=2", "device",
                                                             "allreduce")
                          if powersgd_compresses(tuple(p.shape), 2) else NO_COMPRESSION,
                          world, bucket_cap_mb=cap)
    executor = bytecomp.apply_plan(ddp_planned, plan, native=native)
    is_native = executor.native
    ratio = None
    for step in range(5):
        if resume and step == 3:  # a checkpoint, then a new DDP and executor
            # (a new DDP hands over its first step's buckets as built before the rebuild,
            # its parameters in another order: the hook's memory follows them by name)
            saved = io.BytesIO()
            torch.save(executor.state_dict(), saved)
            ratio = executor.stats.summary()["bytes_vs_fp32"]
            executor.close()
            ddp_planned = DistributedDataParallel(planned.model, bucket_cap_mb=cap)
            executor = bytecomp.apply_plan(ddp_planned, plan, native=native)
            saved.seek(0)
            executor.load_state_dict(torch.load(saved, weights_only=True))
        sgd_step_side_by_side(((reference, ddp_reference), (planned, ddp_planned)),
                              *batch(rank, step, 512))
    flat = [flat_parameters(w.model) for w in (reference, planned)]
    summary = executor.stats.summary()
    executor.close()
    return is_native, flat[0], flat[1], ratio or summary["bytes_vs_fp32"]


@pytest.mark.multirank
@pytest.mark.parametrize("native,resume,cap", [(True, False, 25.0), (True, True, 25.0),
                                               (False, False, 25.0), (True, False, 1.0)])
def test_a_plan_that_is_pytorchs_powersgd_hook_runs_as_that_hook(native, resume, cap):
    """apply_plan registers PyTorch's powerSGD_hook for such a plan: the same parameters
    to the bit, also resumed from a checkpoint against the uninterrupted run;
    native=False runs bytecomp's own PowerSGD, and so does a DDP of several buckets (1 MB
    here: the hook's rounds could interleave)."""
    for is_native, hooked, planned, ratio in run_ranks(
            powersgd_plan_against_the_powersgd_hook, 2, native, resume, cap):
        assert is_native == (native and cap == 25.0)
        if cap < 25.0:
            continue  # (the reference ran without the hook)
        if native:
            assert torch.equal(hooked, planned)
            assert 0.01 < ratio < 0.2  # counted as the compressed steps send
        else:  # another implementation of the same method: close, not equal
            assert not torch.equal(hooked, planned)
            assert torch.allclose(hooked, planned, rtol=0.05, atol=0.05)


# -- every compressor keeps ranks identical ---------------------------------------------------


def train_every_compressor(rank, world, nodes):
    failures = []
    for spec in default_specs():
        if from_spec(spec).name == "none":
            continue
        workload = load_workload(SMALL)
        ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
        schemes = [s for s in supported_schemes(from_spec(spec))
                   if s != "hierarchical" or nodes > 1]
        names = [n for n, _ in workload.model.named_parameters()]

        def choose(name, param, schemes=schemes, names=names, spec=spec):
            index = names.index(name)  # rotate schemes and placements over the tensors
            return Option(spec, "host" if index % 3 == 2 else "device",
                          schemes[index % len(schemes)])

        plan = plan_for_model(workload.model, choose, world, nodes, bucket_cap_mb=0.01)
        executor = bytecomp.apply_plan(ddp, plan)
        optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.01)
        for step in range(20):
            inputs, target = batch(rank, step)
            workload.loss(ddp(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
        if not parameters_agree(workload.model):
            failures.append(f"{spec} ({', '.join(schemes)})")
        if executor.stats.steps != 20:
            failures.append(f"{spec}: counted {executor.stats.steps} steps")
        executor.close()
    return failures


@pytest.mark.multirank
@pytest.mark.parametrize("world,nodes", [(2, 1), (4, 2)])
def test_every_compressor_leaves_bit_identical_parameters_after_20_steps(world, nodes):
    for rank, failures in enumerate(run_ranks(train_every_compressor, world, nodes)):
        assert not failures, f"rank {rank}: parameters differ across ranks with " + \
            "; ".join(failures)


# -- convergence and checkpoints on the example task ------------------------------------------


def example_run(rank, world, plans, tmp):
    from train import TrainConfig, train

    results = {}
    for name, option in plans.items():
        model = load_workload(TrainConfig.model).model
        path = Path(tmp) / f"{name}.yaml"
        if rank == 0:
            plan_for_model(model, lambda n, p, o=option: o, world).save(path)
        dist.barrier()
        results[name] = train(TrainConfig(plan=str(path), log_every=0))["final_loss"]
    return results


@pytest.mark.multirank
def test_topk_with_error_feedback_reaches_the_fp32_loss(tmp_path):
    plans = {"fp32": Option("none"), "topk": Option("topk:ratio=0.01", "device", "allgather")}
    losses = run_ranks(example_run, 2, plans, str(tmp_path))[0]
    relative = abs(losses["topk"] - losses["fp32"]) / losses["fp32"]
    assert relative <= 0.05, (f"final loss (mean of the last 100 of 600 steps): top-k 1% with "
                              f"error feedback {losses['topk']:.4f}, fp32 {losses['fp32']:.4f}, "
                              f"{100 * relative:.1f}% apart (limit 5%)")


STATEFUL = ["powersgd:rank=2", "acpsgd:rank=2", "exdyna:density=0.05", "signum",
            "randomk:ratio=0.05", "topk:ratio=0.05", "qsgd:levels=16"]


def checkpoint_resume(rank, world, tmp):
    from train import TrainConfig, train

    model = load_workload(TrainConfig.model).model
    names = [n for n, _ in model.named_parameters()]

    def choose(name, param):
        spec = STATEFUL[names.index(name) % len(STATEFUL)]
        compressor = from_spec(spec)
        return Option(spec, "device", supported_schemes(compressor)[0])

    plan_path = Path(tmp) / "plan.yaml"
    if rank == 0:
        plan_for_model(model, choose, world, bucket_cap_mb=0.05).save(plan_path)
    dist.barrier()
    common = {"plan": str(plan_path), "steps": 20, "log_every": 0,
              "checkpoint": str(Path(tmp) / "ckpt.pt")}
    uninterrupted = train(TrainConfig(**common, checkpoint_every=10))["parameters"]
    resumed = train(TrainConfig(**common, resume=True))["parameters"]
    return torch.equal(uninterrupted, resumed), (uninterrupted - resumed).abs().max().item()


@pytest.mark.multirank
@pytest.mark.smoke
def test_resume_from_step_10_equals_the_uninterrupted_run(tmp_path):
    for equal, difference in run_ranks(checkpoint_resume, 2, str(tmp_path)):
        assert equal, f"parameters at step 20 differ by up to {difference}"


# -- mismatches fail on every rank ---------------------------------------------------------------


def mismatch(rank, world, case):
    workload = load_workload(SMALL)
    ddp = DistributedDataParallel(workload.model)
    spec = "topk:ratio=0.01"
    model, plan_world = workload.model, world
    if case == "ranks differ":
        spec = "topk:ratio=0.01" if rank == 0 else "topk:ratio=0.02"
    elif case == "another model":
        model = load_workload("mlp:inputs=32,width=64,depth=3").model
    elif case == "other shapes":
        model = load_workload("mlp:inputs=32,width=65,depth=2").model
    elif case == "another world size":
        plan_world = world * 2
    plan = plan_for_model(model, lambda n, p: Option(spec, "device", "allgather"), plan_world)
    started = time.monotonic()
    try:
        bytecomp.apply_plan(ddp, plan)
    except BytecompError as error:
        return str(error), time.monotonic() - started
    return None, time.monotonic() - started


@pytest.mark.parametrize("case,message", [
    ("ranks differ", "the plan differs between ranks"),
    ("another model", "the plan's tensor 'hidden.2.bias' is not in the model; prefixes tried"),
    ("other shapes", "the plan was made for another model (its fingerprint differs"),
    ("another world size", "the plan is for 4 ranks but this job has 2: plan again with "
                           "--cluster CONFIG for 2 ranks"),
])
@pytest.mark.multirank
def test_mismatched_plans_fail_clearly_on_every_rank(case, message):
    for rank, (error, seconds) in enumerate(run_ranks(mismatch, 2, case)):
        assert error is not None and message in error, (rank, error)
        assert seconds < 30


def unplanned_tensor(rank, world):
    workload = load_workload(SMALL)
    smaller = load_workload("mlp:inputs=32,width=64,depth=1").model  # lacks hidden.1
    plan = plan_for_model(smaller, lambda n, p: Option("none"), world)
    plan.entries = [e for e in plan.entries if e.name in dict(workload.model.named_parameters())]
    errors = []
    try:
        bytecomp.apply_plan(DistributedDataParallel(workload.model), plan)
    except BytecompError as error:
        errors.append(str(error))
    ddp = DistributedDataParallel(workload.model)
    executor = bytecomp.apply_plan(ddp, plan, fallback="fp32")
    inputs, target = batch(rank, 0)
    workload.loss(ddp(inputs), target).backward()
    executor.close()
    try:
        executor.load_state_dict({"format": 1, "plan_digest": "other", "step": 0, "ranks": []})
    except BytecompError as error:
        errors.append(str(error))
    return errors, parameters_agree(workload.model)


@pytest.mark.multirank
def test_unplanned_tensors_need_the_fp32_fallback():
    for errors, _ in run_ranks(unplanned_tensor, 2):
        assert "is not in the plan; prefixes tried: model none, plan none (pass " \
               'fallback="fp32"' in errors[0]
        assert "saved with another plan" in errors[1]


def _one_rank_steps(rank, world):
    """A single-rank job (one GPU, say) with compressing plans: one-collective exchanges
    complete at once, others run on the FIFO thread."""
    workload = load_workload(SMALL)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
    plan = plan_for_model(workload.model, lambda n, p: Option(
        "fp16" if "weight" in n else "topk:ratio=0.1", "device",
        "allreduce" if "weight" in n else "allgather"), world, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, plan)
    for step in range(3):
        inputs, target = batch(rank, step)
        workload.loss(ddp(inputs), target).backward()
        assert all(p.grad is not None and p.grad.isfinite().all()
                   for p in workload.model.parameters())
        ddp.zero_grad()
    executor.close()
    return executor.stats.steps


@pytest.mark.multirank
def test_a_one_rank_job_runs_a_compressing_plan():
    assert run_ranks(_one_rank_steps, 1) == [3]


def _threads() -> int:
    """This process's threads, Python's and C++'s (gloo's) alike."""
    return sum(1 for _ in Path("/proc/self/task").iterdir())


def _close_lets_go(rank, world, adaptive):
    """Threads before apply_plan and after close(), and what a step after close() says
    (an adaptive plan: its control group too, and the groups its moves lay residuals
    out on)."""
    from bytecomp.plan_file import ladder_for_model
    from bytecomp.plan_types import Adaptive

    workload = load_workload(SMALL)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)

    def topk(n, p):
        return Option("topk:ratio=0.1", "host" if "weight" in n else "device", "allgather")
    plan = ladder_for_model(workload.model, [lambda n, p: Option("fp16"), topk], world,
                            Adaptive("topk", timing="predicted"), bucket_cap_mb=0.01,
                            predicted_ms=[2.0, 1.0]) if adaptive else \
        plan_for_model(workload.model, topk, world, bucket_cap_mb=0.01)
    before = _threads()
    executor = bytecomp.apply_plan(ddp, plan)
    for step in range(3):
        inputs, target = batch(rank, step)
        workload.loss(ddp(inputs), target).backward()
    during = _threads()
    executor.close()
    after = _threads()
    try:
        inputs, target = batch(rank, 3)
        workload.loss(ddp(inputs), target).backward()
        message = ""
    except Exception as error:  # raised in DDP's hook, it reaches backward() as it is
        message = str(error)
    return before, during, after, message


@pytest.mark.multirank
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("adaptive", [False, True])
def test_close_frees_every_thread_and_group_it_made(adaptive):
    """A gloo group's threads outlive destroy_process_group while anything holds the group;
    one of them tidying up after a collective when the interpreter exits aborts the
    process (seen once in 30 runs of the README's snippet)."""
    for before, during, after, message in run_ranks(_close_lets_go, 2, adaptive):
        assert during > before  # its groups (a loop and two workers each) and pools
        assert after == before
        assert "this executor is closed" in message


def _close_while_a_callback_lingers(rank, world):
    """close() right after a step whose completion callback (on gloo's thread) has called
    done() but not yet returned, as when that thread is descheduled; then the rank goes on.
    Let go of first by that thread, the group it runs on was freed there and the thread
    joined itself: the process aborted ("Resource deadlock avoided", once in a CI run)."""
    import threading

    from bytecomp.comm.topology import _RETIRED
    from bytecomp.runtime import paths

    workload = load_workload(SMALL)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.01)
    plan = plan_for_model(workload.model, lambda n, p: Option("int8", "device", "allgather"),
                          world, bucket_cap_mb=0.01)
    executor = bytecomp.apply_plan(ddp, plan)
    lingering, closed = threading.Event(), threading.Event()
    finish = paths.DevicePath._finish

    def finish_then_linger(self, *args):
        finish(self, *args)
        if lingering.is_set():
            closed.wait(0.3)

    paths.DevicePath._finish = finish_then_linger
    try:
        for step in range(3):
            if step == 2:
                lingering.set()
            inputs, target = batch(rank, step)
            workload.loss(ddp(inputs), target).backward()
        executor.close()
        closed.set()
        time.sleep(0.3)  # the callbacks return, and let go of what they hold
    finally:
        paths.DevicePath._finish = finish
    return len(_RETIRED)


@pytest.mark.multirank
def test_close_outlasts_a_completion_callback_still_running():
    assert run_ranks(_close_while_a_callback_lingers, 2) == [0, 0]


# -- exchange without DDP buckets: bucket cap 0, one group per tensor ---------------------------


def _reference_of(spec, scheme, xs, states, nodes):
    """The single-process reference (tests/reference.py) of one tensor's exchange."""
    import reference

    compressor = from_spec(spec)
    per_node = len(xs) // nodes
    if scheme in reference.HIERARCHICAL:
        return reference.hierarchical(compressor, xs, states, nodes, per_node,
                                      reference.HIERARCHICAL[scheme])
    if scheme == "twolevel":
        return reference.two_level(compressor, xs, states, nodes, per_node)
    if scheme == "twoshot":
        return reference.two_shot(compressor, xs, states)
    return reference.flat(compressor, xs, states, scheme)


def per_tensor_plan_differences(rank, world, nodes, options):
    """Two steps of a plan made with bucket cap 0 on DDP built with bucket_cap_mb=0: every
    parameter is its own group and gets what the single-process reference of its scheme
    gives from every rank's own gradient of it; host groups run on the plan's host_workers
    threads. The worst relative difference per parameter."""
    from reference import HIERARCHICAL

    planned, local = load_workload(SMALL), load_workload(SMALL)
    local.model.load_state_dict(planned.model.state_dict())
    ddp = DistributedDataParallel(planned.model, bucket_cap_mb=0)
    names = [n for n, _ in planned.model.named_parameters()]
    choice = {name: options[i % len(options)] for i, name in enumerate(names)}
    plan = plan_for_model(planned.model, lambda n, p: choice[n], world, nodes, bucket_cap_mb=0)
    assert plan.bucket_cap_mb == 0 and len({e.group for e in plan.entries}) == len(names)
    plan = replace(plan, host_workers=3)  # a node's cores shared by its ranks, say
    executor = bytecomp.apply_plan(ddp, plan)
    assert executor.host_path is not None and executor.host_path.pool._max_workers == 3
    per_node = world // nodes

    def fresh(name):  # the executor's state of a group: a salt from its key (its name)
        return {"salt": zlib.crc32(name.encode())}

    states = {name: ([[fresh(name) for _ in range(per_node)] for _ in range(nodes)]
                     if choice[name].scheme in HIERARCHICAL
                     else [fresh(name) for _ in range(world)]) for name in names}
    worst = dict.fromkeys(names, 0.0)
    for step in range(2):
        inputs, target = batch(rank, step)
        local.loss(local.model(inputs), target).backward()
        planned.loss(ddp(inputs), target).backward()
        for (name, mine), param in zip(local.model.named_parameters(),
                                       planned.model.parameters()):
            everyone = [torch.empty_like(mine.grad).reshape(-1) for _ in range(world)]
            dist.all_gather(everyone, mine.grad.reshape(-1).contiguous())
            option = choice[name]
            want = _reference_of(option.spec, option.scheme, everyone, states[name], nodes)
            error = (param.grad.reshape(-1) - want).abs().max().item()
            worst[name] = max(worst[name], error / max(1e-6, want.abs().max().item()))
        with torch.no_grad():
            for param in planned.model.parameters():
                param.add_(param.grad, alpha=-0.1)
                param.grad = None
        local.model.load_state_dict(planned.model.state_dict())
        local.model.zero_grad()
    executor.close()
    return worst


@pytest.mark.parametrize("world,nodes,options", [
    (2, 1, [Option("topk:ratio=0.1", "device", "allgather"),
            Option("randomk:ratio=0.1", "device", "allreduce"),
            Option("qsgd:levels=16", "host", "twoshot")]),
    (4, 2, [Option("topk:ratio=0.1", "device", "twolevel"),
            Option("none", "device", "hierarchical-fp16"),
            Option("signsgd", "host", "hierarchical")]),
])
@pytest.mark.multirank
def test_one_bucket_per_tensor_equals_each_tensors_reference(world, nodes, options):
    for rank, worst in enumerate(run_ranks(per_tensor_plan_differences, world, nodes, options)):
        bad = {name: error for name, error in worst.items() if error > 2e-3}
        assert not bad, f"rank {rank}: relative differences from the reference {bad}"


def _group_times(rank, world):
    """Three steps recorded after two: int8 on the device (one collective, issued from the
    hook), PowerSGD staged on the FIFO thread, top-k on the host; one group per tensor."""
    workload = load_workload("mlp:inputs=16,width=32,depth=2")
    options = [Option("int8", "device", "allgather"), Option("powersgd:rank=2", "device",
                                                               "allreduce"),
               Option("topk:ratio=0.5", "host", "allgather")]
    names = [name for name, _ in workload.model.named_parameters()]
    plan = plan_for_model(workload.model, lambda n, p: options[names.index(n) % 3], world, 1,
                          bucket_cap_mb=0)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.001)
    with bytecomp.apply_plan(ddp, plan, native=False) as executor:
        with pytest.raises(BytecompError, match="whole number of steps"):
            executor.record_group_times(0)
        for step in range(5):
            if step == 2:
                recorder = executor.record_group_times(3)
            x, y = workload.make_batch(8)
            workload.loss(ddp(x), y).backward()
    return recorder.rows, len({entry.group for entry in plan.entries}), recorder.steps_left


@pytest.mark.multirank
def test_group_times_are_recorded_for_the_steps_asked_in_phase_order():
    for rows, groups, left in run_ranks(_group_times, 2):
        assert left == 0 and len(rows) == 3 * groups
        assert sorted({row["step"] for row in rows}) == [2, 3, 4]
        for row in rows:
            phases = [row[f"{phase}_ms"] for phase in ("launched", "encoded", "sent",
                                                       "received", "done")]
            assert phases == sorted(phases) and phases[0] >= 0, row
        assert all(row["done_ms"] > row["launched_ms"] for row in rows)


@pytest.mark.parametrize("words,seen", [
    ("[pair.cc:537] Read error [127.0.0.1]:15754: Connection reset by peer. This is typically "
     "caused by a remote worker hanging", ("closed its connection", None)),
    ("[pair.cc:553] Connection closed by peer [127.0.0.1]:28892", ("closed its connection", None)),
    ("Got the following error when running the callback: RuntimeError: [unbound_buffer.cc:78] "
     "Timed out waiting 5000ms for recv operation to complete",
     ("stopped responding", "timeout after 5 s")),
    ("NCCL watchdog: Timed out waiting 1800000ms for ALLREDUCE",
     ("stopped responding", "timeout after 1800 s")),
    ("something else", ("failed or stopped responding", "something else")),
])
def test_a_failed_collective_is_told_as_what_was_seen_of_the_peer(words, seen):
    from bytecomp.runtime.peers import Heartbeats, PeerFailure
    from bytecomp.runtime.peers import seen as seen_of

    assert seen_of(RuntimeError(words)) == seen
    failure = Heartbeats(None, 0, 2).explain(RuntimeError(words))  # no store: no rank named
    assert isinstance(failure, PeerFailure) and failure.ranks == [] and \
        str(failure).startswith(f"a peer {seen[0]} (") and "\n" not in str(failure)
