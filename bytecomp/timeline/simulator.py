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
  earlier group has left the channel. On a CPU job its compute (a FIFO group's
  decode, re-compression) stops the backward pass while it runs, and each
  collective of a group launched before the last bucket waits
  ``busy_collective_ms`` longer (the cores are busy with the backward);
* a pool of **host workers** runs host-side encodes and decodes, after a
  device-to-host copy and before a host-to-device copy on the **copy
  engine** (FIFO).

DDP hands a bucket over when all its gradients are ready, buckets in index
order; the groups a bucket completes are launched then, in their order. The
iteration ends when the backward pass is done and every group is decoded.
"""

from __future__ import annotations

from bytecomp.plan_types import HOST_WORKERS
from bytecomp.timeline.events import EventSimulation
from bytecomp.timeline.iteration import Event, IterationModel, SimGroup, SimResult
from bytecomp.timeline.single_pass import simulate_single_pass

__all__ = ["HOST_WORKERS", "Event", "IterationModel", "SimGroup", "SimResult", "simulate"]


def simulate(model: IterationModel, groups: list[SimGroup], record: bool = False) -> SimResult:
    """Simulate one iteration; events (times from the iteration start) when ``record``."""
    if record:
        return EventSimulation(model, groups, record).run()
    return simulate_single_pass(model, groups)
