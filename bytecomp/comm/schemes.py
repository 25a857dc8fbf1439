"""Collective schemes: how a (compressed) tensor is averaged over the ranks.

A scheme is an object (:class:`Scheme`) registered by name (:func:`register_scheme`):
it declares what it supports and needs, builds the staged exchange of a tensor
(:mod:`bytecomp.comm.exchanges`), lays out the residuals its stages keep and names
its pricing (:attr:`Scheme.pricing`, a :class:`bytecomp.costs.scheme_costs.SchemeCost`).
The planner's tree, the plan file's validation, the cost model and the executor ask
this one registry, never a scheme's name.

The built-in schemes, in the order the planner offers them:

* ``allreduce``: the compressor's native rounds (summable payloads are averaged
  in place; PowerSGD's two rounds; ExDyna's gather-then-reduce).
* ``allgather``: every rank's payload is gathered and decompressed (any
  gatherable single-round compressor).
* ``twoshot``: alltoall + allgather for chunkable compressors: rank j receives
  chunk j of every rank, averages it, re-compresses it (with its own "server"
  state, so error feedback applies to both stages) and it is gathered.
* ``hierarchical``: intra-node reduce-scatter uncompressed, inter-node exchange of
  each rank's chunk with the compressor, intra-node allgather uncompressed;
  ``hierarchical-fp16`` and ``hierarchical-bf16`` run both intra-node stages in
  16 bits (divided by the ranks per node first, as PyTorch's fp16 hook does).
* ``twolevel`` (Espresso's two-level scheme): the compressor inside the node too.
  Each rank compresses its tensor's chunks, one per local rank; an intra-node
  alltoall gives local rank j every local chunk j, which it averages and
  exchanges with local rank j of every other node (the compressor's native
  scheme); the result is compressed once more and gathered inside the node.

Every exchange returns the mean over all ranks, identical on every rank, with
the input's shape and dtype; the input may be overwritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeVar

from bytecomp.comm.rounds import GATHER, native_rounds
from bytecomp.compress.base import Compressor

# the exchanges need torch: each is imported where one is built, so that the planner,
# which reads the registry, imports no torch
if TYPE_CHECKING:
    import torch

    from bytecomp.comm.exchanges import Exchange
    from bytecomp.comm.topology import Topology

SEVERAL_NODES = "needs several nodes and several ranks per node"


class Scheme:
    """A collective scheme. Subclasses set the class attributes (the traits the
    planner, the model and the executor read) and implement :meth:`exchange`;
    :func:`register_scheme` makes one available by its ``name``.

    * ``label``: a short label for tables (``AR``); ``summary``: one line for legends.
    * ``uncompressed``: an uncompressed (fp32) tensor may use it.
    * ``several_nodes``: it needs several nodes of several ranks each (else pruned).
    * ``whole``: it exchanges a group's tensors as they are, in one stage over the job
      (a low-rank compressor's matrices keep their shapes).
    * ``channel_by_place``: it computes on the channel between its collectives
      (re-compression, casts), so the channel's time depends on where the tensor is
      encoded.
    * ``intra_dtype``: the 16-bit dtype of its intra-node stages (``"float16"``), if any.
    * ``native``: it is the compressor's own rounds over the whole job, as PyTorch's
      DDP communication hooks exchange a bucket.
    * ``pricing``: how the cost model prices it: a
      :class:`bytecomp.costs.scheme_costs.SchemeCost` subclass, or its import path
      (``"package.module:Class"``, imported where a plan is priced: a built-in's names
      one in :mod:`bytecomp.costs.scheme_costs`, which imports this module).
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    uncompressed: ClassVar[bool] = False
    several_nodes: ClassVar[bool] = False
    whole: ClassVar[bool] = False
    channel_by_place: ClassVar[bool] = False
    intra_dtype: ClassVar[str | None] = None
    native: ClassVar[bool] = False
    pricing: ClassVar[str | type] = ""

    def supports(self, compressor: Compressor) -> bool:
        """Whether ``compressor`` can run on this scheme."""
        raise NotImplementedError

    def infeasible(self, nodes: int, ranks_per_node: int) -> str | None:
        """Why this scheme cannot run on a cluster of this shape, as what it "needs ..."
        (None: it can)."""
        if self.several_nodes and (nodes < 2 or ranks_per_node < 2):
            return SEVERAL_NODES
        return None

    def one_collective(self, compressor: Compressor) -> bool:
        """Whether the exchange is a single collective, issued at once from the hook's
        thread (:meth:`bytecomp.comm.exchanges.FlatExchange.communicate_async`)."""
        return False

    def flat_rounds(self, compressor: Compressor) -> tuple[str, ...]:
        """A ``whole`` scheme's collectives, round by round (``"allreduce"`` or
        ``"allgather"``), for ``compressor``."""
        raise NotImplementedError(f"{self.name} is not a one-stage scheme")

    def exchange(self, x: torch.Tensor, compressor: Compressor, state: dict,
                 topology: Topology) -> Exchange:
        """The staged exchange of ``x`` (non-empty) with ``compressor``."""
        raise NotImplementedError

    def take_residuals(self, state: dict, numel: int, topology: Topology
                       ) -> torch.Tensor | None:
        """Remove the error-feedback residuals of a tensor's exchange from ``state`` and
        return them as one flat tensor of ``numel`` elements in this rank's own units:
        added to this rank's next gradient, they reach the average as they would have
        through the residuals (None: there were none). Default: one residual of the
        whole tensor."""
        return state.pop("residual", None)

    def __repr__(self) -> str:
        return f"<scheme {self.name}>"


SCHEMES: dict[str, Scheme] = {}  # by name, in the order they were registered

S = TypeVar("S", bound=type[Scheme])


def register_scheme(cls: S) -> S:
    """Class decorator: make the scheme ``cls`` (an instance of it) available by its
    name to the planner, the plan file, the cost model (its :attr:`Scheme.pricing`) and
    the executor."""
    if not cls.name or not cls.label:
        raise ValueError(f"{cls.__name__} needs a name and a label to be registered")
    if cls.name in SCHEMES and type(SCHEMES[cls.name]) is not cls:
        raise ValueError(f"a scheme named {cls.name!r} is registered already")
    SCHEMES[cls.name] = cls()
    return cls


def scheme_of(name: str) -> Scheme:
    """The registered scheme ``name`` (``ValueError`` naming the choices otherwise)."""
    scheme = SCHEMES.get(name)
    if scheme is None:
        raise ValueError(f"unknown collective scheme {name!r}; choose from "
                         f"{', '.join(SCHEMES)}")
    return scheme


def supported_schemes(compressor: Compressor) -> list[str]:
    """The schemes ``compressor`` can run on, in registration order."""
    return [name for name, scheme in SCHEMES.items() if scheme.supports(compressor)]


def uncompressed_schemes() -> list[str]:
    """The schemes an uncompressed tensor may use."""
    return [name for name, scheme in SCHEMES.items() if scheme.uncompressed]


def check_scheme(compressor: Compressor, scheme: str) -> None:
    if scheme_of(scheme).supports(compressor):
        return
    raise ValueError(f"{compressor.spec} cannot run on {scheme}; it supports "
                     f"{', '.join(supported_schemes(compressor))}")


def native_scheme(compressor: Compressor) -> str:
    """The one-stage scheme a compressor's own rounds end with."""
    return "allreduce" if native_rounds(compressor) != GATHER else "allgather"


def make_exchange(x: torch.Tensor, compressor: Compressor, state: dict, topology: Topology,
                  scheme: str = "allreduce") -> Exchange:
    """The staged exchange of ``x`` with ``compressor`` on ``scheme`` (the input may be
    overwritten; the result is the mean over all ranks, identical on every rank)."""
    from bytecomp.comm.exchanges import Exchange

    check_scheme(compressor, scheme)
    if x.numel() == 0:
        return Exchange(x)
    return SCHEMES[scheme].exchange(x, compressor, state, topology)


def exchange(x: torch.Tensor, compressor: Compressor, state: dict, topology: Topology,
             scheme: str = "allreduce") -> torch.Tensor:
    """Average ``x`` over all ranks with ``compressor`` on ``scheme`` (synchronous)."""
    return make_exchange(x, compressor, state, topology, scheme).run()


def take_residuals(state: dict, scheme: str, numel: int, topology: Topology
                   ) -> torch.Tensor | None:
    """:meth:`Scheme.take_residuals` of the scheme named ``scheme``."""
    return scheme_of(scheme).take_residuals(state, numel, topology)


# -- the built-in schemes ----------------------------------------------------------------


@register_scheme
class AllReduce(Scheme):
    name = "allreduce"
    label = "AR"
    summary = "the compressor's own rounds over the job (an allreduce of summable payloads)"
    uncompressed = True
    whole = True
    native = True
    pricing = "bytecomp.costs.scheme_costs:OneStageCost"

    def supports(self, compressor):
        return compressor.collectives_of_rounds()[-1] == "allreduce"

    def one_collective(self, compressor):
        return compressor.collectives_of_rounds() == ("allreduce",)

    def flat_rounds(self, compressor):
        return compressor.collectives_of_rounds()

    def exchange(self, x, compressor, state, topology):
        from bytecomp.comm.exchanges import FlatExchange

        return FlatExchange(x, compressor, state, topology.world, self.flat_rounds(compressor))


@register_scheme
class AllGather(Scheme):
    name = "allgather"
    label = "AG"
    summary = "every rank's payload gathered and decompressed"
    whole = True
    pricing = "bytecomp.costs.scheme_costs:OneStageCost"

    def supports(self, compressor):
        return compressor.gatherable and compressor.rounds == 1

    def one_collective(self, compressor):
        return compressor.rounds == 1 and compressor.fixed_size

    def flat_rounds(self, compressor):
        return GATHER

    def exchange(self, x, compressor, state, topology):
        from bytecomp.comm.exchanges import FlatExchange

        return FlatExchange(x, compressor, state, topology.world, GATHER)


@register_scheme
class TwoShot(Scheme):
    name = "twoshot"
    label = "2S"
    summary = "alltoall of chunks, each averaged and re-compressed by one rank, allgather"
    channel_by_place = True
    pricing = "bytecomp.costs.scheme_costs:TwoShotCost"

    def supports(self, compressor):
        return compressor.gatherable and compressor.rounds == 1 and compressor.chunkable

    def exchange(self, x, compressor, state, topology):
        from bytecomp.comm.exchanges import TwoShotExchange

        return TwoShotExchange(x, compressor, state, topology.world)

    def take_residuals(self, state, numel, topology):
        """One residual per chunk and, for the chunk this rank re-compresses, a "server"
        residual of the average (so it counts ``world`` times)."""
        from bytecomp.comm.exchanges import chunk_residuals, placed, stage_residual

        size = topology.size
        pieces = chunk_residuals(state) + [(topology.rank, stage_residual(state, "server"),
                                            size)]
        return placed(pieces, -(-numel // size), size, numel)


@register_scheme
class Hierarchical(Scheme):
    name = "hierarchical"
    label = "H"
    summary = "intra-node reduce-scatter, inter-node compressed exchange, intra-node allgather"
    uncompressed = True
    several_nodes = True
    pricing = "bytecomp.costs.scheme_costs:HierarchicalCost"  # its 16-bit variants' too

    def supports(self, compressor):
        return True

    def exchange(self, x, compressor, state, topology):
        import torch

        from bytecomp.comm.exchanges import HierarchicalExchange

        dtype = getattr(torch, self.intra_dtype) if self.intra_dtype else None
        return HierarchicalExchange(x, compressor, state, topology, dtype)

    def take_residuals(self, state, numel, topology):
        """One residual of this rank's chunk of the node's average (so it counts
        ``ranks_per_node`` times)."""
        from bytecomp.comm.exchanges import placed

        residual = state.pop("residual", None)
        k = topology.ranks_per_node
        width = residual.numel() if residual is not None else 0
        return placed([(topology.local_rank, residual, k)], width, k, numel)


@register_scheme
class HierarchicalFP16(Hierarchical):
    name = "hierarchical-fp16"
    label = "H16"
    summary = "hierarchical, the intra-node stages in float16"
    channel_by_place = True  # the casts
    intra_dtype = "float16"


@register_scheme
class HierarchicalBF16(Hierarchical):
    name = "hierarchical-bf16"
    label = "Hb"
    summary = "hierarchical, the intra-node stages in bfloat16"
    channel_by_place = True  # the casts
    intra_dtype = "bfloat16"


@register_scheme
class TwoLevel(Scheme):
    name = "twolevel"
    label = "2L"
    summary = "two-shot inside the node around an inter-node exchange (Espresso)"
    several_nodes = True
    channel_by_place = True
    pricing = "bytecomp.costs.scheme_costs:TwoLevelCost"

    def supports(self, compressor):  # two-shot inside the node
        return compressor.gatherable and compressor.rounds == 1 and compressor.chunkable

    def exchange(self, x, compressor, state, topology):
        from bytecomp.comm.exchanges import TwoLevelExchange

        return TwoLevelExchange(x, compressor, state, topology)

    def take_residuals(self, state, numel, topology):
        """One residual per chunk of its intra-node stage, one of the node's average of its
        chunk (inter-node stage) and one of the world's average of it, which the same local
        rank of every node holds (``server``): both count ``ranks_per_node`` times."""
        from bytecomp.comm.exchanges import chunk_residuals, placed, stage_residual

        k = topology.ranks_per_node
        pieces = chunk_residuals(state) + [(topology.local_rank, stage_residual(state, stage),
                                            k) for stage in ("inter", "server")]
        return placed(pieces, -(-numel // k), k, numel)
