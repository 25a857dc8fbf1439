"""Process groups for the collective schemes: world, intra-node and inter-node.

Ranks are laid out node-major as torchrun does: ``rank = node * ranks_per_node
+ local_rank``. Every rank must build the topology (group creation is
collective), in the same order.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import sys
import time
from dataclasses import dataclass

import torch.distributed as dist

from bytecomp.errors import BytecompError


def job_timeout() -> datetime.timedelta | None:
    """The timeout the job's default process group was given (init_process_group's
    ``timeout``), or None where it cannot be read."""
    with contextlib.suppress(Exception):  # private API: absent in some torch versions
        group = dist.distributed_c10d._get_default_group()
        for device in group._device_types:
            return group._get_backend(device).options._timeout
    return None


def new_group(ranks: list[int], backend: str | None = None) -> dist.ProcessGroup:
    """``dist.new_group`` with the job's timeout: a group created without one waits 30
    minutes for a stuck peer whatever the job asked for. Every group bytecomp creates
    goes through here."""
    return dist.new_group(ranks, backend=backend, timeout=job_timeout())


def release_groups(*groups: dist.ProcessGroup | None) -> None:
    """Destroy groups made by :func:`new_group` once they are done with. A gloo group
    keeps a thread polling its sockets for the life of the process: left behind by
    every executor a process makes (a benchmark's strategies, one after another),
    they would take CPU from the training that follows.

    The destroyed groups are retired, not dropped: see :func:`free_retired_groups`."""
    for group in groups:
        if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
            continue
        with contextlib.suppress(Exception):  # already destroyed, or the job is torn down
            dist.destroy_process_group(group)
        _RETIRED.append(group)
    free_retired_groups()  # those of earlier releases that are free by now


# A group is freed by whichever thread drops its last reference, and freeing a gloo
# group joins the group's threads. A completion callback (runtime/paths.py) runs on one
# of them and holds the group until gloo lets go of it, after the step has gone on: if
# the executor had let go first, that thread would free the group and join itself,
# which aborts the process ("terminate called after throwing an instance of
# 'std::system_error' ... Resource deadlock avoided").
_RETIRED: list[dist.ProcessGroup] = []


def free_retired_groups(wait_s: float = 0.0) -> bool:
    """Free, on this thread, the retired groups that nothing else holds any longer. With
    ``wait_s``, collect the reference cycles that hold some (the executor's exchanges
    and callbacks make a few) and wait up to ``wait_s`` seconds for gloo's threads to
    let go of the others. True when none is left.

    A group something still holds stays retired: freed by a later call, or at exit."""
    deadline = time.monotonic() + wait_s
    collected = wait_s <= 0
    while True:
        for index in reversed(range(len(_RETIRED))):
            if sys.getrefcount(_RETIRED[index]) <= 2:  # the list's and the argument's
                del _RETIRED[index]
        if not _RETIRED or time.monotonic() >= deadline:
            return not _RETIRED
        if not collected:
            gc.collect()
            collected = True
        else:
            time.sleep(0.001)


@dataclass
class Topology:
    """This rank's view of the job: its groups and where it sits in them."""

    world: dist.ProcessGroup
    nodes: int
    ranks_per_node: int
    rank: int
    intra: dist.ProcessGroup | None
    inter: dist.ProcessGroup | None

    @property
    def size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_node

    @classmethod
    def build(cls, nodes: int | None = None, ranks_per_node: int | None = None,
              backend: str | None = None) -> Topology:
        """Create bytecomp's own groups (so its traffic never interleaves with DDP's).

        ``ranks_per_node`` defaults to torchrun's ``LOCAL_WORLD_SIZE`` and then to
        the whole world (one node). ``backend`` (``"gloo"`` for host-side payloads
        in an NCCL job) defaults to the job's.
        """
        if not dist.is_initialized():
            raise BytecompError("torch.distributed is not initialized: call "
                                "dist.init_process_group first")
        world_size = dist.get_world_size()
        if ranks_per_node is None:
            if nodes is not None:
                ranks_per_node = world_size // max(nodes, 1)
            else:
                ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if nodes is None:
            nodes = world_size // max(ranks_per_node, 1)
        if nodes < 1 or ranks_per_node < 1 or nodes * ranks_per_node != world_size:
            raise BytecompError(
                f"{nodes} nodes x {ranks_per_node} ranks per node does not match the "
                f"world size {world_size}"
            )
        world = new_group(list(range(world_size)), backend=backend)
        rank = dist.get_rank()
        intra = inter = None
        for node in range(nodes):
            members = [node * ranks_per_node + local for local in range(ranks_per_node)]
            group = new_group(members, backend=backend)
            if rank in members:
                intra = group
        for local in range(ranks_per_node):
            members = [node * ranks_per_node + local for node in range(nodes)]
            group = new_group(members, backend=backend)
            if rank in members:
                inter = group
        return cls(world, nodes, ranks_per_node, rank, intra, inter)

    def release(self) -> None:
        """Destroy this rank's groups (every rank, when the exchanges are over)."""
        release_groups(self.world, self.intra, self.inter)
