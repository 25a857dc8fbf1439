"""The planning problem's inputs read from a profile and a cluster: its tensors, the
compressors to plan with, its size limit and the host-offload workers."""

from __future__ import annotations

from bytecomp.compress import canonical, from_spec
from bytecomp.costs.clusters import Cluster
from bytecomp.costs.fitted import ComputeModel
from bytecomp.errors import BytecompError
from bytecomp.plan_file import MAX_HOST_WORKERS
from bytecomp.plan_types import HOST_WORKERS
from bytecomp.profile_store import Profile
from bytecomp.profile_tables import ELEMENT_SIZES
from bytecomp.search.problem import Tensor

MAX_TENSORS = 50_000  # parameter tensors a profile may have to be planned (docs/search.md)


def host_workers_of(cluster: Cluster) -> int:
    """Host-offload workers per rank: a node's cores shared by its ranks (the cluster
    config's ``cpu_cores``), else the executor's default pool."""
    if cluster.cpu_cores is None:
        return HOST_WORKERS
    return min(MAX_HOST_WORKERS, max(1, cluster.cpu_cores // cluster.ranks_per_node))


def parse_shape(text) -> tuple:
    text = str(text).strip()
    return tuple(int(part) for part in text.split("x")) if text else ()


def tensors_of(profile: Profile) -> list[Tensor]:
    rows = profile.tensors.sort_values("ready_ms", kind="stable")
    return [Tensor(row.name, int(row.numel), parse_shape(row.shape), float(row.ready_ms),
                   ELEMENT_SIZES.get(row.dtype, 4), row.dtype) for row in rows.itertuples()]


def choose_specs(profile: Profile, requested: list[str] | None, compute: ComputeModel) -> list[str]:
    """Canonical specs to plan with; every one must have timings in the profile."""
    if requested:
        specs = [canonical(spec) for spec in requested]
    else:
        specs = sorted(s for s in compute.specs() if from_spec(s).compresses)
    for spec in specs:
        compute.check(spec, profile.device_type)
    return [spec for spec in dict.fromkeys(specs) if from_spec(spec).compresses]


def check_size(profile: Profile) -> None:
    """At most :data:`MAX_TENSORS` tensors, or one line before any work: the search's
    set-up (baselines, bounds, screens) grows with the tensors, and beyond the range it
    is measured on it would not fit its time cap."""
    count = len(profile.tensors)
    if count > MAX_TENSORS:
        raise BytecompError(f"{profile.label}: {count:,} parameter tensors, more than the "
                            f"{MAX_TENSORS:,} bytecomp plans; merge small parameters into "
                            f"larger ones (e.g. fused layers), or plan part of the model")
