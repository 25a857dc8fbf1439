"""The discrete-event simulation of one iteration: the reference model, and what
``bytecomp simulate`` records (every compute, channel, host and copy event) for the
trace and the Gantt chart."""

from __future__ import annotations

import itertools
from collections import deque
from heapq import heappop, heappush

from bytecomp.timeline.iteration import Event, IterationModel, SimGroup, SimResult


class _Lane:
    """A resource that runs jobs first come, first served, ``servers`` at a time: the
    compute stream and the copy engine (one each), the host workers' pool. ``idle``: called
    when the lane has nothing left to run (the compute stream's resumes the backward pass)."""

    __slots__ = ("name", "servers", "free", "jobs", "idle")

    def __init__(self, name: str, servers: int, idle=None) -> None:
        self.name, self.servers, self.free, self.idle = name, servers, servers, idle
        self.jobs: deque = deque()  # (duration, group index, op, done)


class EventSimulation:
    """One iteration as a discrete-event simulation; records events when asked."""

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
        self.device = _Lane("compute", 1, self._resume_backward)
        self.backward_end: float | None = None
        # channel, host pool, copy engine
        self.encoded = [False] * len(groups)
        self.channel = [(0.0, 0.0)] * len(groups)
        self.next_channel = 0
        self.channel_busy = False
        self.host = _Lane("host", model.host_workers)
        self.copy = _Lane("copy", 1)
        self.last_finish = 0.0

    # -- bookkeeping -------------------------------------------------------------------
    def push(self, time: float, handler, *args) -> None:
        heappush(self.heap, (time, self.sequence(), handler, args))

    def log(self, resource: str, op: str, start: float, end: float, group: int = -1) -> None:
        """Record an event (of group ``group``, an index into ``self.groups``; -1: none)."""
        if end > start:  # callers check self.record first: this is the hot loop
            self.events.append(Event(resource, op, start + self.model.forward_ms,
                                     end + self.model.forward_ms,
                                     self.groups[group].label if group >= 0 else "", group))

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
                         self.last_finish, self.events, self.channel,
                         self.groups if self.record else [])

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
        if self.rate > 0:  # else stopped until the rate changes (_set_rate reschedules)
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
        if self.record and self.running_since is not None:  # always, for a current milestone
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

    def _device_job(self, duration: float, done, index: int, op: str,
                    in_order: bool = False) -> None:
        """Run ``duration`` ms on the compute stream (FIFO), then ``done(index)``. A job of
        no duration is done at once, unless ``in_order``: then after the jobs before it."""
        device = self.device
        if duration <= 0 and not (in_order and (not device.free or device.jobs)):
            done(index)
            return
        if device.free:  # the backward pass waits while the stream runs the job
            self._pause_backward()
        self._submit(device, duration, index, op, done)

    # -- launching and the channel ---------------------------------------------------------
    def _launch(self, bucket: int) -> None:
        hooked = self.model.through_hook
        if hooked:
            self._device_job(self.model.bucket_hook_ms, lambda _: None, -1, "hook")
        for index in self.released[bucket]:
            cost = self.groups[index].cost
            if hooked:
                self._device_job(cost.hook_ms, lambda _: None, index, "hook")
            if cost.host:  # handed over when the hook reaches it
                self._device_job(0.0, self._host_copy_in, index, "hook", in_order=True)
            else:
                self._device_job(cost.encode_ms, self._encoded, index, "encode", in_order=True)

    def _host_copy_in(self, index: int) -> None:
        self._submit(self.copy, self.groups[index].cost.copy_in_ms, index, "d2h",
                     self._host_encode)

    def _encoded(self, index: int) -> None:
        self.encoded[index] = True
        self._try_channel()

    def _try_channel(self) -> None:
        if self.channel_busy or self.next_channel >= len(self.groups) or \
                not self.encoded[self.next_channel]:
            return
        index = self.next_channel
        self.next_channel += 1
        group = self.groups[index]
        cost = group.cost
        duration = cost.channel_ms + (cost.tail_ms if self.model.through_hook else 0.0) + \
            self.model.busy_extra_ms(cost, group.bucket)
        self.channel_busy = True
        self._set_rate(self.model.channel_rate(cost))
        self.channel[index] = (self.now, self.now + duration)
        if self.record:
            self.log("channel", "collective", self.now, self.now + duration, index)
        self.push(self.now + duration, self._channel_done, index)

    def _channel_done(self, index: int) -> None:
        self.channel_busy = False
        if self.next_channel >= len(self.groups) or not self.encoded[self.next_channel]:
            self._set_rate(1.0)
        cost = self.groups[index].cost
        if cost.host:
            self._submit(self.host, cost.decode_ms, index, "decode", self._host_decoded)
        else:
            self._device_job(cost.decode_ms, self._finish, index, "decode")
        self._try_channel()

    def _finish(self, index: int) -> None:
        self.last_finish = max(self.last_finish, self.now)

    # -- host workers and the copy engine ---------------------------------------------------
    def _host_encode(self, index: int) -> None:
        self._submit(self.host, self.groups[index].cost.encode_ms, index, "encode",
                     self._encoded)

    def _host_decoded(self, index: int) -> None:
        self._submit(self.copy, self.groups[index].cost.copy_out_ms, index, "h2d", self._finish)

    # -- the lanes --------------------------------------------------------------------------
    def _submit(self, lane: _Lane, duration: float, index: int, op: str, done) -> None:
        """Queue ``duration`` ms of ``op`` for group ``index`` on ``lane``, then ``done(index)``."""
        lane.jobs.append((duration, index, op, done))
        self._start(lane)

    def _start(self, lane: _Lane) -> None:
        while lane.free and lane.jobs:
            duration, index, op, done = lane.jobs.popleft()
            lane.free -= 1
            if self.record:
                self.log(lane.name, op, self.now, self.now + duration, index)
            self.push(self.now + duration, self._lane_done, lane, index, done)

    def _lane_done(self, lane: _Lane, index: int, done) -> None:
        lane.free += 1
        done(index)
        self._start(lane)
        if lane.idle is not None and lane.free == lane.servers:
            lane.idle()
