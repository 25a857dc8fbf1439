"""Extending bytecomp from outside it: a compressor and a collective scheme defined in this
test file, registered, then listed, planned, checked and run through apply_plan on 2
real gloo ranks, with no bytecomp file changed (docs/development.md walks through both).

The toys are registered for a test and removed after it (``registered``), in this
process and in the ranks, so that no other test plans with them."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.comm.exchanges import Exchange, peers_of
from bytecomp.comm.schemes import SCHEMES, Scheme, register_scheme, supported_schemes
from bytecomp.compress import COMPRESSORS, Compressor, from_spec, register
from bytecomp.compress.base import SOLO, Peers, meta_of
from bytecomp.costs.scheme_costs import ExchangeCost, SchemeCost
from bytecomp.plan_file import plan_for_model
from bytecomp.plan_types import Option
from bytecomp.testing import check_compressor
from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile

from ranks import run_ranks


class ToyFP8(Compressor):
    """A float8 (e4m3) cast with a per-tensor scale: 1 byte per element plus 4."""

    name = "toyfp8"
    summary = "float8 e4m3 cast, scaled to its largest magnitude"
    MAX = 448.0  # float8_e4m3fn's largest finite value

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return numel + 4

    def compress(self, x, state, peers: Peers = SOLO):
        xf = x.float()
        top = xf.abs().max().reshape(1) if x.numel() else xf.new_zeros(1)
        scale = torch.where(top > 0, top / self.MAX, torch.ones_like(top))
        codes = (xf / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        return [codes, scale], meta_of(x)

    def decompress(self, payload, ctx):
        codes, scale = payload
        return (codes.view(torch.float8_e4m3fn).float() * scale).to(ctx.dtype)


class ReduceBroadcastExchange(Exchange):
    """Every payload tensor summed onto rank 0 (reduce), then sent to every rank
    (broadcast), then divided: an allreduce in two collectives."""

    def __init__(self, x, compressor, state, group):
        super().__init__(x)
        self.compressor, self.state, self.group = compressor, state, group
        self.peers = peers_of(group)

    def encode(self):
        self.payload, self.ctx = self.compressor.compress(self.x.reshape(-1), self.state,
                                                          self.peers)

    def communicate(self):
        root = dist.get_global_rank(self.group, 0)
        for tensor in self.payload:
            self.sent_bytes += 2 * tensor.numel() * tensor.element_size()
            dist.reduce(tensor, root, group=self.group)
            dist.broadcast(tensor, root, group=self.group)
            tensor.div_(self.peers.size)

    def decode(self, out=None):
        mean = self.compressor.decompress(self.payload, self.ctx).reshape(self.x.shape)
        return mean if out is None else out.copy_(mean.reshape(out.shape))


class ReduceBroadcastCost(SchemeCost):
    """Priced as two broadcasts of the payload (a reduce is a broadcast backwards)."""

    def compressed(self, costs, scheme, compressor, spec, timing, numel, shapes, place):
        payload = sum(costs.round_payloads(spec, numel, shapes))
        channel = 2 * costs.collective_ms("broadcast", "world", compressor.wire_dtype, payload)
        return ExchangeCost(timing.encode(numel), channel, timing.decode(numel), payload,
                            collectives=2)


class ReduceBroadcast(Scheme):
    name = "reducebcast"
    label = "RB"
    summary = "reduce onto rank 0, then broadcast (summable single-round payloads)"
    pricing = ReduceBroadcastCost

    def supports(self, compressor):
        return compressor.summable and compressor.rounds == 1

    def exchange(self, x, compressor, state, topology):
        return ReduceBroadcastExchange(x, compressor, state, topology.world)


@contextlib.contextmanager
def registered():
    """ToyFP8 and ReduceBroadcast registered, for the block only."""
    register(ToyFP8)
    register_scheme(ReduceBroadcast)
    try:
        yield
    finally:
        COMPRESSORS.pop("toyfp8", None)
        SCHEMES.pop("reducebcast", None)


@pytest.fixture
def toys():
    with registered():
        yield


# -- the compressor ------------------------------------------------------------------------


def test_a_compressor_from_outside_passes_the_conformance_check(toys):
    check_compressor(ToyFP8)
    assert from_spec("toyfp8").spec == "toyfp8"
    assert "toyfp8" not in COMPRESSORS or ToyFP8 is COMPRESSORS["toyfp8"]


def test_the_conformance_check_fails_a_compressor_that_lies(toys):
    class Liar(ToyFP8):
        name = "toyliar"

        def payload_bytes(self, numel, element_size=4, shapes=None):
            return numel  # forgets the scale

    with pytest.raises(AssertionError, match="not registered"):
        check_compressor(Liar)
    register(Liar)
    try:
        with pytest.raises(AssertionError, match="declared"):
            check_compressor(Liar)
    finally:
        COMPRESSORS.pop("toyliar")


def test_a_compressor_from_outside_is_listed(toys, cli):
    listed = cli("compressors")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "toyfp8" in line)
    assert "AG" in row and "RB" not in row  # gatherable; not summable: no reduce-broadcast
    assert "RB reducebcast" in " ".join(listed.stdout.split())  # the legend


def test_a_compressor_from_outside_is_profiled_and_planned(toys):
    """A synthetic profile times it (a default speed and gain for a compressor it does not
    know) and the planner offers it on every scheme it supports; on a slow link with
    only it allowed, the plan compresses with it."""
    from bytecomp.search import Planner

    profile = synthetic_profile(mlp_shapes(3, 256), world_size=2, bandwidth_gbps=0.1,
                                device="cpu", fidelity=True)
    assert "toyfp8" in set(profile.compressors["spec"])
    planner = Planner(profile, None, ["toyfp8"], objective="time")
    offered = {o.label for o in planner.problem.options if o.compressed}
    assert {"toyfp8 allgather @device", "toyfp8 twoshot @device"} <= offered
    result = planner.search()
    used = {planner.problem.options[o].spec for o in result.assignment}
    assert "toyfp8" in used, result.composition()


# -- the scheme ----------------------------------------------------------------------------


def test_a_scheme_from_outside_is_offered_and_priced(toys):
    from bytecomp.search import Planner

    assert "reducebcast" in supported_schemes(from_spec("fp16"))
    assert "reducebcast" not in supported_schemes(from_spec("topk"))
    profile = synthetic_profile(mlp_shapes(3, 256), world_size=2, device="cpu")
    planner = Planner(profile, None, ["fp16"], objective="time")
    option = Option("fp16", "device", "reducebcast")
    assert option in planner.problem.options
    cost = planner.problem.costs.cost(option, 1 << 16)
    assert cost.collectives == 2 and cost.wire_bytes == 2 * (1 << 16)
    # on the FIFO thread, which decodes too (compute on the channel)
    assert cost.channel_ms - cost.compute_ms == pytest.approx(
        2 * planner.comm.time_ms("broadcast", "world", "float16", 2 * (1 << 16)))


# -- both through apply_plan on 2 ranks ----------------------------------------------------


def _toys_through_apply_plan(rank, world):
    """Three steps of a plan of toyfp8 (allgather) and randomk (reduce-broadcast) on an
    MLP: every gradient equals what the two ranks' gradients give by hand."""
    from bytecomp.training.workloads import load_workload

    with registered():
        workload, local = load_workload("mlp:inputs=32,width=64,depth=2"), \
            load_workload("mlp:inputs=32,width=64,depth=2")
        local.model.load_state_dict(workload.model.state_dict())
        ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0)
        names = [n for n, _ in workload.model.named_parameters()]
        toy = Option("toyfp8", "device", "allgather")
        summed = Option("randomk:ratio=0.5,ef=false", "device", "reducebcast")
        choice = {name: toy if i % 2 else summed for i, name in enumerate(names)}
        plan = plan_for_model(workload.model, lambda n, p: choice[n], world, bucket_cap_mb=0)
        executor = bytecomp.apply_plan(ddp, plan)
        worst = 0.0
        for step in range(3):
            generator = torch.Generator().manual_seed(10 * rank + step)
            inputs = torch.randn(8, 32, generator=generator)
            target = torch.randint(0, 10, (8,), generator=generator)
            workload.loss(ddp(inputs), target).backward()
            local.loss(local.model(inputs), target).backward()
            for (name, mine), param in zip(local.model.named_parameters(),
                                           workload.model.parameters()):
                everyone = [torch.empty_like(mine.grad).reshape(-1) for _ in range(world)]
                dist.all_gather(everyone, mine.grad.reshape(-1).contiguous())
                want = _by_hand(choice[name], everyone, executor.states.of(
                    executor.group_of[name].key, []), step, world)
                worst = max(worst, (param.grad.reshape(-1) - want).abs().max().item())
            for model in (workload.model, local.model):
                model.zero_grad()
        sent = executor.stats.summary()["bytes_vs_fp32"]
        executor.close()
        return worst, sent


def _by_hand(option, everyone, state, step, world):
    """The average of the ranks' gradients as the option exchanges it, computed here."""
    compressor = from_spec(option.spec)
    if option.scheme == "allgather":  # toyfp8: every rank's payload decompressed, averaged
        total = torch.zeros(everyone[0].numel())
        for r, grad in enumerate(everyone):
            payload, ctx = compressor.compress(grad, {}, Peers(r, world))
            total += compressor.decompress(payload, ctx).float()
        return total / world
    # random-k on the same indices on every rank (seeded by the group's salt and the step)
    fresh = {"salt": state["salt"], "step": step}
    payloads = []
    for r, grad in enumerate(everyone):
        payload, ctx = compressor.compress(grad, dict(fresh), Peers(r, world))
        payloads.append(payload)
    mean = [sum(parts[1:], parts[0].clone()).div_(world) for parts in zip(*payloads)]
    return compressor.decompress(mean, ctx)


@pytest.mark.multirank
@pytest.mark.smoke
def test_a_compressor_and_a_scheme_from_outside_run_through_apply_plan():
    for worst, sent in run_ranks(_toys_through_apply_plan, 2):
        assert worst == 0.0  # to the bit
        assert 0 < sent < 1  # float8: a quarter; random-k 1/2, reduced then broadcast: all


def test_registering_changes_nothing_for_the_rest(toys):
    """The built-in registry is intact around a test that adds to it."""
    assert "toyfp8" in COMPRESSORS
    assert replace(Option(), scheme="reducebcast").label == "fp32 reducebcast"
