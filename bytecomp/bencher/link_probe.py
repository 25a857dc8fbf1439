"""``bytecomp bench``'s link probe: the link the bench runs on against the cluster its
predictions are for, and the clock that times a rank's work."""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from bytecomp.profile_store import Profile

# The link the bench runs on against the cluster its predictions are for: an fp32 allreduce
# over the world of at most LINK_PROBE_BYTES (the model's gradients, within the profile's
# sweep), timed LINK_REPEATS times after two warm-up rounds (the slowest rank's, median),
# against the cluster model's time for it. Off by more than LINK_MISMATCH either way, every
# prediction is for another network: one warning says so.
LINK_PROBE_BYTES = 4 << 20
LINK_REPEATS = 5
LINK_MISMATCH = 2.0


def clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def allreduce_ms(nbytes: int, device, repeats: int = LINK_REPEATS) -> float:
    """The median of ``repeats`` fp32 allreduces of ``nbytes`` over the world, each the
    slowest rank's, after two warm-up rounds (collective: every rank)."""
    buffer = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    times = []
    for index in range(repeats + 2):
        dist.barrier()
        start = clock(device)
        dist.all_reduce(buffer)
        elapsed = clock(device) - start
        if index >= 2:
            times.append(1000 * elapsed)
    table = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return statistics.median(table.tolist())


def link_warning(profile: Profile, cluster, device) -> str | None:
    """One line where the link this job runs on differs from the cluster the predictions
    are for (``cluster``, None: the profiled one) by more than :data:`LINK_MISMATCH`,
    else None (collective: every rank measures)."""
    from bytecomp.costs.fitted import CommModel, profiled_cluster

    target = cluster or profiled_cluster(profile)
    sweep = profile.collectives
    sweep = sweep[(sweep["collective"] == "allreduce") & (sweep["group"] == "world")]
    largest = int(sweep["bytes"].max()) if len(sweep) else LINK_PROBE_BYTES
    nbytes = max(4, min(LINK_PROBE_BYTES, int(profile.tensors["bytes"].sum()), largest))
    measured = allreduce_ms(nbytes, device)
    predicted = CommModel(profile, target).time_ms("allreduce", "world", "float32", nbytes)
    return link_mismatch(measured, predicted, nbytes, target.name)


def link_mismatch(measured_ms: float, predicted_ms: float, nbytes: int,
                  cluster: str) -> str | None:
    """The warning of :func:`link_warning` where ``measured_ms`` and ``predicted_ms`` differ
    by more than :data:`LINK_MISMATCH` either way, else None."""
    ratio = measured_ms / predicted_ms if predicted_ms > 0 else math.inf
    if 1 / LINK_MISMATCH <= ratio <= LINK_MISMATCH:
        return None
    how = f"{ratio:.2g}x slower" if ratio > 1 else f"{1 / ratio:.2g}x faster"
    return (f"this job's network does not match {cluster}, which the predictions are for: "
            f"an fp32 allreduce of {nbytes / (1 << 20):.3g} MiB took {measured_ms:.3g} ms "
            f"here, {how} than the {predicted_ms:.3g} ms predicted, so the measured times "
            f"will not follow the predictions (bench on that network, under bytecomp "
            f"emulate, or pass --cluster with this one's)")
