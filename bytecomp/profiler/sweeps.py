"""Sweeps over sizes: collectives, compressors and host<->device copies.

Every rank runs the same loops. A series of sizes goes up to the largest array
the plan can use (the profiled model's whole gradient: no bucket or merged group
is larger; ``max_bytes``), and a pilot pass stops it sooner, after the first
operation slower than the per-operation limit, judged on times reduced over
ranks, so that every rank stops together. With a time allowance (the stage's
share of ``profile --budget``, :mod:`bytecomp.profiler.budget`) that limit comes
from the allowance: the allowance over the series and the rounds it must hold
(:func:`op_limit`). Then the measurements are repeated in rounds over every case
(round-robin rather than one case after another), so that the bursts of noise of
a shared machine spread over all cases instead of biasing a few; the rounds stop
once every case's median has settled (:data:`STABLE`), at the allowance, or at
``repeats``, after at least :data:`MIN_ROUNDS`. Statistics are over rounds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from bytecomp.comm.compat import collective_call
from bytecomp.comm.topology import Topology
from bytecomp.compress import from_spec
from bytecomp.compress.base import SOLO
from bytecomp.compress.local import advance_rounds, decode, encode
from bytecomp.profile_tables import COLLECTIVE_DTYPES
from bytecomp.profiler.budget import Allowance, agreed
from bytecomp.profiler.timing import Clock, summarize, time_call_ms

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast")
DTYPES = {name: getattr(torch, name) for name in COLLECTIVE_DTYPES}  # a table's dtypes
# Collectives without reduction arithmetic move bytes, not dtypes: on gloo (2 ranks,
# 4 KiB to 8 MiB) allgather, alltoall and broadcast of float32, float16 and uint8 took
# the same time within the noise of a shared machine, in no consistent order
# (tests/test_profile_budget.py::
# test_collectives_without_arithmetic_take_the_same_time_in_every_dtype).
# So they are measured once per byte count, in float32, and their rows stand for every
# dtype; allreduce and reduce_scatter sum, and are measured per dtype.
BYTE_COLLECTIVES = ("allgather", "alltoall", "broadcast")
MEASURED_DTYPE = "float32"


@dataclass
class SweepSettings:
    min_bytes: int = 1 << 10
    max_bytes: int = 64 << 20
    size_factor: int = 2
    repeats: int = 10
    budget_s: float = 0.5  # a series stops after an operation this slow (no allowance)
    numels: tuple[int, ...] = (1 << 8, 1 << 12, 1 << 16, 1 << 20, 1 << 24)
    compressor_repeats: int = 5
    # the stage's time (its share of profile --budget): the per-operation limit and the
    # rounds come from it (None: budget_s and the repeats' counts)
    allowance: Allowance | None = None

    def numels_up_to_max(self) -> tuple[int, ...]:
        """The compressor sizes the plan can use: up to the first at or past the largest
        array of ``max_bytes`` float32 elements."""
        largest = max(1, self.max_bytes // 4)
        kept = [n for n in self.numels if n < largest]
        return tuple(kept + [n for n in self.numels if n >= largest][:1]) or self.numels[:1]


MIN_ROUNDS = 3  # a median needs a few samples, however slow the link
STABLE = 0.05  # rounds stop once no case's median moved by more than this in a round
MIN_OP_S, MAX_OP_S = 0.005, 2.0  # the per-operation limit a share can set


def op_limit(settings: SweepSettings, series: int, rounds: int = MIN_ROUNDS) -> float:
    """Seconds of the slowest operation a series may keep: without an allowance
    ``budget_s``; with one, what lets the pilot and ``rounds`` rounds of ``series``
    series fit it (a doubling series costs about twice its largest operation)."""
    if settings.allowance is None:
        return settings.budget_s
    each = settings.allowance.seconds / (2 * (rounds + 1) * max(series, 1))
    return min(MAX_OP_S, max(MIN_OP_S, each))


def settled(before: list[float], now: list[float], tolerance: float = STABLE) -> bool:
    """Whether every median in ``now`` is within ``tolerance`` of the one ``before``."""
    return len(before) == len(now) and all(
        abs(b - n) <= tolerance * max(abs(b), 1e-9) for b, n in zip(before, now))


def more_rounds(done: int, most: int, before: list[float] | None, now: list[float],
                round_s: float, allowance: Allowance | None) -> bool:
    """Whether a sweep takes another round after ``done`` (collective: every rank
    calls it with the same medians; it agrees on the clock): at least
    :data:`MIN_ROUNDS`, at most ``most``, and no more once the medians have settled or
    another round would end past the allowance."""
    if done < MIN_ROUNDS:
        return True
    if done >= most:
        return False
    stable = before is not None and settled(before, now)
    late = allowance is not None and time.time() + round_s > allowance.deadline
    return not agreed(stable or late)


def sizes(settings: SweepSettings, limit: int) -> list[int]:
    """The sweep's sizes, up to the first at or past ``max_bytes`` (within ``limit``)."""
    out, size = [], settings.min_bytes
    while size <= limit:
        out.append(size)
        if size >= settings.max_bytes:
            break
        size *= settings.size_factor
    return out


def memory_limit_bytes(device: torch.device, ranks_here: int) -> int:
    """A cap on one buffer: 1/16 of the free memory shared by this node's ranks."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1 << 20, free // (16 * max(ranks_here, 1)))


def groups_to_sweep(topology: Topology) -> list[tuple[str, dist.ProcessGroup | None, int]]:
    groups: list[tuple[str, dist.ProcessGroup | None, int]] = [
        ("world", topology.world, topology.size)]
    if topology.nodes > 1:
        if topology.ranks_per_node > 1:
            groups.append(("intra", topology.intra, topology.ranks_per_node))
        groups.append(("inter", topology.inter, topology.nodes))
    return groups


def _reduce(samples: list[list[float]], op, device) -> list[list[float]]:
    table = torch.tensor(samples, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(table, op=op)
    return table.cpu().tolist()


# Sub-millisecond collectives have heavy-tailed times on a busy CPU (thread wake-ups:
# p90 several times the median), so a median of ``repeats`` samples moves from run to
# run; cheap cases take more samples per round (up to EXTRA_SAMPLES times as many),
# which costs little since they are cheap.
ROUND_MS = 2.0
EXTRA_SAMPLES = 4


@dataclass(frozen=True)
class _CollectiveCase:
    group_name: str
    group: object
    ranks: int
    collective: str
    dtype_name: str
    nbytes: int
    samples_per_round: int = 1
    pilot_ms: float = 0.0  # the pilot pass's time of one


def samples_per_round(pilot_ms: float) -> int:
    """Samples per round of a case whose pilot took ``pilot_ms``."""
    return int(min(EXTRA_SAMPLES, max(1, math.floor(ROUND_MS / max(pilot_ms, 1e-6)))))


def _time_collective(case: _CollectiveCase, clock: Clock, device) -> float:
    call = collective_call(case.collective, case.nbytes, DTYPES[case.dtype_name], case.group,
                            case.ranks, device)  # allocation and first touch stay untimed
    dist.barrier()
    return time_call_ms(call, clock, 1)[0]


def _within_budget(series: list, times_ms: list[float], budget_s: float) -> list:
    """The leading cases of a series that its rounds time: those within ``budget_s``, and
    the first one past it where that took at most twice as long (a doubling series' next
    size: what the per-operation limit allows for, :func:`op_limit`); always the first.
    A far slower one (a compressor's next size is 16 times larger) would spend the
    rounds' time on one case; the fits extrapolate to it instead."""
    kept: list = []
    for case, time_ms in zip(series, times_ms):
        if time_ms > 2 * budget_s * 1000 and kept:
            break
        kept.append(case)
        if time_ms > budget_s * 1000:
            break
    return kept


def sweep_collectives(topology: Topology, device: torch.device, settings: SweepSettings,
                      progress=None, only: set[tuple] | None = None) -> list[dict]:
    """Rows of collectives.csv: collective, group, dtype, bytes, ranks, time_ms, p10_ms, p90_ms.

    A pilot pass (which also warms every group and size up) decides how far each
    series goes (:func:`op_limit`) and how many samples a round takes of each case
    (more of the cheap ones: :func:`samples_per_round`); then rounds each run every
    case (:func:`more_rounds`), so that the samples of one case are spread over the
    whole sweep and a burst of noise on a shared machine cannot bias one size. A
    sample is the time from the barrier to the end of the collective on the rank
    that measured the least, i.e. the rank that arrived last: the collective's own
    duration. :data:`BYTE_COLLECTIVES` are measured in float32 only, their rows
    written for every dtype. ``only``: the (collective, group, dtype) series to sweep
    (default every one).
    """
    clock = Clock(device)
    limit = memory_limit_bytes(device, topology.ranks_per_node)
    wanted = [(group_name, group, ranks, collective, dtype_name)
              for group_name, group, ranks in groups_to_sweep(topology)
              for collective in COLLECTIVES for dtype_name in DTYPES
              if only is None or (collective, group_name, dtype_name) in only]
    measured = list(dict.fromkeys(
        (g, group, r, c, MEASURED_DTYPE if c in BYTE_COLLECTIVES else d)
        for g, group, r, c, d in wanted))
    series = [[_CollectiveCase(g, group, r, c, d, nbytes) for nbytes in sizes(settings, limit)]
              for g, group, r, c, d in measured]
    most_s = op_limit(settings, len(series))
    cases = []
    for one_series in series:
        pilot = [_time_collective(case, clock, device) for case in one_series]
        pilot = _reduce([pilot], dist.ReduceOp.MIN, device)[0]  # the same on every rank
        kept = _within_budget(one_series, pilot, most_s)
        cases += [replace(case, samples_per_round=samples_per_round(time_ms), pilot_ms=time_ms)
                  for case, time_ms in zip(kept, pilot)]
        if progress:
            progress()
    samples: list[list[float]] = [[] for _ in cases]
    done, before, flat = 0, None, []
    while True:
        began = time.time()
        for index, case in enumerate(cases):
            for _ in range(case.samples_per_round):
                samples[index].append(_time_collective(case, clock, device))
        done += 1
        if progress:
            progress()
        flat = _reduce([[t for times in samples for t in times]], dist.ReduceOp.MIN, device)[0]
        now = [stats["median_ms"] for stats in _per_case(flat, samples)]
        if not more_rounds(done, settings.repeats, before, now, time.time() - began,
                           settings.allowance):
            break
        before = now
    rows = []
    for case, stats in zip(cases, _per_case(flat, samples)):
        row = {"collective": case.collective, "group": case.group_name,
               "dtype": case.dtype_name, "bytes": case.nbytes, "ranks": case.ranks,
               "time_ms": stats["median_ms"], "p10_ms": stats["p10_ms"],
               "p90_ms": stats["p90_ms"]}
        if case.collective in BYTE_COLLECTIVES:  # the same bytes in every dtype
            rows += [{**row, "dtype": name} for name in DTYPES
                     if (case.group_name, case.collective, name) in
                     {(g, c, d) for g, _, _, c, d in wanted}]
        else:
            rows.append(row)
    return rows


def _per_case(flat: list[float], samples: list[list[float]]) -> list[dict]:
    """The statistics of each case's run of ``flat`` (its samples, reduced)."""
    out, start = [], 0
    for times in samples:
        out.append(summarize(flat[start:start + len(times)]))
        start += len(times)
    return out


def time_allreduce(group_name: str, group, ranks: int, nbytes: int, device: torch.device,
                   samples: int, warm: bool = True) -> list[float]:
    """``samples`` times (ms) of an fp32 allreduce of ``nbytes`` over ``group``, after an
    untimed one (connections, first touch; not with ``warm=False``), each as the sweep
    takes a sample: from a barrier to the end on the rank that arrived last (the least
    over the ranks, so the same on every rank). Collective: call on every rank."""
    clock = Clock(device)
    case = _CollectiveCase(group_name, group, ranks, "allreduce", "float32", nbytes)
    if warm:
        _time_collective(case, clock, device)
    times = [_time_collective(case, clock, device) for _ in range(samples)]
    return _reduce([times], dist.ReduceOp.MIN, device)[0]


def collective_steps(topology: Topology, settings: SweepSettings) -> int:
    """Progress steps of :func:`sweep_collectives`: one per series measured, then one per
    round (at most ``repeats``)."""
    per_group = (len(COLLECTIVES) - len(BYTE_COLLECTIVES)) * len(DTYPES) + len(BYTE_COLLECTIVES)
    return len(groups_to_sweep(topology)) * per_group + settings.repeats


def _time_compression(compressor, x, other, clock) -> tuple[float, float, float, int]:
    """Encode ``x`` as a second step (the state a first step on ``other`` left), decode it:
    ``(encode_ms, decode_ms, advance_ms, bytes sent)``, where ``advance_ms`` is the part
    of the encode after the first round's payload (a multi-round compressor's work
    between its collectives, which the executor runs on the channel)."""
    state: dict = {}
    encode(compressor, other, state)
    clock.sync()
    start = clock.mark()
    payload, ctx = compressor.compress(x, state, SOLO)
    first = clock.mark()
    encoded = advance_rounds(compressor, payload, ctx, state)
    middle = clock.mark()
    decode(compressor, encoded)
    end = clock.mark()
    clock.sync()
    advance_ms = clock.elapsed_ms(first, middle) if len(compressor.collectives_of_rounds()) > 1 \
        else 0.0
    return (clock.elapsed_ms(start, middle), clock.elapsed_ms(middle, end), advance_ms,
            encoded.bytes_sent)


def _sweep_cases(specs: list[str], devices: list[torch.device], settings: SweepSettings,
                 timer: Callable, pilot_of: Callable, progress=None):
    """Time every spec on every device at the sweep's sizes (up to the plan's largest
    array), as in training: every rank at the same time, the slowest rank's time per
    sample. As for collectives, a pilot pass bounds each series by the per-operation
    limit (:func:`op_limit`), then rounds over every case until the medians settle.

    ``timer(compressor, x, other, clock, round)`` gives ``(times, extra)``; ``pilot_of``
    reads the pilot's time from ``times``. Returns the cases (device, compressor,
    numel), per case the median of each time, and per case the last ``extra``."""
    numels = settings.numels_up_to_max()
    inputs = {(device, numel): (torch.randn(numel, device=device),
                                torch.randn(numel, device=device))
              for device in devices for numel in numels}
    most_s = op_limit(settings, len(specs) * len(devices))
    cases = []
    for device in devices:
        clock = Clock(device)
        for spec in specs:
            compressor = from_spec(spec)
            series = [(device, compressor, numel) for numel in numels]
            pilot = [pilot_of(timer(compressor, *inputs[(device, numel)], clock, 0)[0])
                     for _, _, numel in series]
            pilot = _reduce([pilot], dist.ReduceOp.MAX, torch.device("cpu"))[0]
            cases += _within_budget(series, pilot, most_s)
            if progress:
                progress()
    samples: list[list[list[float]]] = []  # per time, per case
    extras: list = [None] * len(cases)
    done, before, medians = 0, None, []
    while cases:
        began = time.time()
        for index, (device, compressor, numel) in enumerate(cases):
            times, extras[index] = timer(compressor, *inputs[(device, numel)], Clock(device),
                                         done)
            samples = samples or [[[] for _ in cases] for _ in times]
            for quantity, time_ms in zip(samples, times):
                quantity[index].append(time_ms)
        done += 1
        if progress:
            progress()
        medians = [[float(np.median(case)) for case in _reduce(quantity, dist.ReduceOp.MAX,
                                                               torch.device("cpu"))]
                   for quantity in samples]
        now = [value for quantity in medians for value in quantity]
        if not more_rounds(done, settings.compressor_repeats, before, now,
                           time.time() - began, settings.allowance):
            break
        before = now
    return cases, [tuple(per_case) for per_case in zip(*medians)], extras


def sweep_compressors(specs: list[str], devices: list[torch.device], settings: SweepSettings,
                      progress=None) -> list[dict]:
    """Rows of compressors.csv: spec, device, numel, encode_ms, decode_ms, payload_bytes,
    advance_ms (see :func:`_sweep_cases`; the pilot times the encode)."""

    def timer(compressor, x, other, clock, _round):
        encode_ms, decode_ms, advance_ms, payload = _time_compression(compressor, x, other,
                                                                      clock)
        return (encode_ms, decode_ms, advance_ms), payload

    cases, medians, payloads = _sweep_cases(specs, devices, settings, timer,
                                            lambda times: times[0], progress)
    return [{"spec": compressor.spec, "device": device.type, "numel": numel,
             "encode_ms": round(encode_ms, 5), "decode_ms": round(decode_ms, 5),
             "payload_bytes": payload, "advance_ms": round(min(advance_ms, encode_ms), 5)}
            for (device, compressor, numel), (encode_ms, decode_ms, advance_ms), payload
            in zip(cases, medians, payloads)]


def compressor_steps(specs: list[str], devices: list, settings: SweepSettings) -> int:
    return len(specs) * len(devices) + settings.compressor_repeats


MORE_PAYLOADS = 3  # the aggregation sweep's second point (one payload is the first)


def gathered_specs(specs: list[str]) -> list[str]:
    """The specs whose payloads a gathered exchange sums from every rank (allgather,
    two-shot, two-level): those whose single round a rank can decompress for every
    other (gatherable)."""
    return [spec for spec in specs
            if (compressor := from_spec(spec)).gatherable and compressor.rounds == 1]


def _time_aggregation(compressor, x, other, clock, reverse: bool = False) -> tuple[float, float]:
    """The executor's decode of a gathered exchange (``aggregate_into``: decompress every
    rank's payload, sum in float32, average, write out) of one payload and of
    ``MORE_PAYLOADS``; ``reverse`` times them in the other order."""
    state: dict = {}
    encode(compressor, other, state)
    encoded = encode(compressor, x, state)
    out = torch.empty_like(x)
    counts = (MORE_PAYLOADS, 1) if reverse else (1, MORE_PAYLOADS)
    times = {}
    for count in counts:
        # once untimed: the first call on new buffers pays their pages (steps do not)
        compressor.aggregate_into([encoded.payload] * count, encoded.ctx, out)
        clock.sync()
        start = clock.mark()
        compressor.aggregate_into([encoded.payload] * count, encoded.ctx, out)
        end = clock.mark()
        clock.sync()
        times[count] = clock.elapsed_ms(start, end)
    return times[1], times[MORE_PAYLOADS]


def sweep_aggregation(specs: list[str], devices: list[torch.device], settings: SweepSettings,
                      progress=None) -> list[dict]:
    """Rows of aggregation.csv: spec, device, numel, one_ms, each_ms: the executor's
    decode of a gathered exchange costs ``one_ms + (payloads - 1) * each_ms``, more than
    ``payloads x decode_ms`` (a float32 sum, the average and the copy out are passes of
    their own). ``each_ms`` is the slope between one payload and ``MORE_PAYLOADS``
    (timed in alternating order, so neither is always the first). For
    :func:`gathered_specs` only; the compressor sweep's sizes, samples and budget
    (:func:`_sweep_cases`)."""

    def timer(compressor, x, other, clock, round_):
        return _time_aggregation(compressor, x, other, clock, reverse=round_ % 2 == 1), None

    cases, medians, _ = _sweep_cases(gathered_specs(specs), devices, settings, timer, sum,
                                     progress)
    return [{"spec": compressor.spec, "device": device.type, "numel": numel,
             "one_ms": round(one, 5),
             "each_ms": round(max(0.0, (more - one) / (MORE_PAYLOADS - 1)), 5)}
            for (device, compressor, numel), (one, more) in zip(cases, medians)]


def aggregation_steps(specs: list[str], devices: list, settings: SweepSettings) -> int:
    return len(gathered_specs(specs)) * len(devices) + settings.compressor_repeats


def sweep_copies(device: torch.device, settings: SweepSettings, progress=None) -> list[dict]:
    """Rows of copies.csv: direction, bytes, time_ms. ``d2d`` is a copy within the device's
    memory (what gathering a merged group's scattered tensors costs; every rank copies
    at once, as in training); on GPUs also ``d2h`` and ``h2d`` through pinned host
    memory."""
    clock = Clock(device)
    rows = []
    limit = min(memory_limit_bytes(device, 1), 64 << 20)
    for nbytes in sizes(settings, limit):  # repeats: a copy is cheap, and never slow
        source = torch.ones(nbytes, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        directions = [("d2d", partial(target.copy_, source))]
        if device.type == "cuda":
            on_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            directions += [("d2h", partial(on_host.copy_, source, non_blocking=True)),
                           ("h2d", partial(source.copy_, on_host, non_blocking=True))]
        for direction, fn in directions:
            samples = _reduce([time_call_ms(fn, clock, settings.repeats)], dist.ReduceOp.MAX,
                              torch.device("cpu"))[0]
            rows.append({"direction": direction, "bytes": nbytes,
                         "time_ms": summarize(samples)["median_ms"]})
    if progress:
        progress()
    return rows
