"""The per-user cache of a cluster's tables: measured once, reused by every later profile
on the same cluster.

A profile that measured the cluster's tables (the collective, compressor, aggregation
and copy sweeps, the executor's fixed costs: :mod:`bytecomp.profiler.calibration`)
writes them as a calibration directory under :func:`cache_root`, one entry per
:class:`ClusterKey` (what ``--calibration`` matches on before any rank starts: the
ranks, nodes and ranks per node, backend, device type and name, compressor path,
threads per rank, and the sweep's ``--quick``). A later profile with the same key
reuses the entry as it would ``--calibration DIR``, link check included, and says so
in one line naming ``--no-cache``. The entry is data: it is validated like any
calibration, and one that does not load, was written for another key, lacks the
compressors or sizes this profile needs, or fails the link check is set aside in one
line and measured afresh (then replaced). Entries are written atomically
(:func:`bytecomp.files.directory_atomic`), so a crash leaves the old entry or none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bytecomp.compress import canonical
from bytecomp.errors import BytecompError

CACHE_ENV = "BYTECOMP_CACHE_DIR"  # where the cache lives (tests point it at a tmp dir)
FRESH_OPTION = "--no-cache"  # the option that measures the cluster afresh


def cache_root() -> Path:
    """``$BYTECOMP_CACHE_DIR``, else ``$XDG_CACHE_HOME/bytecomp``, else
    ``~/.cache/bytecomp``; the cluster entries are in its ``clusters`` folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "clusters"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bytecomp" / "clusters"


@dataclass(frozen=True)
class ClusterKey:
    """What a cached entry must match: the job's shape, backend, device, compressor path,
    threads per rank (on a CPU job) and whether the sweep was ``--quick``."""

    world_size: int
    nodes: int
    ranks_per_node: int
    backend: str
    device_type: str
    device_name: str
    compress_kernels: str
    threads_per_rank: int
    quick: bool

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def path(self) -> Path:
        return cache_root() / self.digest()


def lookup(key: ClusterKey, specs: list[str], needed_bytes: int,
           say: Callable[[str], None]) -> Path | None:
    """The cached entry for ``key`` if it is a valid calibration made for that key, timed
    every one of ``specs`` and swept sizes up to ``needed_bytes``; else None, with one
    line (``say``) for an entry that is there but cannot serve."""
    from bytecomp.profiler.calibration_file import load_calibration

    path = key.path()
    if not path.exists():
        return None
    try:
        calibration = load_calibration(path)
    except BytecompError as error:
        say(f"the cached cluster tables in {path} are damaged and not used ({error}); "
            f"measuring them afresh")
        return None
    if calibration.meta.get("cache_key") != asdict(key):
        say(f"the cached cluster tables in {path} were made for another job; measuring "
            f"them afresh")
        return None
    missing = [spec for spec in specs if canonical(spec) not in set(calibration.specs)]
    swept = int((calibration.meta.get("sweep") or {}).get("max_bytes", 0) or 0)
    if missing:
        say(f"the cached cluster tables have no timings of {', '.join(missing)}; measuring "
            f"the cluster afresh")
        return None
    if swept < needed_bytes:
        say(f"the cached cluster tables were swept up to {swept:,} bytes, this model's "
            f"plans use {needed_bytes:,}; measuring the cluster afresh")
        return None
    return path


def keep(key: ClusterKey, write: Callable[[Path], None], say: Callable[[str], None]) -> None:
    """``write(path)`` the entry of ``key``; a cache that cannot be written (a read-only
    home, a full disk) costs the next profile its reuse, not this one its result: one
    line, no error."""
    try:
        write(key.path())
    except (OSError, BytecompError) as error:
        say(f"the cluster's tables could not be kept in the cache ({error}); the next "
            f"profile measures them again ({CACHE_ENV} sets where the cache is)")


def reuse_line(calibration) -> str:
    """The line a profile that reuses the cache prints."""
    return (f"the cluster's tables come from the cache ({calibration.path}, measured "
            f"{calibration.measured}): {FRESH_OPTION} measures them afresh")
