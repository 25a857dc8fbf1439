"""Empirical cost models fitted from a profile, and the cost of each strategy.

* Collectives: ``a + b * bytes`` per (collective, group, dtype), fitted to the
  profile's sweeps. For another cluster: a GPU job (NCCL) costs what NCCL's
  tuning model says of the cheapest algorithm and protocol for the size
  (:mod:`bytecomp.costs.nccl`: ring or tree, LL, LL128 or Simple, per-hop
  latencies by link type); a CPU job (gloo), or a cluster whose links are given
  as ``profile``, follows the ring formulas with each link's per-message cost
  alpha and per-byte cost beta (from the config, or derived from the fits)::

      allreduce                              2 (p-1) alpha + 2 (p-1)/p n beta
      allgather, reduce_scatter, alltoall    (p-1) alpha + (p-1)/p n beta
      broadcast                              (p-1) alpha + n beta

  An inter-node group has one rank per node; the ``ranks_per_node`` inter-node
  groups of a hierarchical exchange run at once and share each node's link.
* Compression: a monotone piecewise curve in ``numel`` for encode and decode per
  (spec, device) (:mod:`bytecomp.costs.fits`).
* Copies (GPU profiles): ``a + b * bytes`` per direction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pandas as pd

from bytecomp.costs.clusters import PROFILE_LINK, Cluster, Link
from bytecomp.costs.fits import LinearFit, PiecewiseFit, fit_linear, fit_piecewise
from bytecomp.costs.nccl import Span, nccl_ms
from bytecomp.errors import BytecompError
from bytecomp.profile_store import Profile

STEPS = {"allreduce": 2.0, "allgather": 1.0, "reduce_scatter": 1.0, "alltoall": 1.0,
         "broadcast": 1.0}
DTYPE_ALIASES = {"bfloat16": "float16", "float64": "float32", "int8": "uint8"}


def ring_ms(collective: str, ranks: int, nbytes: float, alpha_ms: float, beta: float) -> float:
    """Ring-algorithm time of ``collective`` on ``ranks`` ranks for a whole array of
    ``nbytes``."""
    if ranks <= 1:
        return 0.0
    steps = STEPS[collective] * (ranks - 1)
    if collective == "broadcast":
        return steps * alpha_ms + nbytes * beta
    return steps * alpha_ms + steps / ranks * nbytes * beta


def profiled_cluster(profile: Profile) -> Cluster:
    return Cluster(f"profiled ({profile.label})", profile.nodes, profile.ranks_per_node)


class LazyFits(Mapping):
    """A fit per key, made from the key's profile rows when first read."""

    def __init__(self, rows: dict, fit: Callable) -> None:
        self._rows, self._fit = rows, fit
        self._fits: dict = {}

    def __getitem__(self, key):
        if key not in self._fits:
            self._fits[key] = self._fit(self._rows[key])  # KeyError where no rows
        return self._fits[key]

    def __iter__(self) -> Iterator:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key) -> bool:
        return key in self._rows


@dataclass
class FitRow:
    """One fitted model, for ``bytecomp plan --verbose``."""

    kind: str
    key: str
    fit: LinearFit | PiecewiseFit


class CommModel:
    """Time of a collective on the world, intra-node or inter-node group."""

    def __init__(self, profile: Profile, cluster: Cluster) -> None:
        self.profile = profile
        self.cluster = cluster
        self.fits: dict[tuple[str, str, str], LinearFit] = {}
        table = profile.collectives
        for (collective, group, dtype), rows in table.groupby(["collective", "group", "dtype"]):
            self.fits[(collective, group, dtype)] = fit_linear(rows["bytes"], rows["time_ms"])
        self._resolved: dict[tuple[str, str, str], LinearFit] = {}
        self.links = {kind: self._link(kind) for kind in ("intra", "inter")}
        # NCCL's model for a GPU job on configured links; gloo's ring otherwise
        # (a measured cluster uses its fits: neither)
        self.library = "nccl" if not cluster.measured and PROFILE_LINK not in (
            cluster.intra, cluster.inter) and profile.device_type == "cuda" else "gloo"
        self._spans: dict[str, Span] = {}
        self._ranks = {"world": cluster.world_size, "intra": cluster.ranks_per_node,
                       "inter": cluster.nodes}

    def _fit(self, collective: str, group: str, dtype: str) -> LinearFit:
        key = (collective, group, dtype)
        if key not in self._resolved:
            self._resolved[key] = self._find_fit(collective, group, dtype)
        return self._resolved[key]

    def _find_fit(self, collective: str, group: str, dtype: str) -> LinearFit:
        dtype = DTYPE_ALIASES.get(dtype, dtype)
        if self.profile.nodes == 1 and group == "intra":
            group = "world"
        for key in ((collective, group, dtype), (collective, group, "float32")):
            if key in self.fits:
                return self.fits[key]
        raise BytecompError(f"{self.profile.label}: the profile has no {collective} sweep on "
                            f"the {group} group ({dtype}); re-run bytecomp profile")

    def _config_link(self, kind: str) -> Link:
        """The cluster's ``kind`` link, which a collective on that kind of group needs."""
        link = self.links[kind]
        if link is None:
            raise BytecompError(f"cluster {self.cluster.name} has no {kind}-node link "
                                f"(links.{kind}), which this exchange needs")
        return link

    def _link(self, kind: str) -> Link | None:
        """Alpha and beta of a link kind: from the config, or derived from the fits."""
        link = getattr(self.cluster, kind)
        if link != PROFILE_LINK:
            return link
        profiled = self.profile.ranks_per_node if kind == "intra" else self.profile.nodes
        group = "world" if (kind == "intra" and self.profile.nodes == 1) or \
            (kind == "inter" and self.profile.ranks_per_node == 1) else kind
        if profiled < 2:
            raise BytecompError(f"cluster {self.cluster.name}: links.{kind} is 'profile' but the "
                                f"profile has no {kind}-node communication to fit")
        fit = self._fit("allreduce", group, "float32")
        steps = 2.0 * (profiled - 1)
        alpha_ms = fit.intercept / steps
        beta = fit.slope * profiled / steps
        if kind == "inter" and self.profile.ranks_per_node > 1 and group == "inter":
            beta /= self.profile.ranks_per_node  # measured with every local rank sharing the link
        return Link(alpha_ms * 1000.0, 8.0 / max(beta, 1e-15) * 1e-9 * 1000.0)

    def span(self, group: str) -> Span:
        """Where the ranks of ``group`` sit, for NCCL's model."""
        if group not in self._spans:
            nodes, per_node = self.cluster.nodes, self.cluster.ranks_per_node
            intra = self._config_link("intra") if per_node > 1 else None
            inter = self._config_link("inter") if nodes > 1 else None
            nvlink = intra is not None and intra.type == "nvlink"
            self._spans[group] = {
                "world": Span(nodes * per_node, nodes, intra, inter, 1, nvlink),
                "intra": Span(per_node, 1, intra, None, 1, nvlink),
                "inter": Span(nodes, nodes, None, inter, per_node, nvlink)}[group]
        return self._spans[group]

    def time_ms(self, collective: str, group: str, dtype: str, nbytes: float) -> float:
        """``group``: world, intra (a node's ranks) or inter (one rank per node)."""
        if self.cluster.measured:
            return max(0.0, self._fit(collective, group, dtype)(nbytes))
        if self.library == "nccl":
            return nccl_ms(collective, self.span(group), nbytes)
        nodes, per_node = self.cluster.nodes, self.cluster.ranks_per_node
        if group == "intra" or (group == "world" and nodes == 1):
            intra = self._config_link("intra")
            return ring_ms(collective, per_node, nbytes, intra.alpha_ms, intra.beta_ms_per_byte)
        link = self._config_link("inter")
        if group == "inter":  # ranks_per_node such groups share each node's link
            return ring_ms(collective, nodes, nbytes, link.alpha_ms,
                           link.beta_ms_per_byte * per_node)
        return ring_ms(collective, nodes * per_node, nbytes, link.alpha_ms, link.beta_ms_per_byte)

    def ranks(self, group: str) -> int:
        return self._ranks[group]

    def rows(self) -> list[FitRow]:
        return [FitRow("collective", "/".join(key), fit) for key, fit in sorted(self.fits.items())]


class ComputeModel:
    """Encode/decode time per (spec, device), and host<->device copies."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        # fitted on first use: a search with a few compressors reads a few of a profile's
        # twenty-odd (the fits were three quarters of a small search's set-up)
        table = profile.compressors
        groups = {key: table.iloc[rows] for key, rows in
                  table.groupby(["spec", "device"]).indices.items()}
        self.encode: Mapping[tuple[str, str], PiecewiseFit] = LazyFits(
            groups, lambda rows: fit_piecewise(rows["numel"], rows["encode_ms"]))
        self.decode: Mapping[tuple[str, str], PiecewiseFit] = LazyFits(
            groups, lambda rows: fit_piecewise(rows["numel"], rows["decode_ms"]))
        self.payload: Mapping[tuple[str, str], LinearFit] = LazyFits(
            groups, lambda rows: fit_linear(rows["numel"], rows["payload_bytes"]))
        # the part of a multi-round compressor's encode between its collectives (profiles
        # before it: none, the whole encode before the first collective)
        timed = {key: rows for key, rows in groups.items()
                 if "advance_ms" in rows.columns and (rows["advance_ms"] > 0).any()}
        self.advance: Mapping[tuple[str, str], PiecewiseFit] = LazyFits(
            timed, lambda rows: fit_piecewise(rows["numel"], rows["advance_ms"]))
        self.copies = {direction: fit_linear(rows["bytes"], rows["time_ms"])
                       for direction, rows in profile.copies.groupby("direction")}
        # the executor's decode of a gathered exchange (profiles before it: decode_ms x
        # payloads)
        self.aggregate: dict[tuple[str, str], tuple[PiecewiseFit, PiecewiseFit]] = {
            (spec, device): (fit_piecewise(rows["numel"], rows["one_ms"]),
                             fit_piecewise(rows["numel"], rows["each_ms"]))
            for (spec, device), rows in profile.aggregation.groupby(["spec", "device"])}

    def specs(self) -> set[str]:
        return {spec for spec, _ in self.encode}

    def check(self, spec: str, device: str) -> None:
        if (spec, device) not in self.encode:
            have = ", ".join(sorted(self.specs())) or "none"
            raise BytecompError(f"{self.profile.label}: compressor {spec} has no {device} timings "
                                f"in the profile (it has: {have}); re-run bytecomp profile "
                                f"--compressor {spec}")

    def encode_ms(self, spec: str, device: str, numel: float) -> float:
        return self.encode[(spec, device)](numel)

    def decode_ms(self, spec: str, device: str, numel: float) -> float:
        return self.decode[(spec, device)](numel)

    def advance_ms(self, spec: str, device: str, numel: float) -> float:
        """The part of :meth:`encode_ms` computed between the collectives (never more)."""
        fit = self.advance.get((spec, device))
        return min(fit(numel), self.encode_ms(spec, device, numel)) if fit is not None else 0.0

    def aggregate_ms(self, spec: str, device: str, numel: float, payloads: int) -> float:
        """Decompress ``payloads`` payloads of ``numel`` elements and average them, as the
        executor does for a gathered exchange: from the profile's aggregation sweep where
        it has one (a float32 sum, the average and the copy out cost passes of their
        own), else ``payloads`` decodes."""
        fits = self.aggregate.get((spec, device))
        if fits is None:
            return payloads * self.decode_ms(spec, device, numel)
        one, each = fits
        return one(numel) + (payloads - 1) * each(numel)

    def measured_payload(self, spec: str, device: str, numel: float) -> float:
        return self.payload[(spec, device)](numel)

    def copy_ms(self, direction: str, nbytes: float) -> float:
        fit = self.copies.get(direction)
        return fit(nbytes) if fit is not None else 0.0

    def rows(self) -> list[FitRow]:
        rows = []
        for name, fits in (("encode", self.encode), ("decode", self.decode),
                           ("advance", self.advance)):
            rows += [FitRow(name, f"{spec}/{device}", fit) for (spec, device), fit in
                     sorted(fits.items())]
        rows += [FitRow("copy", direction, fit) for direction, fit in sorted(self.copies.items())]
        return rows


def fit_quality(rows: list[FitRow]) -> pd.DataFrame:
    """One row per fit: its form, fixed cost ``a_ms`` (a piecewise curve's time at its
    smallest size), slope (a piecewise curve's last segment, its extrapolation), and
    the worst relative error at the sweep's points."""
    return pd.DataFrame([{"model": row.kind, "key": row.key,
                          "form": "piecewise" if isinstance(row.fit, PiecewiseFit) else "line",
                          "a_ms": row.fit.intercept, "b_ms_per_unit": row.fit.slope,
                          "r2": row.fit.r2, "worst_rel_error": row.fit.worst_relative_error,
                          "points": row.fit.points} for row in rows])
