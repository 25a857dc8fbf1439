"""What a simulation of one iteration takes (the compute times and buckets, the groups
with their costs) and gives (iteration time, channel intervals, events). The model
itself is described in :mod:`bytecomp.timeline.simulator`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from bytecomp.costs.strategy import GroupCost
from bytecomp.plan_types import HOST_WORKERS


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
    # Through bytecomp's hook, every bucket costs bucket_hook_ms on the compute stream and
    # every group its hook_ms and tail_ms; DDP's own allreduce (through_hook False) none.
    through_hook: bool = True
    bucket_hook_ms: float = 0.0
    # A CPU job: the compute on the channel (``GroupCost.compute_ms``) runs on the cores
    # the backward pass runs on, and every collective a group issues while the backward
    # computes waits ``busy_collective_ms`` longer (both measured by the profile).
    shared_compute: bool = False
    busy_collective_ms: float = 0.0

    @property
    def steady(self) -> bool:
        """Whether the channel never slows the backward pass."""
        return self.interference == 0.0 and not self.intra_interference and \
            not self.shared_compute

    def channel_rate(self, cost: GroupCost) -> float:
        """The backward pass's speed while ``cost``'s collectives run: its intra-node
        share of the channel time slows it by ``intra_interference``, its compute share
        (a CPU job's, ``shared_compute``) stops it, the rest slows it by
        ``interference``."""
        if self.steady:
            return 1.0
        intra = self.interference if self.intra_interference is None \
            else self.intra_interference
        if cost.channel_ms <= 0:
            return 1.0 - self.interference
        share = min(1.0, cost.intra_ms / cost.channel_ms)
        compute = min(1.0 - share, cost.compute_ms / cost.channel_ms) \
            if self.shared_compute else 0.0
        return max(0.0, 1.0 - (self.interference * (1.0 - share - compute) + intra * share
                               + compute))

    def busy_extra_ms(self, cost: GroupCost, bucket: int) -> float:
        """What a group's collectives wait beyond their sweep's time when the group is
        launched while the backward pass still computes: by a bucket before the last
        (the last is ready when the backward's last gradients are)."""
        if bucket >= len(self.bucket_ready_ms) - 1 or self.busy_collective_ms == 0.0:
            return 0.0
        return cost.collectives * self.busy_collective_ms


class Event(NamedTuple):  # a tuple: a recorded iteration of 200,000 groups has 800,000
    resource: str
    op: str
    start: float
    end: float
    label: str = ""  # the group's strategy
    group: int = -1  # the group's index in SimResult.groups (-1: no group's)

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
    groups: list[SimGroup] = field(default_factory=list)  # the groups simulated, where recorded

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
