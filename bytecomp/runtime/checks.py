"""Checks before the first step: the plan fits the model and the job, every rank holds
the same plan, and DDP's bucket cap is the plan's."""

from __future__ import annotations

import warnings

import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.naming import Normalized, normalize
from bytecomp.plan_types import Plan, fingerprint

MIB = 1 << 20


def match_parameters(plan: Plan, model) -> tuple[dict, str | None]:
    """The model's trainable parameters keyed by the plan's names, matched through
    normalized names (:mod:`bytecomp.naming`: a plan made on the bare model runs on it
    wrapped, compiled or inside a LightningModule); parameters the plan does not name
    keep their own. Also what does not match, in one line, or None."""
    own = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    model_names = normalize(n for n, _ in own)
    plan_names = normalize(e.name for e in plan.entries)
    own_names = {n for n, _ in own}
    if all(e.name in own_names for e in plan.entries):
        # every planned name as it is (a plan naming a few tensors, the rest on fallback,
        # may share a prefix the model's names do not): no normalizing
        model_names = Normalized({n: n for n, _ in own})
        plan_names = Normalized({e.name: e.name for e in plan.entries})
    planned = {norm: raw for raw, norm in plan_names.names.items()}
    params = {planned.get(model_names.names[n], n): p for n, p in own}
    problem = None
    missing = [e.name for e in plan.entries if e.name not in params]
    unknown = [n for n, _ in own if model_names.names[n] not in planned]
    if missing or unknown:
        first = unknown[0] if unknown else None
        if first is None:
            what = f"the plan's tensor {missing[0]!r} is not in the model"
        else:
            normal = model_names.names[first]
            shown = f"{first!r}" + (f" (normalized {normal!r})" if normal != first else "")
            what = f"the model's parameter {shown} is not in the plan"
        problem = (f"{what}; prefixes tried: model {model_names.tried()}, plan "
                   f"{plan_names.tried()}")
    return params, problem


def local_problem(plan: Plan, model, params: dict, fallback: str | None,
                  mismatch: str | None) -> str | None:
    """What is wrong with ``plan`` for this rank's model and job, or None. ``mismatch``:
    :func:`match_parameters`'s finding."""
    world = dist.get_world_size()
    if plan.world_size != world:
        planned = plan.info.get("cluster")
        made = f" (it was made for cluster {planned!r})" if isinstance(planned, str) else ""
        return (f"the plan is for {plan.world_size} ranks but this job has {world}{made}: "
                f"plan again with --cluster CONFIG for {world} ranks (a cluster config whose "
                f"nodes x ranks_per_node is {world}), or run it on {plan.world_size} ranks")
    for entry in plan.entries:
        if entry.name not in params:
            return (f"{mismatch} (a plan for another model? fallback=\"fp32\" allreduces the "
                    f"parameters a plan lacks in fp32, but every tensor it names must be in "
                    f"the model)")
    if fallback is None:
        if mismatch is not None:
            return f"{mismatch} (pass fallback=\"fp32\" to allreduce unplanned tensors in fp32)"
        if fingerprint(model) != plan.model_fingerprint:
            return "the plan was made for another model (its fingerprint differs: " \
                   "parameter names, shapes or dtypes changed)"
    return None


def agree(plan: Plan, problem: str | None, caller: str = "apply_plan") -> None:
    """Every rank learns every rank's problem and plan digest; all fail alike, naming
    ``caller`` (the function the user called: ``apply_plan`` or ``comm_hook``)."""
    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, (problem, plan.digest()))
    for rank, (their_problem, _) in enumerate(reports):
        if their_problem:
            raise BytecompError(f"bytecomp.{caller}: rank {rank}: {their_problem}")
    digests = [digest for _, digest in reports]
    if len(set(digests)) > 1:
        differing = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
        raise BytecompError(f"bytecomp.{caller}: the plan differs between ranks "
                            f"({differing}); every rank must load the same plan")


def check_bucket_cap(ddp, plan: Plan) -> None:
    """Warn when DDP's buckets are not the ones the plan was made for."""
    cap = getattr(ddp, "bucket_bytes_cap", None)
    if cap is not None and abs(cap - plan.bucket_cap_mb * MIB) > 1:
        warnings.warn(f"DDP's bucket cap is {cap / MIB:g} MiB but the plan was made for "
                      f"{plan.bucket_cap_mb:g}; pass bucket_cap_mb={plan.bucket_cap_mb:g} "
                      f"to DistributedDataParallel", stacklevel=3)
