"""DDP's gradient buckets, reproduced (shared by the plan format, the simulator and the
search, so it imports nothing of theirs).

After its first iteration DDP rebuilds its buckets in the order gradients
became ready: it walks the parameters in that order, keeps one open bucket per
dtype (and device), and closes a bucket as soon as its size reaches the limit,
the parameter that crossed it included. The first bucket's limit is 1 MiB
(``dist._DEFAULT_FIRST_BUCKET_BYTES``) when DDP runs with its default cap, and
the cap itself when ``bucket_cap_mb`` is given (torch >= 2.9); the others use
the cap. Buckets keep the order in which they closed; the ones still open at
the end follow (by their earliest-ready parameter). A cap of 0 closes every
bucket at its first parameter: one bucket per tensor, no merging (DDP does the
same with ``bucket_cap_mb=0``).
"""

from __future__ import annotations

from collections.abc import Sequence

MIB = 1 << 20
DEFAULT_CAP_MB = 25.0
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
PER_TENSOR = 0.0  # bucket_cap_mb 0: one bucket per tensor
SEARCHED_CAPS_MB = (PER_TENSOR, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)  # beside the profiled cap


def cap_label(cap_mb: float) -> str:
    """A bucket cap as shown to users: ``25``, or ``0 (per tensor)``."""
    return "0 (per tensor)" if cap_mb == PER_TENSOR else f"{cap_mb:g}"


def bucket_limits(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket's limit, every other bucket's limit) in bytes."""
    if bucket_cap_mb is None:
        return DEFAULT_FIRST_BUCKET_BYTES, int(DEFAULT_CAP_MB * MIB)
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


def ddp_buckets(sizes: Sequence[int], dtypes: Sequence[str] | None = None,
                bucket_cap_mb: float | None = DEFAULT_CAP_MB) -> list[list[int]]:
    """Buckets (lists of positions in ready order) for tensors of ``sizes`` bytes
    given in gradient-ready order. ``bucket_cap_mb=None`` is DDP's default."""
    first, cap = bucket_limits(bucket_cap_mb)
    dtypes = dtypes or ["float32"] * len(sizes)
    open_buckets: dict[str, tuple[list[int], int]] = {}
    limits: dict[str, int] = {}
    closed: list[list[int]] = []
    for position, (size, dtype) in enumerate(zip(sizes, dtypes)):
        members, total = open_buckets.get(dtype, ([], 0))
        members.append(position)
        total += size
        limit = limits.setdefault(dtype, first)
        if total >= limit:
            closed.append(members)
            open_buckets.pop(dtype, None)
            limits[dtype] = cap
        else:
            open_buckets[dtype] = (members, total)
    closed += sorted((members for members, _ in open_buckets.values()), key=min)
    return closed
