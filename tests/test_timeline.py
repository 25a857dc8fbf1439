"""The timeline simulator, DDP's buckets, fits and cost formulas."""

from __future__ import annotations

import traceback

import numpy as np
import pytest
from torch.nn.parallel import DistributedDataParallel

from bytecomp.buckets import ddp_buckets
from bytecomp.compress import from_spec
from bytecomp.costs.clusters import Cluster, Link, load_cluster
from bytecomp.costs.fits import fit_linear, fit_piecewise
from bytecomp.costs.fitted import CommModel, ComputeModel, ring_ms
from bytecomp.costs.strategy import GroupCost, StrategyCosts
from bytecomp.plan_types import Option
from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile
from bytecomp.timeline.simulator import IterationModel, SimGroup, simulate
from bytecomp.training.workloads import load_workload

from ranks import run_ranks

# -- the simulator -----------------------------------------------------------------------


def test_communication_overlaps_the_backward_pass_in_fifo_order():
    model = IterationModel(10, 100, 5, [20, 50, 90])
    groups = [SimGroup(b, GroupCost(0, 30, 0)) for b in range(3)]
    result = simulate(model, groups, record=True)
    # bucket 0 at 20 -> channel 20-50; bucket 1 at 50 -> 50-80; bucket 2 at 90 -> 90-120
    assert result.channel == [(20, 50), (50, 80), (90, 120)]
    assert result.backward_end_ms == 100 and result.comm_end_ms == 120
    assert result.iteration_ms == 10 + 120 + 5


def test_the_gantt_chart_leaves_the_caller_s_matplotlib_backend_alone(tmp_path):
    """A notebook plotting inline keeps doing so after a Gantt chart is drawn."""
    import matplotlib

    from bytecomp.timeline.render import draw_gantt

    result = simulate(IterationModel(10, 100, 5, [20, 50, 90]),
                      [SimGroup(b, GroupCost(0, 30, 0)) for b in range(3)], record=True)
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        draw_gantt(result, tmp_path / "gantt.png", "three buckets")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "gantt.png").read_bytes().startswith(b"\x89PNG")


def test_a_device_encode_delays_every_later_gradient():
    model = IterationModel(0, 100, 0, [20, 50, 90])
    groups = [SimGroup(b, GroupCost(5, 10, 5)) for b in range(3)]
    result = simulate(model, groups, record=True)
    # encode 20-25, channel 25-35, decode 35-40: bucket 1 needs 30 more ms of backward,
    # which the decode interrupts: ready at 60; encode 60-65, channel 65-75, decode 75-80;
    # bucket 2 at 80 + 30 = 110: encode 110-115, channel 115-125, decode 125-130.
    assert [round(start, 9) for start, _ in result.channel] == [25, 65, 115]
    assert result.iteration_ms == pytest.approx(130)
    compute = sum(e.duration for e in result.events if e.resource == "compute")
    assert compute == pytest.approx(100 + 30)  # backward plus 3 x (encode + decode)


def test_the_channel_waits_for_an_earlier_slow_group():
    model = IterationModel(0, 10, 0, [1, 2])
    groups = [SimGroup(0, GroupCost(0, 50, 0)), SimGroup(1, GroupCost(0, 1, 0))]
    result = simulate(model, groups)
    assert result.channel == [(1, 51), (51, 52)]


def test_host_work_runs_beside_the_backward_pass_with_copies():
    model = IterationModel(0, 100, 0, [10], host_workers=1)
    cost = GroupCost(encode_ms=20, channel_ms=5, decode_ms=20, host=True, copy_in_ms=1,
                     copy_out_ms=1)
    result = simulate(model, [SimGroup(0, cost)], record=True)
    # copy 10-11, host encode 11-31, channel 31-36, host decode 36-56, copy 56-57;
    # the backward pass is never interrupted
    assert result.channel == [(31, 36)] and result.comm_end_ms == 57
    assert result.backward_end_ms == 100 and result.iteration_ms == 100
    assert {e.resource for e in result.events} >= {"host", "copy", "channel", "compute"}


def test_communication_slows_the_backward_pass_by_the_interference():
    model = IterationModel(0, 100, 0, [10], interference=0.5)
    result = simulate(model, [SimGroup(0, GroupCost(0, 40, 0))])
    # channel busy 10-50: 20 ms of backward work in those 40 ms; 70 left after 50
    assert result.backward_end_ms == pytest.approx(120)
    assert result.iteration_ms == pytest.approx(120)


def test_intra_node_traffic_slows_the_backward_pass_by_its_own_interference():
    model = IterationModel(0, 100, 0, [10], interference=0.1, intra_interference=0.5)
    # 40 ms on the channel, 20 of them intra-node: rate 1 - (0.1 * 0.5 + 0.5 * 0.5) = 0.7
    result = simulate(model, [SimGroup(0, GroupCost(0, 40, 0, intra_ms=20))])
    assert result.backward_end_ms == pytest.approx(10 + 40 + (100 - 10 - 0.7 * 40))
    flat = simulate(model, [SimGroup(0, GroupCost(0, 40, 0))])  # no intra-node part
    assert flat.backward_end_ms == pytest.approx(10 + 40 + (100 - 10 - 0.9 * 40))
    same = IterationModel(0, 100, 0, [10], interference=0.5)  # intra defaults to the same
    assert simulate(same, [SimGroup(0, GroupCost(0, 40, 0, intra_ms=20))]).backward_end_ms \
        == pytest.approx(120)


def test_single_pass_and_event_simulations_agree():
    """Random instances, with device and host groups, copies, a few host workers and
    the executor's fixed costs (per bucket, per group on the hook and on the channel),
    through the hook or not."""
    import random

    from bytecomp.timeline.events import EventSimulation
    from bytecomp.timeline.single_pass import simulate_single_pass

    generator = random.Random(7)

    def some(high: float) -> float:
        return generator.choice([0, generator.uniform(0, high)])

    hosted = 0
    for _ in range(3000):
        buckets = generator.randint(1, 6)
        ready = sorted(generator.uniform(0, 100) for _ in range(buckets))
        model = IterationModel(generator.uniform(0, 10), generator.uniform(ready[-1], 130),
                               generator.uniform(0, 5), ready,
                               host_workers=generator.randint(1, 4),
                               interference=generator.choice([0.0, 0.25, 0.6]),
                               intra_interference=generator.choice([None, 0.0, 0.5]),
                               through_hook=generator.random() < 0.7,
                               bucket_hook_ms=some(2),
                               shared_compute=generator.random() < 0.5,
                               busy_collective_ms=some(3))
        host_share = generator.choice([0.0, 0.5, 1.0])
        groups = []
        for bucket in range(buckets):
            for _ in range(generator.randint(0, 3)):
                channel = generator.uniform(0, 30)
                host = generator.random() < host_share
                intra = generator.choice([0.0, generator.uniform(0, channel)])
                groups.append(SimGroup(bucket, GroupCost(
                    some(10), channel, some(10), host=host,
                    copy_in_ms=some(5) if host else 0.0, copy_out_ms=some(5) if host else 0.0,
                    intra_ms=intra, hook_ms=some(2), tail_ms=some(2),
                    # up to all the rest of the channel: the backward then stops
                    compute_ms=generator.choice([0.0, channel - intra,
                                                 generator.uniform(0, channel - intra)]),
                    collectives=generator.randint(0, 3))))
        hosted += any(group.cost.host for group in groups)
        fast = simulate_single_pass(model, groups)
        events = EventSimulation(model, groups, False).run()
        case = (model, groups)
        assert fast.iteration_ms == pytest.approx(events.iteration_ms, abs=1e-9), case
        assert fast.backward_end_ms == pytest.approx(events.backward_end_ms, abs=1e-9), case
        flat = [t for interval in fast.channel for t in interval]
        assert flat == pytest.approx([t for interval in events.channel for t in interval],
                                     abs=1e-9), case
    assert hosted > 1000


def test_the_executor_fixed_costs_fall_on_the_hook_and_the_channel():
    """Bucket cost 1 and group hook 2 on the compute stream, tail 3 on the channel."""
    groups = [SimGroup(0, GroupCost(4, 10, 0, hook_ms=2, tail_ms=3)),
              SimGroup(0, GroupCost(0, 5, 0, hook_ms=2, tail_ms=3))]
    hooked = IterationModel(0, 100, 0, [20], bucket_hook_ms=1)
    result = simulate(hooked, groups, record=True)
    # bucket 20-21, hook 21-23, encode 23-27, channel 27-40; hook 27-29, channel 40-48
    assert result.channel == [pytest.approx((27, 40)), pytest.approx((40, 48))]
    assert result.backward_end_ms == pytest.approx(100 + 1 + 2 + 4 + 2)
    hooks = [e for e in result.events if e.op == "hook"]
    assert sum(e.duration for e in hooks) == pytest.approx(5)
    native = IterationModel(0, 100, 0, [20], bucket_hook_ms=1, through_hook=False)
    plain = simulate(native, groups)  # DDP's own allreduce: no fixed costs at all
    assert plain.channel == [pytest.approx((24, 34)), pytest.approx((34, 39))]
    host = GroupCost(5, 10, 0, host=True, hook_ms=2, tail_ms=3)
    late = simulate(hooked, [SimGroup(0, GroupCost(4, 1, 0, hook_ms=2)), SimGroup(0, host)])
    # the host group is handed over after the first group's hook and encode and its own
    # hook (20 + 1 + 2 + 4 + 2 = 29), encoded on a worker by 34
    assert late.channel[1] == pytest.approx((34, 47))


def test_a_cpu_jobs_channel_compute_stops_the_backward_pass():
    """A CPU job (shared_compute): the compute share of a group's channel time takes the
    backward pass's cores. Channel 20 ms at 10, half of it compute: the backward pass
    loses 10 ms; a GPU job's (or a channel without compute) loses nothing."""
    group = [SimGroup(0, GroupCost(0, 20, 0, compute_ms=10))]
    cpu = IterationModel(0, 100, 0, [10], shared_compute=True)
    for record in (True, False):
        assert simulate(cpu, group, record).backward_end_ms == pytest.approx(110)
    assert simulate(IterationModel(0, 100, 0, [10]), group).backward_end_ms == pytest.approx(100)
    whole = [SimGroup(0, GroupCost(0, 20, 0, compute_ms=20))]  # the backward stops for it
    for record in (True, False):
        assert simulate(cpu, whole, record).backward_end_ms == pytest.approx(120)


def test_collectives_launched_while_the_backward_computes_wait_longer():
    """busy_collective_ms per collective, for a group launched before the last bucket
    (the backward pass still computes); the last bucket's group pays nothing."""
    model = IterationModel(0, 100, 0, [10, 100], busy_collective_ms=2.0)
    groups = [SimGroup(0, GroupCost(0, 5, 0, collectives=2)),
              SimGroup(1, GroupCost(0, 5, 0, collectives=2))]
    for record in (True, False):
        result = simulate(model, groups, record)
        assert result.channel == [pytest.approx((10, 19)), pytest.approx((100, 105))]


def test_the_fifo_thread_decodes_on_the_channel():
    """PowerSGD (two rounds: the FIFO thread) decodes on the channel, a compute part of
    it; fp16 on one allreduce (issued from the hook) decodes on the compute stream."""
    costs = hand_costs()
    fifo = costs.cost(Option("powersgd:rank=4", "device", "allreduce"), N)
    direct = costs.cost(Option("fp16", "device", "allreduce"), N)
    assert fifo.decode_ms == 0.0 and fifo.compute_ms > 0 and fifo.collectives == 2
    assert direct.decode_ms > 0 and direct.compute_ms == 0.0 and direct.collectives == 1
    decode = costs.compute.decode_ms("powersgd:rank=4", "cpu", N)
    assert fifo.compute_ms == pytest.approx(decode)
    assert fifo.channel_ms == pytest.approx(costs.exchange_ms(
        "powersgd:rank=4", N, "world", ("allreduce", "allreduce")) + decode)


def test_a_multi_round_encodes_later_rounds_on_the_channel():
    """The profile's advance_ms (PowerSGD's orthogonalization and Q = M^T P, run by
    the executor between the two allreduces) is channel work that computes, not
    encode: one-stage and hierarchical; a one-round compressor has none; a profile
    from before the column keeps the whole encode on the compute stream."""
    old = hand_costs()
    profile = synthetic_profile(mlp_shapes(), world_size=2, device="cpu")
    two_rounds = profile.compressors["spec"].map(lambda spec: spec.startswith("powersgd"))
    profile.compressors["advance_ms"] = profile.compressors["encode_ms"].where(two_rounds, 0.0) * 0.6
    new = StrategyCosts(CommModel(profile, HAND), ComputeModel(profile), "cpu")
    for scheme, numel in (("allreduce", N), ("hierarchical", N // 16)):
        option = Option("powersgd:rank=4", "device", scheme)
        before, after = old.cost(option, N), new.cost(option, N)
        between = new.compute.advance_ms("powersgd:rank=4", "cpu", numel)
        assert between == pytest.approx(0.6 * new.compute.encode_ms("powersgd:rank=4", "cpu",
                                                                     numel), rel=1e-3)
        assert after.encode_ms == pytest.approx(before.encode_ms - between)
        assert after.channel_ms == pytest.approx(before.channel_ms + between)
        assert after.compute_ms == pytest.approx(before.compute_ms + between)
    topk = Option("topk:ratio=0.01", "device", "allgather")
    assert new.cost(topk, N) == old.cost(topk, N)
    assert old.compute.advance_ms("powersgd:rank=4", "cpu", N) == 0.0


def test_buckets_launch_in_index_order():
    model = IterationModel(0, 100, 0, [30, 10])  # a later bucket cannot go first
    result = simulate(model, [SimGroup(0, GroupCost(0, 1, 0)), SimGroup(1, GroupCost(0, 1, 0))])
    assert result.channel == [(30, 31), (31, 32)]


# -- DDP's buckets -------------------------------------------------------------------------


def test_bucketing_rule_closes_a_bucket_at_the_limit():
    mib = 1 << 20
    assert ddp_buckets([mib, mib, 3 * mib, mib], bucket_cap_mb=2) == [[0, 1], [2], [3]]
    assert ddp_buckets([mib // 2] * 5, bucket_cap_mb=None) == [[0, 1], [2, 3, 4]]
    assert ddp_buckets([4, 4], ["float32", "float16"], bucket_cap_mb=25) == [[0], [1]]


DDP_SPECS = ["mlp", "cnn", "transformer:layers=2", "lstm:width=256"]
DDP_CAPS = [None, 1, 5, 0]  # 0: one bucket per tensor


def ddp_truth(rank, world, specs, caps):
    """For each spec: what ``spec_truth`` gives, or the traceback of its failure."""
    out = {}
    for spec in specs:
        try:
            out[spec] = spec_truth(spec, caps)
        except Exception:
            out[spec] = traceback.format_exc()
    return out


def spec_truth(spec, caps):
    """For each cap: the parameters' ready order in iteration 0 and DDP's rebuilt buckets."""
    out = []
    for cap in caps:
        workload = load_workload(spec)
        model = workload.model
        order = []
        handles = [p.register_post_accumulate_grad_hook(lambda p, n=n, seen=order: seen.append(n))
                   for n, p in model.named_parameters()]
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        inputs, target = workload.make_batch(2)
        for iteration in range(3):  # rebuilt at the second forward, logged after
            workload.loss(ddp(inputs), target).backward()
            if iteration == 0:
                ready_order = list(order)
        for handle in handles:
            handle.remove()
        names = [n for n, _ in model.named_parameters()]
        params = dict(model.named_parameters())
        rebuilt = [[names[int(i)] for i in bucket.split()] for bucket in
                   ddp._get_ddp_logging_data()["rebuilt_per_bucket_param_indices"].split(",")]
        sizes = [params[n].numel() * params[n].element_size() for n in ready_order]
        out.append((ready_order, sizes, rebuilt))
    return out


@pytest.fixture(scope="module")
def real_ddp_buckets():
    """Every spec's truth from one spawned rank: a spawn costs seconds, a spec less."""
    return run_ranks(ddp_truth, 1, DDP_SPECS, DDP_CAPS)[0]


@pytest.mark.multirank
@pytest.mark.parametrize("spec", DDP_SPECS)
def test_simulated_buckets_equal_real_ddp_buckets(real_ddp_buckets, spec):
    truth = real_ddp_buckets[spec]
    if isinstance(truth, str):
        pytest.fail(f"real DDP on {spec} failed:\n{truth}")
    for cap, (order, sizes, rebuilt) in zip(DDP_CAPS, truth):
        simulated = [[order[i] for i in bucket] for bucket in ddp_buckets(sizes,
                                                                           bucket_cap_mb=cap)]
        assert simulated == rebuilt, (spec, cap)


# -- fits and formulas ------------------------------------------------------------------------


def test_linear_fit_recovers_exact_coefficients_and_reports_quality():
    sizes = [1e3, 1e4, 1e5, 1e6]
    fit = fit_linear(sizes, [0.2 + 3e-6 * s for s in sizes])
    assert fit.intercept == pytest.approx(0.2) and fit.slope == pytest.approx(3e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.worst_relative_error < 1e-9
    noisy = fit_linear(sizes, [1.0, 0.5, 2.0, 5.0])
    assert noisy.intercept >= 0 and noisy.slope >= 0 and noisy.r2 < 1


def test_linear_fit_reads_the_fixed_cost_of_a_noisy_sweep_as_a_median():
    """The fp32 allreduce sweep of the digits profile at 1 Gbit/s (2 x 1 emulated, medians
    in ms): the three smallest sizes read 0.50, 0.40 and 1.55 ms. A line through them
    has a negative intercept (clipped to 0: small allreduces free, and a plan of one
    allreduce per tensor predicted at a quarter of its time); the fit takes the median
    of the small sizes' times less their bandwidth cost."""
    sizes = [1024 * 2**i for i in range(15)]
    times = [0.5018, 0.4045, 1.5529, 0.421, 2.2372, 1.6168, 2.9634, 1.0915, 1.8132, 3.9264,
             8.3593, 17.1819, 34.5132, 70.6495, 141.1383]
    fit = fit_linear(sizes, times)
    small = np.array(times[:5]) - fit.slope * np.array(sizes[:5])
    assert fit.intercept == pytest.approx(np.median(small))
    assert 0.4 < fit.intercept < 0.6
    assert fit.slope * 2**20 == pytest.approx(8.8, rel=0.02)  # ms per MiB: the link's rate
    one_outlier = fit_linear(sizes[:6], [0.3, 0.3, 9.0, 0.3, 0.3, 0.4])
    assert one_outlier.intercept < 0.31


def test_piecewise_fit_passes_through_a_monotone_sweep_and_follows_superlinear_cost():
    """The top-k encode sweep of the emulated cnn profile (ns per element: 14 at 64K,
    16 at 1M, 34 at 16M): the piecewise curve passes through every point, is exact for
    a power law between two sizes, extrapolates with the last segment's slope, and
    stays flat below the smallest size."""
    sizes = [256, 4096, 65536, 1048576, 16777216]
    times = [0.091, 0.095, 0.949, 16.92, 566.5]
    fit = fit_piecewise(sizes, times)
    for size, measured in zip(sizes, times):
        assert fit(size) == pytest.approx(measured)
    assert fit.worst_relative_error == pytest.approx(0.0, abs=1e-12) and fit.r2 == 1.0
    power = fit_piecewise([1e3, 1e5], [1.0, 1.0 * 100 ** 1.3])
    assert power(1e4) == pytest.approx(10 ** 1.3)
    assert fit(64 * 1048576) == pytest.approx(566.5 + fit.slope * 48 * 1048576)
    assert fit.slope == pytest.approx((566.5 - 16.92) / (16777216 - 1048576))
    assert fit(10) == fit(256) == pytest.approx(0.091)


@pytest.mark.parametrize("seed", range(20))
def test_piecewise_fit_is_monotone_on_noisy_sweeps(seed):
    random = np.random.default_rng(seed)
    sizes = np.repeat([256, 4096, 65536, 1048576, 16777216], 2)
    times = np.abs(1e-5 * sizes * random.lognormal(0, 0.8, sizes.size)) + random.random()
    fit = fit_piecewise(sizes, times)
    grid = np.geomspace(1, 1e8, 400)
    values = [fit(x) for x in grid]
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
    assert min(values) >= 0 and fit.points == sizes.size


def test_piecewise_fit_is_not_set_by_its_largest_size_alone():
    """The encode sweep of the emulated 2 x 2 cnn profile (powersgd:rank=4): 16M elements
    cost 2.4x per element what 1M did. The alpha-beta rule (slope from the largest
    sizes) over-predicts 1M by 2.5x; the piecewise curve passes through 64K and 1M."""
    sizes = [256, 4096, 65536, 1048576, 16777216]
    times = [0.169, 0.097, 0.615, 9.215, 371.617]
    alpha_beta, piecewise = fit_linear(sizes, times), fit_piecewise(sizes, times)
    assert alpha_beta(1048576) > 2.4 * 9.215
    for size, measured in list(zip(sizes, times))[2:]:
        assert piecewise(size) == pytest.approx(measured)
    assert piecewise(256) == piecewise(4096) == pytest.approx((0.169 + 0.097) / 2)


def test_ring_formulas():
    assert ring_ms("allreduce", 4, 1000, 0.1, 0.01) == pytest.approx(2 * 3 * 0.1 + 1.5 * 1000 * 0.01)
    assert ring_ms("allgather", 4, 1000, 0.1, 0.01) == pytest.approx(0.3 + 0.75 * 10)
    assert ring_ms("allreduce", 1, 1000, 0.1, 0.01) == 0


def test_profile_links_extrapolate_the_fitted_costs():
    profile = synthetic_profile(mlp_shapes(), world_size=8, nodes=2, latency_us=40,
                                bandwidth_gbps=8)
    fitted = CommModel(profile, Cluster("profiled", 2, 4))
    extrapolated = CommModel(profile, Cluster("same shape", 2, 4, "profile", "profile"))
    for nbytes in (1 << 16, 1 << 24):
        assert extrapolated.time_ms("allreduce", "inter", "float32", nbytes) == \
            pytest.approx(fitted.time_ms("allreduce", "inter", "float32", nbytes), rel=0.05)
    bigger = CommModel(profile, Cluster("bigger", 8, 4, "profile", "profile"))
    assert bigger.time_ms("allreduce", "world", "float32", 1 << 24) > \
        fitted.time_ms("allreduce", "world", "float32", 1 << 24)


def test_shipped_cluster_configs_load():
    for name in ("gbe1", "gbe10", "v100-nvlink-100g", "v100-pcie-25g", "a100-ib200"):
        cluster = load_cluster(name)
        assert cluster.world_size >= 8
        assert cluster.inter.bandwidth_gbps > 0


# -- the exchange options of large clusters, hand-computed ---------------------------------

HAND = Cluster("hand", 2, 16, Link(10.0, 80.0, "pcie"), Link(20.0, 10.0))
N = 1 << 20  # the tensor, and its chunk N / 16 = 65536: both sweep sizes, where the
# piecewise compression curves are the synthetic profile's a + n / rate exactly


def hand_costs():
    """A CPU (gloo) profile planned for HAND: the ring formulas with its links."""
    profile = synthetic_profile(mlp_shapes(), world_size=2, device="cpu")
    return StrategyCosts(CommModel(profile, HAND), ComputeModel(profile), "cpu")


def ring(collective, ranks, nbytes, link, share=1):
    return ring_ms(collective, ranks, nbytes, link.alpha_ms, link.beta_ms_per_byte * share)


def test_hierarchical_fp16_runs_the_intra_node_stages_in_16_bits():
    costs = hand_costs()
    intra, inter = HAND.intra, HAND.inter
    cast = lambda n: 0.01 + n / 2e8  # noqa: E731  (fp16's synthetic encode and decode)
    chunk = N // 16
    expected = (ring("reduce_scatter", 16, 2 * N, intra) + ring("allgather", 16, 2 * N, intra)
                + ring("allreduce", 2, 4 * chunk, inter, share=16)
                + cast(N) + cast(chunk) + cast(chunk) + cast(N))
    cost = costs.cost(Option("none", "device", "hierarchical-fp16"), N)
    assert cost.channel_ms == pytest.approx(expected)
    assert cost.intra_ms == pytest.approx(ring("reduce_scatter", 16, 2 * N, intra)
                                          + ring("allgather", 16, 2 * N, intra))
    fp32 = costs.cost(Option("none", "device", "hierarchical"), N)
    assert fp32.channel_ms == pytest.approx(ring("reduce_scatter", 16, 4 * N, intra)
                                            + ring("allgather", 16, 4 * N, intra)
                                            + ring("allreduce", 2, 4 * chunk, inter, share=16))


def test_two_level_cost_and_timeline():
    """top-k 1% on the two-level scheme: 16 chunks encoded on the compute stream; on the
    channel an intra-node alltoall, 16 decodes to average, the inter-node allgather of
    this rank's chunk (encode, collective, 2 decodes), a re-encode and an intra-node
    allgather; 16 decodes, also on the channel (the FIFO thread decodes a group before
    it takes the next). Every step on the channel but the collectives computes."""
    costs = hand_costs()
    intra, inter = HAND.intra, HAND.inter
    encode = lambda n: 0.08 + n / 1e7  # noqa: E731  (top-k's synthetic curves)
    decode = lambda n: 0.03 + n / 1e8  # noqa: E731
    chunk = N // 16
    payload = from_spec("topk:ratio=0.01").payload_bytes(chunk)
    assert from_spec("topk:ratio=0.01").fixed_size
    channel = (ring("alltoall", 16, 16 * payload, intra) + 16 * decode(chunk) + encode(chunk)
               + ring("allgather", 2, 2 * payload, inter, share=16) + 2 * decode(chunk)
               + encode(chunk) + ring("allgather", 16, 16 * payload, intra))
    cost = costs.cost(Option("topk:ratio=0.01", "device", "twolevel"), N)
    assert cost.encode_ms == pytest.approx(16 * encode(chunk))
    assert cost.decode_ms == 0.0
    assert cost.channel_ms == pytest.approx(channel + 16 * decode(chunk))
    assert cost.compute_ms == pytest.approx(16 * decode(chunk) + encode(chunk) + 2 * decode(chunk)
                                            + encode(chunk) + 16 * decode(chunk))
    assert cost.collectives == 3  # fixed sizes: alltoall, inter allgather, intra allgather
    # one bucket ready at 100 ms: encode on the compute stream, then the channel
    model = IterationModel(10, 100, 5, [100])
    result = simulate(model, [SimGroup(0, cost)], record=True)
    assert result.iteration_ms == pytest.approx(10 + 100 + 16 * encode(chunk) + channel
                                                + 16 * decode(chunk) + 5)
    assert simulate(model, [SimGroup(0, cost)]).iteration_ms == \
        pytest.approx(result.iteration_ms)


def test_host_work_shares_a_nodes_cores_among_its_ranks():
    """Host offload per node: 8 ranks a node with 16 cores give each rank 2 workers (32
    cores: 4). Three host groups ready at 10 ms, each: copy 1, encode 20, channel 5,
    decode 20, copy back 1, computed by hand for both pools."""
    from dataclasses import replace

    from bytecomp.search.profile_inputs import host_workers_of
    from bytecomp.timeline.single_pass import simulate_single_pass

    v100 = load_cluster("v100-nvlink-100g")
    cost = GroupCost(encode_ms=20, channel_ms=5, decode_ms=20, host=True, copy_in_ms=1,
                     copy_out_ms=1)
    ends = {}
    for cores in (16, 32):
        workers = host_workers_of(replace(v100, cpu_cores=cores))
        model = IterationModel(0, 10, 0, [10, 10, 10], host_workers=workers)
        groups = [SimGroup(i, cost) for i in range(3)]
        result = simulate(model, groups, record=True)
        assert simulate_single_pass(model, groups).iteration_ms == \
            pytest.approx(result.iteration_ms)
        ends[workers] = (result.channel, result.comm_end_ms)
    # 2 workers: copies 10-11, 11-12, 12-13; encodes 11-31 and 12-32, the third waits for
    # a worker: 31-51; channel 31-36, 36-41, 51-56; decodes 36-56 (the worker free since
    # 32), 51-71 and 56-76; copies back 56-57, 71-72, 76-77
    assert ends[2] == ([(31, 36), (36, 41), (51, 56)], 77)
    # 4 workers: encodes 11-31, 12-32, 13-33; channel 31-36, 36-41, 41-46; decodes 36-56,
    # 41-61, 46-66; copies back 56-57, 61-62, 66-67
    assert ends[4] == ([(31, 36), (36, 41), (41, 46)], 67)
