"""Multi-rank tests of the collective schemes on real gloo process groups.

Every compressor on every scheme it supports, over several steps (so that
state such as warm-start factors, residuals and partitions is exercised), must
match the single-process reference of the same scheme and give every rank the
identical result.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from bytecomp.comm import Communicator, Topology, exchange, supported_schemes
from bytecomp.compress import default_specs, from_spec

import reference
from ranks import run_ranks

SPECS = default_specs() + [
    "topk:ratio=0.05,ef=false",
    "qsgd:levels=16",
    "powersgd:rank=2,warm_start=false",
    "powersgd:rank=3,orth=gs",
    "exdyna:density=0.1",
]
SIZES = [1, 37, 1000, 4099]
STEPS = 3
HALF_PAYLOADS = {"fp16": 2e-3, "bf16": 1.6e-2}


def make_input(rank: int, step: int, numel: int, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + 17 * rank + numel)
    return torch.randn(numel, generator=generator).to(dtype)


def tolerance(compressor, want: torch.Tensor) -> float:
    scale = want.abs().max().item() if want.numel() else 1.0
    return HALF_PAYLOADS.get(compressor.name, 2e-5) * 4 * max(scale, 1e-6)


def fresh_states(scheme, world, nodes, ranks_per_node):
    if scheme in reference.HIERARCHICAL:
        return [[{} for _ in range(ranks_per_node)] for _ in range(nodes)]
    return [{} for _ in range(world)]


def expected(compressor, scheme, xs, states, nodes, ranks_per_node):
    if scheme == "twoshot":
        return reference.two_shot(compressor, xs, states)
    if scheme in reference.HIERARCHICAL:
        return reference.hierarchical(compressor, xs, states, nodes, ranks_per_node,
                                      reference.HIERARCHICAL[scheme])
    if scheme == "twolevel":
        return reference.two_level(compressor, xs, states, nodes, ranks_per_node)
    return reference.flat(compressor, xs, states, scheme)


def check_all_schemes(rank, world, nodes, ranks_per_node):
    topology = Topology.build(nodes, ranks_per_node)
    failures, cases = [], 0
    for spec in SPECS:
        compressor = from_spec(spec)
        for scheme in supported_schemes(compressor):
            for numel in SIZES:
                state = {}
                states = fresh_states(scheme, world, nodes, ranks_per_node)
                for step in range(STEPS):
                    xs = [make_input(r, step, numel) for r in range(world)]
                    got = exchange(xs[rank].clone(), compressor, state, topology, scheme)
                    want = expected(compressor, scheme, xs, states, nodes, ranks_per_node)
                    cases += 1
                    where = f"{spec} on {scheme}, numel {numel}, step {step}"
                    if got.shape != xs[rank].shape or got.dtype != xs[rank].dtype:
                        failures.append(f"{where}: shape/dtype {got.shape} {got.dtype}")
                        continue
                    error = (got - want).abs().max().item() if numel else 0.0
                    if error > tolerance(compressor, want):
                        failures.append(f"{where}: differs from the reference by {error:.3g}")
                    everyone = [torch.empty_like(got) for _ in range(world)]
                    dist.all_gather(everyone, got)
                    if any(not torch.equal(other, everyone[0]) for other in everyone):
                        failures.append(f"{where}: ranks got different results")
    return cases, failures


def check_true_mean(rank, world):
    """fp32 / fp16 / bf16 allreduce equals the true mean within dtype tolerance."""
    topology = Topology.build(1, world)
    failures = []
    tolerances = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
    for spec in ("none", "fp16", "bf16"):
        compressor = from_spec(spec)
        for dtype, rtol in tolerances.items():
            rtol = max(rtol, tolerances.get(getattr(compressor, "target", dtype), rtol))
            xs = [make_input(r, 0, 5000, dtype) for r in range(world)]
            true_mean = torch.stack([x.double() for x in xs]).mean(0)
            got = exchange(xs[rank].clone(), compressor, {}, topology, "allreduce")
            error = (got.double() - true_mean).abs().max().item()
            bound = 4 * rtol * true_mean.abs().max().item()
            if got.dtype != dtype or error > bound:
                failures.append(f"{spec} with {dtype}: error {error:.3g} > {bound:.3g}")
    return failures


def check_async(rank, world):
    """Futures from the Communicator give what the synchronous schemes give."""
    communicator = Communicator(Topology.build(1, world))
    compressor = from_spec("topk:ratio=0.1")
    futures = [communicator.exchange(make_input(rank, i, 999), compressor, {}, "allgather")
               for i in range(5)]
    got = [future.wait() for future in futures]
    communicator.close()
    topology = Topology.build(1, world)
    want = [exchange(make_input(rank, i, 999), compressor, {}, topology, "allgather")
            for i in range(5)]
    return all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.multirank
@pytest.mark.parametrize("world,nodes,ranks_per_node", [(2, 2, 1), (4, 2, 2)])
def test_every_compressor_on_every_scheme_matches_reference(world, nodes, ranks_per_node):
    results = run_ranks(check_all_schemes, world, nodes, ranks_per_node)
    for rank, (cases, failures) in enumerate(results):
        assert cases > 500
        assert not failures, f"rank {rank}: {len(failures)} of {cases} cases failed:\n" + \
            "\n".join(failures[:20])


@pytest.mark.multirank
@pytest.mark.smoke
@pytest.mark.parametrize("world", [2, 4])
def test_uncompressed_and_half_allreduce_give_true_mean(world):
    for rank, failures in enumerate(run_ranks(check_true_mean, world)):
        assert not failures, f"rank {rank}: " + "; ".join(failures)


@pytest.mark.multirank
def test_communicator_futures_match_synchronous_exchange():
    assert all(run_ranks(check_async, 2))


def test_scheme_support_follows_capabilities():
    hierarchical = ["hierarchical", "hierarchical-fp16", "hierarchical-bf16"]
    assert supported_schemes(from_spec("powersgd")) == ["allreduce", *hierarchical]
    assert supported_schemes(from_spec("exdyna")) == ["allreduce", *hierarchical]
    assert supported_schemes(from_spec("topk")) == ["allgather", "twoshot", *hierarchical,
                                                    "twolevel"]
    assert supported_schemes(from_spec("fp16")) == ["allreduce", "allgather", "twoshot",
                                                    *hierarchical, "twolevel"]
