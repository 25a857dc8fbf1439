"""Checks before the first step: the plan fits the model and the job, every rank holds
the same plan, and DDP's bucket cap is the plan's."""

from __future__ import annotations

import warnings

import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.plan import Plan, fingerprint

MIB = 1 << 20


def local_problem(plan: Plan, model, params: dict, fallback: str | None) -> str | None:
    """What is wrong with ``plan`` for this rank's model and job, or None."""
    world = dist.get_world_size()
    if plan.world_size != world:
        return f"the plan is for {plan.world_size} ranks but this job has {world}"
    names = plan.by_name()
    for name in names:
        if name not in params:
            return f"the plan names tensor {name!r}, which the model does not have " \
                   f"(a plan for another model?)"
    unknown = [n for n in params if n not in names]
    if fallback is None:
        if unknown:
            return f"tensor {unknown[0]!r} is not in the plan (pass fallback='fp32' " \
                   f"to allreduce unplanned tensors in fp32)"
        if fingerprint(model) != plan.model_fingerprint:
            return "the plan was made for another model (its fingerprint differs: " \
                   "parameter names, shapes or dtypes changed)"
    return None


def agree(plan: Plan, problem: str | None) -> None:
    """Every rank learns every rank's problem and plan digest; all fail alike."""
    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, (problem, plan.digest()))
    for rank, (their_problem, _) in enumerate(reports):
        if their_problem:
            raise BytecompError(f"bytecomp.apply_plan: rank {rank}: {their_problem}")
    digests = [digest for _, digest in reports]
    if len(set(digests)) > 1:
        differing = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
        raise BytecompError(f"bytecomp.apply_plan: the plan differs between ranks "
                            f"({differing}); every rank must load the same plan")


def check_bucket_cap(ddp, plan: Plan) -> None:
    """Warn when DDP's buckets are not the ones the plan was made for."""
    cap = getattr(ddp, "bucket_bytes_cap", None)
    if cap is not None and abs(cap - plan.bucket_cap_mb * MIB) > 1:
        warnings.warn(f"DDP's bucket cap is {cap / MIB:g} MiB but the plan was made for "
                      f"{plan.bucket_cap_mb:g}; pass bucket_cap_mb={plan.bucket_cap_mb:g} "
                      f"to DistributedDataParallel", stacklevel=3)
