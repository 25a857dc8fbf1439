"""The per-tensor decision tree (a networkx DiGraph), pruned before search.

::

    tensor
    ├── keep                          (no compression)
    │   ├── allreduce                 leaf: fp32 allreduce
    │   └── hierarchical[-fp16|-bf16] leaves: reduce-scatter, inter-node allreduce,
    │                                 allgather (intra-node stages in fp32, fp16 or bf16)
    └── compress
        └── <spec>                    one per allowed compressor
            └── device | host         where encode and decode run
                └── allreduce | allgather | twoshot | hierarchical[-fp16|-bf16]
                    | twolevel        leaves

Beside it, a plan-level choice under its own root, ``exchange``: how gradients reach
the hook, ``exchange/per-tensor`` (bucket cap 0: DDP with one bucket per tensor, no
tensor merged with another, each exchanged as soon as its gradient is ready) or
``exchange/buckets <cap> MB`` (DDP's buckets at that cap, MergeComp-style merging
inside each). A cap whose buckets are exactly those of a smaller candidate is pruned
(the same plans, searched once).

The schemes are those registered in :mod:`bytecomp.comm.schemes`, in their order.
Every leaf of the per-tensor tree carries its :class:`Option`. Leaves that cannot run
are kept with a ``pruned`` reason and are not offered to the search: a scheme the
compressor does not support (:meth:`~bytecomp.comm.schemes.Scheme.supports`), a scheme
the cluster's shape cannot run (:meth:`~bytecomp.comm.schemes.Scheme.infeasible`: the
hierarchical and two-level schemes need several nodes of several ranks), a 16-bit
intra-node stage without the profile's timings of that cast, ``host`` on a CPU-only
job (host and device are the same cores there).
"""

from __future__ import annotations

import networkx as nx

from bytecomp.comm.schemes import SCHEMES, uncompressed_schemes
from bytecomp.compress import from_spec
from bytecomp.plan_types import UNCOMPRESSED, Option

ROOT = "tensor"
EXCHANGE = "exchange"  # the plan-level root: per-tensor or DDP buckets at a cap
SAME_BUCKETS = "a bucket cap whose DDP buckets a smaller candidate cap already gives"


def _prune_reason(spec: str | None, place: str, scheme_name: str, nodes: int,
                  ranks_per_node: int, device_type: str, casts: frozenset | None = None,
                  host_specs: set[str] | None = None,
                  host_casts: frozenset | None = None) -> str | None:
    scheme = SCHEMES[scheme_name]
    needs = scheme.infeasible(nodes, ranks_per_node)
    if needs is not None:
        return f"{scheme_name} {needs}"
    if nodes * ranks_per_node < 2:
        return "a single rank has nothing to exchange"
    cast = scheme.intra_dtype
    if cast is not None and casts is not None and cast not in casts:
        return f"a {cast} intra-node stage needs the profile's timings of a {cast} cast"
    if cast is not None and place == "host" and host_casts is not None \
            and cast not in host_casts:
        return (f"a {cast} intra-node stage on the host needs the profile's cpu timings of a "
                f"{cast} cast")
    if spec is None:
        return None
    if place == "host" and device_type != "cuda":
        return "host offload only helps when the gradients live on a GPU"
    if place == "host" and host_specs is not None and spec not in host_specs:
        return "no cpu timings for the compressor in the profile (host offload encodes there)"
    compressor = from_spec(spec)
    if not scheme.supports(compressor):
        return f"{compressor.name} does not support {scheme_name}"
    return None


def build_tree(specs: list[str], nodes: int, ranks_per_node: int,
               device_type: str, casts=None,
               host_specs: set[str] | None = None, host_casts=None) -> nx.DiGraph:
    """The full tree, with ``pruned`` set on the leaves that cannot run. ``casts``: the
    16-bit dtypes (``float16``, ``bfloat16``) whose casts the profile timed (default:
    every one); ``host_specs``: the specs that can encode on the host (the profile
    timed them on the cpu); default every spec; ``host_casts``: the 16-bit dtypes timed
    on the cpu, where a host group casts (default: as ``casts``)."""
    casts = None if casts is None else frozenset(casts)
    host = casts if host_casts is None else frozenset(host_casts)
    tree = nx.DiGraph()
    tree.add_node(ROOT)
    tree.add_edge(ROOT, "keep")
    for scheme in uncompressed_schemes():
        leaf = f"keep/{scheme}"
        tree.add_edge("keep", leaf)
        tree.nodes[leaf]["option"] = Option(UNCOMPRESSED, "device", scheme)
        tree.nodes[leaf]["pruned"] = _prune_reason(None, "device", scheme, nodes,
                                                   ranks_per_node, device_type, casts)
    if specs:
        tree.add_edge(ROOT, "compress")
    for spec in specs:
        tree.add_edge("compress", spec)
        for place in ("device", "host"):
            tree.add_edge(spec, f"{spec}/{place}")
            for scheme in SCHEMES:
                leaf = f"{spec}/{place}/{scheme}"
                tree.add_edge(f"{spec}/{place}", leaf)
                tree.nodes[leaf]["option"] = Option(spec, place, scheme)
                tree.nodes[leaf]["pruned"] = _prune_reason(spec, place, scheme, nodes,
                                                           ranks_per_node, device_type, casts,
                                                           host_specs, host)
    return tree


def exchange_leaf(cap_mb: float) -> str:
    """The exchange leaf of a bucket cap: ``exchange/per-tensor`` for 0."""
    return f"{EXCHANGE}/per-tensor" if cap_mb == 0 else f"{EXCHANGE}/buckets {cap_mb:g} MB"


def add_exchange(tree: nx.DiGraph, bucketings: dict[float, list[list[int]]]) -> list[float]:
    """Replace the tree's exchange choices by one leaf per candidate cap (``bucketings``:
    each cap's DDP buckets), pruning a cap whose buckets a smaller one gives; returns the
    caps left, ascending."""
    if EXCHANGE in tree:
        tree.remove_nodes_from([EXCHANGE, *tree.successors(EXCHANGE)])
    tree.add_node(EXCHANGE)
    kept: list[float] = []
    seen: set[tuple] = set()
    for cap in sorted(bucketings):
        leaf = exchange_leaf(cap)
        tree.add_edge(EXCHANGE, leaf)
        tree.nodes[leaf]["cap_mb"] = cap
        key = tuple(tuple(bucket) for bucket in bucketings[cap])
        tree.nodes[leaf]["pruned"] = SAME_BUCKETS if key in seen else None
        if key not in seen:
            seen.add(key)
            kept.append(cap)
    return kept


def leaves(tree: nx.DiGraph, root: str = ROOT) -> list[str]:
    return [node for node in nx.dfs_preorder_nodes(tree, root) if tree.out_degree(node) == 0]


def options_of(tree: nx.DiGraph) -> list[Option]:
    """The options the search may choose: unpruned leaves, fp32 allreduce first."""
    return [tree.nodes[leaf]["option"] for leaf in leaves(tree)
            if tree.nodes[leaf].get("pruned") is None]


def pruned_counts(tree: nx.DiGraph) -> dict[str, int]:
    """How many leaves each reason pruned (the exchange choices' too, once searched)."""
    counts: dict[str, int] = {}
    exchange = leaves(tree, EXCHANGE) if EXCHANGE in tree else []
    for leaf in leaves(tree) + exchange:
        reason = tree.nodes[leaf].get("pruned")
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    return counts
