"""Collective schemes for compressed payloads on torch.distributed process groups.

>>> topology = Topology.build(nodes=2, ranks_per_node=2)    # on every rank
>>> comm = Communicator(topology)
>>> future = comm.exchange(grad, from_spec("topk:ratio=0.01"), state, "twoshot")
>>> mean = future.wait()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bytecomp.comm.schemes import (
    SCHEMES,
    Scheme,
    check_scheme,
    exchange,
    make_exchange,
    register_scheme,
    scheme_of,
    supported_schemes,
)
from bytecomp.compress.base import Compressor

# Exchange, Topology and CommWorker need torch: imported when first asked for (__getattr__),
# so that the planner, which reads the scheme registry, imports no torch
if TYPE_CHECKING:
    import torch

    from bytecomp.comm.exchanges import Exchange
    from bytecomp.comm.topology import Topology
    from bytecomp.comm.worker import CommWorker


class Communicator:
    """Asynchronous exchanges: each call queues the scheme on a FIFO background
    thread and returns a :class:`torch.futures.Future` of the averaged tensor, so
    it can be returned from a DDP communication hook. Every rank must call it in
    the same order."""

    def __init__(self, topology: Topology | None = None) -> None:
        from bytecomp.comm.topology import Topology
        from bytecomp.comm.worker import CommWorker

        self.owns_topology = topology is None
        self.topology = topology or Topology.build()
        self.worker = CommWorker()

    def exchange(self, x: torch.Tensor, compressor: Compressor, state: dict,
                 scheme: str = "allreduce") -> torch.futures.Future:
        """Encode ``x`` now, then communicate and decode in the background."""
        staged = make_exchange(x, compressor, state, self.topology, scheme)
        staged.encode()
        return self.worker.submit(_finish, staged, device=x.device)

    def close(self) -> None:
        """Stop the background thread; destroy the groups if it built them."""
        self.worker.close()
        if self.owns_topology:
            self.topology.release()


def _finish(staged: Exchange) -> torch.Tensor:
    staged.communicate()
    return staged.decode()


def __getattr__(name: str) -> Any:
    if name == "Exchange":
        from bytecomp.comm.exchanges import Exchange

        return Exchange
    if name == "Topology":
        from bytecomp.comm.topology import Topology

        return Topology
    if name == "CommWorker":
        from bytecomp.comm.worker import CommWorker

        return CommWorker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SCHEMES", "CommWorker", "Communicator", "Exchange", "Scheme", "Topology",
           "check_scheme", "exchange", "make_exchange", "register_scheme", "scheme_of",
           "supported_schemes"]
