"""Discrete-event simulation of one training iteration.

An iteration is the forward pass, then the backward pass overlapped with
communication, then the optimizer. Resources:

* the **compute stream** runs the backward pass; device-side encodes and
  decodes run on it too and, while they run, the backward pass waits, so
  every later gradient is delayed (the backward pass is work measured in
  milliseconds of the compute-only profile; gradients become ready as it
  advances). While the channel is busy the backward pass advances at
  ``1 - interference`` of its speed: communication takes compute (gloo
  reduces and moves bytes with the CPU), as the profile measures;
* the **channel** is FIFO (bytecomp runs every exchange on one communication
  thread): a group's collectives start when the group is encoded and every
  earlier group has left the channel;
* a pool of **host workers** runs host-side encodes and decodes, after a
  device-to-host copy and before a host-to-device copy on the **copy
  engine** (FIFO).

DDP hands a bucket over when all its gradients are ready, buckets in index
order; the groups a bucket completes are launched then, in their order. The
iteration ends when the backward pass is done and every group is decoded.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush, heapreplace
from typing import NamedTuple

from bytecomp.model.strategy import GroupCost
from bytecomp.plan import HOST_WORKERS


class SimGroup(NamedTuple):  # a tuple: the search builds thousands per second
    """A group of tensors exchanged together, released when ``bucket`` launches."""

    bucket: int
    cost: GroupCost
    label: str = ""
    members: tuple = ()


@dataclass
class IterationModel:
    """What the simulation needs besides the groups: compute times and buckets."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    bucket_ready_ms: list[float]  # backward work after which each bucket is ready
    host_workers: int = HOST_WORKERS
    interference: float = 0.0  # share of the compute stream lost while the channel is busy
    intra_interference: float | None = None  # the same for intra-node traffic (None: same)

    def channel_rate(self, cost: GroupCost) -> float:
        """The backward pass's speed while ``cost``'s collectives run: its intra-node
        share of the channel time slows it by ``intra_interference``, the rest by
        ``interference``."""
        if self.interference == 0.0 and not self.intra_interference:
            return 1.0
        intra = self.interference if self.intra_interference is None \
            else self.intra_interference
        if cost.channel_ms <= 0:
            return 1.0 - self.interference
        share = min(1.0, cost.intra_ms / cost.channel_ms)
        return 1.0 - (self.interference * (1.0 - share) + intra * share)


@dataclass(frozen=True)
class Event:
    resource: str
    op: str
    start: float
    end: float
    label: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class SimResult:
    iteration_ms: float
    backward_end_ms: float  # from the start of the backward pass
    comm_end_ms: float
    events: list[Event] = field(default_factory=list)
    channel: list[tuple[float, float]] = field(default_factory=list)  # per group (start, end)

    def idle_after(self, group: int, tolerance: float = 1e-9) -> bool:
        """True when the channel idles after ``group`` (its communication is hidden)."""
        end = self.channel[group][1]
        if group + 1 < len(self.channel):
            return self.channel[group + 1][0] > end + tolerance
        return self.backward_end_ms > end + tolerance

    def breakdown(self) -> dict[str, float]:
        """Busy milliseconds per (resource, op), from the recorded events."""
        totals: dict[str, float] = {}
        for event in self.events:
            key = f"{event.resource}:{event.op}"
            totals[key] = totals.get(key, 0.0) + event.duration
        return totals


def simulate(model: IterationModel, groups: list[SimGroup], record: bool = False) -> SimResult:
    """Simulate one iteration; events (times from the iteration start) when ``record``."""
    if record:
        return _Simulation(model, groups, record).run()
    return _simulate_single_pass(model, groups)


def _simulate_single_pass(model: IterationModel, groups: list[SimGroup]) -> SimResult:
    """The same model as :class:`_Simulation`, without events, in one pass over the groups.

    Channel completions come in group order, so decodes reach the compute stream in
    order too; the loop advances the backward pass to each bucket's ready point,
    letting every decode that arrives on the way interrupt it (and the channel's
    busy intervals slow it), then runs the bucket's encodes and queues its groups on
    the channel. A group's channel interval starts no earlier than its launch, so
    the intervals known when advancing are all that can slow that stretch.

    Host groups never touch the compute stream: their copies (one FIFO copy engine)
    and host work (a FIFO pool of workers) are served in request order. Requests
    come in time order per kind (copies in at launches, encodes after them, decodes
    at channel ends in group order), so each resource serves a request once every
    earlier one is known: decodes before an encode's or a launch's time, copies out
    before a launch's time, the rest at the end."""
    released: list[list[SimGroup]] = [[] for _ in model.bucket_ready_ms]
    for group in groups:
        released[group.bucket].append(group)
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

    def on_worker(request: float, duration: float) -> float:
        start = max(request, workers[0])
        heapreplace(workers, start + duration)
        return start + duration

    def on_copy_engine(request: float, duration: float) -> float:
        nonlocal copy_free
        copy_free = max(request, copy_free) + duration
        return copy_free

    def decode_on_host_until(time: float) -> None:
        while host_decodes and host_decodes[0][0] < time:
            end, decode, copy_out = host_decodes.popleft()
            heappush(copies_out, (on_worker(end, decode), next(sequence), copy_out))

    def copy_out_until(time: float) -> None:
        nonlocal last_finish
        decode_on_host_until(time)
        while copies_out and copies_out[0][0] < time:
            decoded, _, duration = heappop(copies_out)
            last_finish = max(last_finish, on_copy_engine(decoded, duration))

    def finish_time(start: float, need: float) -> float:
        """When ``need`` ms of backward work started at ``start`` are done."""
        nonlocal first
        while first < len(channel) and channel[first][1] <= start:
            first += 1
        time = start
        for (begin, end), slow in zip(channel[first:], rates[first:]):
            if begin > time:
                if need <= begin - time:
                    return time + need
                need -= begin - time
                time = begin
            capacity = (end - time) * slow
            if need <= capacity:
                return time + need / slow
            need -= capacity
            time = end
        return time + need

    def progress(start: float, stop: float) -> float:
        """Backward work done between ``start`` and ``stop`` with no device job."""
        lost = sum(max(0.0, min(end, stop) - max(begin, start)) * (1.0 - slow)
                   for (begin, end), slow in zip(channel[first:], rates[first:]))
        return (stop - start) - lost

    def advance_to(target: float) -> None:
        nonlocal clock, work, last_finish
        while target - work > 1e-12:
            done = finish_time(clock, target - work)
            if decodes and decodes[0][0] < done:
                arrival, duration = decodes.popleft()
                if arrival > clock:
                    work += progress(clock, arrival)
                    clock = arrival
                clock += duration
                last_finish = max(last_finish, clock)
            else:
                clock, work = done, target
        work = max(work, target)

    ready = 0.0
    for bucket, bucket_groups in enumerate(released):
        ready = max(ready, model.bucket_ready_ms[bucket])
        advance_to(ready)
        launch = clock
        copied_in = []  # every host group asks for its copy in at the launch, in order
        if any(group.cost.host for group in bucket_groups):
            copy_out_until(launch)
            copied_in = [on_copy_engine(launch, group.cost.copy_in_ms)
                         for group in bucket_groups if group.cost.host]
        host = 0
        for group in bucket_groups:
            cost = group.cost
            if cost.host:
                decode_on_host_until(copied_in[host])
                encoded = on_worker(copied_in[host], cost.encode_ms)
                host += 1
            else:
                clock += cost.encode_ms
                encoded = clock
            start = max(encoded, channel_free)
            channel_free = start + cost.channel_ms
            channel.append((start, channel_free))
            rates.append(model.channel_rate(cost))
            if cost.host:
                host_decodes.append((channel_free, cost.decode_ms, cost.copy_out_ms))
            elif cost.decode_ms > 0:
                decodes.append((channel_free, cost.decode_ms))
            else:
                last_finish = max(last_finish, channel_free)
    advance_to(backward_total)
    backward_end = clock
    for arrival, duration in decodes:
        clock = max(clock, arrival) + duration
        last_finish = max(last_finish, clock)
    copy_out_until(math.inf)
    end = max(backward_end, last_finish)
    return SimResult(model.forward_ms + end + model.optimizer_ms, backward_end, last_finish,
                     [], channel)


class _Simulation:
    def __init__(self, model: IterationModel, groups: list[SimGroup], record: bool) -> None:
        self.model = model
        self.groups = groups
        self.record = record
        self.events: list[Event] = []
        self.heap: list = []
        self.sequence = itertools.count().__next__
        self.now = 0.0
        ready, running = [], 0.0
        for value in model.bucket_ready_ms:  # DDP launches buckets in index order
            running = max(running, value)
            ready.append(running)
        self.bucket_ready = ready
        self.backward_ms = max([model.backward_ms, *ready])
        self.released: list[list[int]] = [[] for _ in ready]
        for index, group in enumerate(groups):
            self.released[group.bucket].append(index)
        # compute stream
        self.work = 0.0
        self.rate = 1.0
        self.running_since: float | None = 0.0
        self.version = 0
        self.next_bucket = 0
        self.device_queue: deque = deque()
        self.device_busy = False
        self.backward_end = None
        # channel, host pool, copy engine
        self.encoded = [False] * len(groups)
        self.channel = [(0.0, 0.0)] * len(groups)
        self.next_channel = 0
        self.channel_busy = False
        self.free_workers = model.host_workers
        self.host_queue: deque = deque()
        self.copy_busy = False
        self.copy_queue: deque = deque()
        self.finished = 0
        self.last_finish = 0.0

    # -- bookkeeping -------------------------------------------------------------------
    def push(self, time: float, handler, *args) -> None:
        heappush(self.heap, (time, self.sequence(), handler, args))

    def log(self, resource: str, op: str, start: float, end: float, label: str = "") -> None:
        if end > start:  # callers check self.record first: this is the hot loop
            self.events.append(Event(resource, op, start + self.model.forward_ms,
                                     end + self.model.forward_ms, label))

    def run(self) -> SimResult:
        self._schedule_backward()
        heap = self.heap
        while heap:
            self.now, _, handler, args = heappop(heap)
            handler(*args)
        backward_end = self.backward_end if self.backward_end is not None else self.now
        end = max(backward_end, self.last_finish)
        if self.record:
            self.events.insert(0, Event("compute", "forward", 0.0, self.model.forward_ms))
            self.events.append(Event("compute", "optimizer", self.model.forward_ms + end,
                                     self.model.forward_ms + end + self.model.optimizer_ms))
        return SimResult(self.model.forward_ms + end + self.model.optimizer_ms, backward_end,
                         self.last_finish, self.events, self.channel)

    # -- the compute stream --------------------------------------------------------------
    def _next_milestone(self) -> float | None:
        if self.next_bucket < len(self.bucket_ready):
            return self.bucket_ready[self.next_bucket]
        return self.backward_ms if self.backward_end is None else None

    def _schedule_backward(self) -> None:
        target = self._next_milestone()
        if target is None or self.running_since is None:
            return
        self.version += 1
        self.push(self.now + max(0.0, target - self.work) / self.rate, self._milestone,
                  self.version, target)

    def _set_rate(self, rate: float) -> None:
        """The backward pass's speed changes (a group enters or the channel idles)."""
        if rate == self.rate:
            return
        if self.running_since is not None:  # settle the progress so far at the old rate
            self.work += (self.now - self.running_since) * self.rate
            if self.record:
                self.log("compute", "backward", self.running_since, self.now)
            self.running_since = self.now
            self.rate = rate
            self._schedule_backward()
        else:
            self.rate = rate

    def _pause_backward(self) -> None:
        if self.running_since is not None:
            self.work += (self.now - self.running_since) * self.rate
            if self.record:
                self.log("compute", "backward", self.running_since, self.now)
            self.running_since = None
            self.version += 1

    def _resume_backward(self) -> None:
        if self.running_since is None and self.backward_end is None:
            self.running_since = self.now
            self._schedule_backward()

    def _milestone(self, version: int, target: float) -> None:
        if version != self.version:
            return
        if self.record:
            self.log("compute", "backward", self.running_since, self.now)
        self.work = target
        self.running_since = self.now
        while self.next_bucket < len(self.bucket_ready) and \
                self.bucket_ready[self.next_bucket] <= self.work + 1e-12:
            bucket = self.next_bucket
            self.next_bucket += 1
            self._launch(bucket)
        if self.next_bucket == len(self.bucket_ready) and self.work >= self.backward_ms - 1e-12 \
                and self.backward_end is None and self.running_since is not None:
            self.backward_end = self.now
            self.running_since = None
            return
        if self.running_since is not None:
            self._schedule_backward()

    def _device_job(self, duration: float, done, index: int, op: str) -> None:
        if duration <= 0:
            done(index)
            return
        self.device_queue.append((duration, done, index, op))
        if not self.device_busy:
            self._pause_backward()
            self._start_device_job()

    def _start_device_job(self) -> None:
        duration, done, index, op = self.device_queue.popleft()
        self.device_busy = True
        if self.record:
            self.log("compute", op, self.now, self.now + duration, self.groups[index].label)
        self.push(self.now + duration, self._device_done, done, index)

    def _device_done(self, done, index: int) -> None:
        self.device_busy = False
        done(index)
        if self.device_queue:
            self._start_device_job()
        elif not self.device_busy:
            self._resume_backward()

    # -- launching and the channel ---------------------------------------------------------
    def _launch(self, bucket: int) -> None:
        for index in self.released[bucket]:
            cost = self.groups[index].cost
            if cost.host:
                self._copy(cost.copy_in_ms, index, "d2h", self._host_encode)
            else:
                self._device_job(cost.encode_ms, self._encoded, index, "encode")

    def _encoded(self, index: int) -> None:
        self.encoded[index] = True
        self._try_channel()

    def _try_channel(self) -> None:
        if self.channel_busy or self.next_channel >= len(self.groups) or \
                not self.encoded[self.next_channel]:
            return
        index = self.next_channel
        self.next_channel += 1
        duration = self.groups[index].cost.channel_ms
        self.channel_busy = True
        self._set_rate(self.model.channel_rate(self.groups[index].cost))
        self.channel[index] = (self.now, self.now + duration)
        if self.record:
            self.log("channel", "collective", self.now, self.now + duration, self.groups[index].label)
        self.push(self.now + duration, self._channel_done, index)

    def _channel_done(self, index: int) -> None:
        self.channel_busy = False
        if self.next_channel >= len(self.groups) or not self.encoded[self.next_channel]:
            self._set_rate(1.0)
        cost = self.groups[index].cost
        if cost.host:
            self._host(cost.decode_ms, index, "decode", self._host_decoded)
        else:
            self._device_job(cost.decode_ms, self._finish, index, "decode")
        self._try_channel()

    def _finish(self, index: int) -> None:
        self.finished += 1
        self.last_finish = max(self.last_finish, self.now)

    # -- host workers and the copy engine ---------------------------------------------------
    def _host_encode(self, index: int) -> None:
        self._host(self.groups[index].cost.encode_ms, index, "encode", self._encoded)

    def _host_decoded(self, index: int) -> None:
        self._copy(self.groups[index].cost.copy_out_ms, index, "h2d", self._finish)

    def _host(self, duration: float, index: int, op: str, done) -> None:
        self.host_queue.append((duration, index, op, done))
        self._start_host_jobs()

    def _start_host_jobs(self) -> None:
        while self.free_workers and self.host_queue:
            duration, index, op, done = self.host_queue.popleft()
            self.free_workers -= 1
            if self.record:
                self.log("host", op, self.now, self.now + duration, self.groups[index].label)
            self.push(self.now + duration, self._host_done, index, done)

    def _host_done(self, index: int, done) -> None:
        self.free_workers += 1
        done(index)
        self._start_host_jobs()

    def _copy(self, duration: float, index: int, op: str, done) -> None:
        self.copy_queue.append((duration, index, op, done))
        if not self.copy_busy:
            self._start_copy()

    def _start_copy(self) -> None:
        duration, index, op, done = self.copy_queue.popleft()
        self.copy_busy = True
        if self.record:
            self.log("copy", op, self.now, self.now + duration, self.groups[index].label)
        self.push(self.now + duration, self._copy_done, index, done)

    def _copy_done(self, index: int, done) -> None:
        self.copy_busy = False
        done(index)
        if self.copy_queue:
            self._start_copy()
