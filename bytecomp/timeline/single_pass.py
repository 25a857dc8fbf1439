"""The single-pass simulation: the search's evaluator (no events recorded).

It models exactly what :mod:`bytecomp.timeline.events` does, in one pass over the
groups instead of an event queue; ``tests/test_timeline.py`` checks that the two
agree on thousands of random instances.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from heapq import heappop, heappush, heapreplace

from bytecomp.timeline.iteration import IterationModel, SimGroup, SimResult


def simulate_single_pass(model: IterationModel, groups: list[SimGroup],
                         by_bucket: list[list[SimGroup]] | None = None) -> SimResult:
    """The same model as :class:`~bytecomp.timeline.events.EventSimulation`, without events, in one pass over the groups.

    Channel completions come in group order, so decodes reach the compute stream in
    order too; the loop advances the backward pass to each bucket's ready point,
    letting every decode that arrives on the way interrupt it (and the channel's
    busy intervals slow it), then runs the bucket's encodes and queues its groups on
    the channel. A group's channel interval starts no earlier than its launch, so
    the intervals known when advancing are all that can slow that stretch.

    Host groups never touch the compute stream: their copies (one FIFO copy engine)
    and host work (a FIFO pool of workers) are served in request order. Requests
    come in time order per kind (copies in when the hook reaches the group, encodes
    after them, decodes at channel ends in group order), so each resource serves a
    request once every earlier one is known: decodes before an encode's time, copies
    out before a copy in's time, the rest at the end. Through the hook, each bucket
    and then each group first costs its fixed time on the compute stream, and each
    group's channel interval ends with its tail.

    ``by_bucket``: the groups already bucket by bucket (then ``groups`` is not read)."""
    if by_bucket is None:  # (the search passes its groups already bucket by bucket)
        by_bucket = [[] for _ in model.bucket_ready_ms]
        for group in groups:
            by_bucket[group.bucket].append(group)
    backward_total = max([model.backward_ms, *model.bucket_ready_ms])
    rates: list[float] = []  # the backward pass's speed during each channel interval
    clock = work = channel_free = last_finish = 0.0
    decodes: deque = deque()
    channel: list[tuple[float, float]] = []
    first = 0  # first channel interval that may still end after the clock
    workers = [0.0] * max(1, model.host_workers)  # when each host worker is free (a heap)
    copy_free = 0.0
    host_decodes: deque = deque()  # (channel end, decode ms, copy-out ms), in channel order
    copies_out: list = []  # heap of (decoded at, sequence, copy-out ms)
    sequence = itertools.count()

    # (the hot loops below use ``a if a > b else b`` for ``max(a, b)``: same value, no call)
    def decode_on_host_until(time: float) -> None:
        """Hand every channel end before ``time`` to the first free worker."""
        while host_decodes and host_decodes[0][0] < time:
            end, decode, copy_out = host_decodes.popleft()
            free = workers[0]
            decoded = (end if end > free else free) + decode
            heapreplace(workers, decoded)
            heappush(copies_out, (decoded, next(sequence), copy_out))

    def copy_out_until(time: float) -> None:
        """Serve the copies out (on the copy engine) of every decode done before ``time``."""
        nonlocal last_finish, copy_free
        decode_on_host_until(time)
        while copies_out and copies_out[0][0] < time:
            decoded, _, duration = heappop(copies_out)
            copy_free = (decoded if decoded > copy_free else copy_free) + duration
            if copy_free > last_finish:
                last_finish = copy_free

    # without interference the channel never slows the backward pass: no need to look
    steady = model.steady

    def finish_time(start: float, need: float) -> float:
        """When ``need`` ms of backward work started at ``start`` are done."""
        nonlocal first
        if steady:
            return start + need
        while first < len(channel) and channel[first][1] <= start:
            first += 1
        time = start
        for index in range(first, len(channel)):
            (begin, end), slow = channel[index], rates[index]
            if begin > time:
                if need <= begin - time:
                    return time + need
                need -= begin - time
                time = begin
            capacity = (end - time) * slow
            if need <= capacity:
                return time + (need / slow if slow > 0 else 0.0)
            need -= capacity
            time = end
        return time + need

    def progress(start: float, stop: float) -> float:
        """Backward work done between ``start`` and ``stop`` with no device job."""
        if steady:
            return stop - start
        lost = sum(max(0.0, min(end, stop) - max(begin, start)) * (1.0 - slow)
                   for (begin, end), slow in zip(channel[first:], rates[first:]))
        return (stop - start) - lost

    def advance_to(target: float) -> None:
        nonlocal clock, work, last_finish
        while target - work > 1e-12:
            done = clock + (target - work) if steady else finish_time(clock, target - work)
            if decodes and decodes[0][0] < done:
                arrival, duration = decodes.popleft()
                if arrival > clock:
                    work += arrival - clock if steady else progress(clock, arrival)
                    clock = arrival
                clock += duration
                if clock > last_finish:
                    last_finish = clock
            else:
                clock, work = done, target
        if target > work:
            work = target

    ready = 0.0
    hooked = model.through_hook
    busy = model.busy_collective_ms
    for bucket, bucket_groups in enumerate(by_bucket):
        if model.bucket_ready_ms[bucket] > ready:
            ready = model.bucket_ready_ms[bucket]
        if ready > work:  # else advance_to does nothing
            advance_to(ready)
        if hooked:
            clock += model.bucket_hook_ms
        for group in bucket_groups:
            cost = group.cost
            if hooked:
                clock += cost.hook_ms
            if cost.host:  # handed over when the hook reaches it: copy in, then a worker
                if copies_out or host_decodes:
                    copy_out_until(clock)
                copy_free = copied_in = (clock if clock > copy_free else copy_free) + \
                    cost.copy_in_ms
                if host_decodes and host_decodes[0][0] < copied_in:
                    decode_on_host_until(copied_in)
                free = workers[0]
                encoded = (copied_in if copied_in > free else free) + cost.encode_ms
                heapreplace(workers, encoded)
            else:
                clock += cost.encode_ms
                encoded = clock
            start = encoded if encoded > channel_free else channel_free
            channel_free = start + cost.channel_ms + (cost.tail_ms if hooked else 0.0)
            if busy:  # (a collective waits longer while the backward computes)
                channel_free += model.busy_extra_ms(cost, bucket)
            channel.append((start, channel_free))
            rates.append(1.0 if steady else model.channel_rate(cost))
            if cost.host:
                host_decodes.append((channel_free, cost.decode_ms, cost.copy_out_ms))
            elif cost.decode_ms > 0:
                decodes.append((channel_free, cost.decode_ms))
            elif channel_free > last_finish:
                last_finish = channel_free
    advance_to(backward_total)
    backward_end = clock
    for arrival, duration in decodes:
        clock = max(clock, arrival) + duration
        last_finish = max(last_finish, clock)
    copy_out_until(math.inf)
    end = max(backward_end, last_finish)
    return SimResult(model.forward_ms + end + model.optimizer_ms, backward_end, last_finish,
                     [], channel)
