"""Cluster configs: shipped ones by name (``gbe1``), or a user's YAML file.

The shipped configs are package data (``bytecomp/configs/clusters/<name>.yaml``,
read with :mod:`importlib.resources`, so an installed wheel has them); the
checkout's top-level ``configs/clusters`` is a link to that folder.

::

    name: gbe10
    nodes: 8
    ranks_per_node: 1
    cpu_cores: 16                                     # optional: a node's cores, for host offload
    links:
      inter: {bandwidth_gbps: 9.49, latency_us: 25}   # each number with its source
      intra: profile                                  # or: alpha and beta fitted from the profile

``intra`` is required when ``ranks_per_node > 1``, ``inter`` when ``nodes > 1``.
A link may say what it is (``type``: ``nvlink``, ``pcie`` or ``net``; default
``pcie`` inside a node, ``net`` between nodes): NCCL's per-hop latencies
depend on it (:mod:`bytecomp.costs.nccl`). ``bandwidth_gbps`` is the bus
bandwidth a rank gets on the link (per GPU inside a node, per node between
nodes), ``latency_us`` the per-message cost of one step of gloo's ring. A
link given as ``profile`` takes its per-message and per-byte costs from the
profile's fitted sweeps, so a profile can be extrapolated to more ranks.
``cpu_cores`` is what a node's ranks share for host-side compression.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from bytecomp.errors import BytecompError
from bytecomp.files import control_character, read_text_file
from bytecomp.safe_yaml import load_yaml
from bytecomp.schema import MAX_COUNT

MAX_CPU_CORES = 1 << 16  # a node's cores
# Physical ranges of a link (docs/formats.md): from a 1 Mbit/s link to 100 Tbit/s (beyond
# any NVLink generation), and a per-message latency up to one second (a satellite hop is
# ~0.6 s); outside them a number is a typo, and the models' arithmetic overflows.
BANDWIDTH_GBPS = (1e-3, 1e5)
LATENCY_US = (0.0, 1e6)

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11+
    from importlib.resources.abc import Traversable

SHIPPED = ("configs", "clusters")  # inside the bytecomp package


LINK_TYPES = ("nvlink", "pcie", "net")
DEFAULT_LINK_TYPE = {"intra": "pcie", "inter": "net"}


@dataclass(frozen=True)
class Link:
    """Per-message latency and per-direction bandwidth of one link kind, and what it is
    (``nvlink``, ``pcie`` or ``net``: NCCL's hardware classes)."""

    latency_us: float
    bandwidth_gbps: float
    type: str = "net"

    @property
    def alpha_ms(self) -> float:
        return self.latency_us / 1000.0

    @property
    def beta_ms_per_byte(self) -> float:
        return 8.0 / (self.bandwidth_gbps * 1e9) * 1000.0


PROFILE_LINK = "profile"


@dataclass(frozen=True)
class Cluster:
    """The shape of a job and its links (``None`` links: use the profile's fits)."""

    name: str
    nodes: int
    ranks_per_node: int
    intra: Link | str | None = None
    inter: Link | str | None = None
    cpu_cores: int | None = None  # per node, shared by its ranks' host workers

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def measured(self) -> bool:
        """True for the profiled cluster itself: collectives come straight from the fits."""
        return self.intra is None and self.inter is None


def shipped_clusters() -> dict[str, Traversable]:
    """The shipped cluster configs by name."""
    folder = files("bytecomp").joinpath(*SHIPPED)
    return {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir()
            if entry.name.endswith(".yaml") and entry.is_file()}


def available_clusters() -> list[str]:
    return sorted(shipped_clusters())


def cluster_file(name_or_path: str) -> Path | None:
    """The file a ``--cluster`` value names, or None for a shipped config's name."""
    path = Path(name_or_path)
    try:
        is_file = path.suffix in (".yaml", ".yml") or path.exists() or path.is_symlink()
    except OSError:  # a name too long to be a file: then it is not one
        is_file = True
    return path if is_file else None


def _read(name_or_path: str) -> tuple[str, str]:
    """The config's text and the label its errors name (a file's path)."""
    path = cluster_file(name_or_path)
    if path is not None:
        return read_text_file(path, "cluster config"), str(path)
    shipped = shipped_clusters()
    if name_or_path not in shipped:
        raise BytecompError(f"unknown cluster {name_or_path!r}; choose from "
                            f"{', '.join(sorted(shipped))} or give a YAML file")
    return shipped[name_or_path].read_text(), f"shipped cluster {name_or_path}"


CLUSTER_FIELDS = ("name", "nodes", "ranks_per_node", "links", "cpu_cores")
LINK_FIELDS = ("bandwidth_gbps", "latency_us", "type")


def check_fields(mapping: dict, allowed: tuple[str, ...], where: str) -> None:
    """One line for a key of ``mapping`` not in ``allowed``, naming it and its closest
    allowed key (a typo such as ``ranks_per_nod`` is named, not reported as the key it
    misspells being missing)."""
    import difflib

    for key in mapping:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise BytecompError(f"{where} has unknown field {key!r}{hint}; valid: "
                            f"{', '.join(allowed)}")


def _link(path: str, kind: str, value) -> Link | str:
    if value == PROFILE_LINK:
        return PROFILE_LINK
    if not isinstance(value, dict):
        raise BytecompError(f"{path}: links.{kind} must be a mapping with bandwidth_gbps "
                            f"and latency_us, or 'profile'")
    check_fields(value, LINK_FIELDS, f"{path}: links.{kind}")
    numbers: dict = {}
    for field in ("bandwidth_gbps", "latency_us"):
        number = value.get(field)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise BytecompError(f"{path}: links.{kind}.{field} must be a number")
        numbers[field] = float(number)
    for field, (low, high) in (("bandwidth_gbps", BANDWIDTH_GBPS), ("latency_us", LATENCY_US)):
        if not low <= numbers[field] <= high:  # also false for NaN
            raise BytecompError(f"{path}: links.{kind}.{field} must be from {low:g} to "
                                f"{high:g}, got {numbers[field]:g}")
    link_type = value.get("type", DEFAULT_LINK_TYPE[kind])
    if link_type not in LINK_TYPES:
        raise BytecompError(f"{path}: links.{kind}.type must be one of {', '.join(LINK_TYPES)}")
    return Link(**numbers, type=link_type)


def load_cluster(name_or_path: str) -> Cluster:
    """A shipped cluster by name (``gbe10``) or a config file, validated."""
    text, path = _read(name_or_path)
    data = load_yaml(text, path)
    if not isinstance(data, dict):
        raise BytecompError(f"{path}: must be a YAML mapping")
    check_fields(data, CLUSTER_FIELDS, path)
    for field in ("nodes", "ranks_per_node"):
        value = data.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
            raise BytecompError(f"{path}: {field} must be a positive integer (at most "
                                f"{MAX_COUNT:,})")
    links = data.get("links") or {}
    if not isinstance(links, dict):
        raise BytecompError(f"{path}: links may only have 'intra' and 'inter'")
    check_fields(links, ("intra", "inter"), f"{path}: links")
    if data["ranks_per_node"] > 1 and "intra" not in links:
        raise BytecompError(f"{path}: links.intra is required with ranks_per_node > 1")
    if data["nodes"] > 1 and "inter" not in links:
        raise BytecompError(f"{path}: links.inter is required with nodes > 1")
    parsed = {kind: _link(path, kind, value) for kind, value in links.items()}
    cores = data.get("cpu_cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int)
                              or not 1 <= cores <= MAX_CPU_CORES):
        raise BytecompError(f"{path}: cpu_cores must be an integer from 1 to {MAX_CPU_CORES:,}")
    name = data.get("name", Path(name_or_path).stem)
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise BytecompError(f"{path}: name must be a string of 1 to 200 characters")
    control = control_character(name)
    if control:
        raise BytecompError(f"{path}: name holds the control character {control} (a name is "
                            f"printed: no escape sequences)")
    return Cluster(name, data["nodes"], data["ranks_per_node"], parsed.get("intra"),
                   parsed.get("inter"), cores)
