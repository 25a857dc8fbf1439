"""What a simulation of one iteration takes (the compute times and buckets, the groups
with their costs) and gives (iteration time, channel intervals, events). The model
itself is described in :mod:`bytecomp.timeline.simulator`."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # Through bytecomp's hook, every bucket costs bucket_hook_ms on the compute stream and
    # every group its hook_ms and tail_ms; DDP's own allreduce (through_hook False) none.
    through_hook: bool = True
    bucket_hook_ms: float = 0.0

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
