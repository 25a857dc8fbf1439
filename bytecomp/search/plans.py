"""A search result as a plan file, and a plan file checked against a profile and a
cluster and simulated on a planner's model."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import bytecomp
from bytecomp.comm.schemes import scheme_of
from bytecomp.costs.clusters import Cluster
from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan, PlanEntry
from bytecomp.profile_store import Profile
from bytecomp.search.problem import Group, Problem
from bytecomp.search.result import SearchResult, fp32_ms
from bytecomp.timeline.simulator import simulate

if TYPE_CHECKING:
    from bytecomp.search.planner import Planner


def plan_entries(problem: Problem, assignment: list[int], cap_mb: float) -> list[PlanEntry]:
    """An assignment's entries at a bucket cap, grouped as the planner groups (DDP's
    buckets, one group per option inside each), in the tensors' ready order."""
    entries = []
    for group_id, group in enumerate(problem.groups(assignment, cap_mb)):
        option = problem.options[group.option]
        for position in group.members:
            entries.append(PlanEntry.of(problem.tensors[position].name, option, group_id))
    order = {t.name: i for i, t in enumerate(problem.tensors)}
    entries.sort(key=lambda e: order[e.name])
    return entries


def to_plan(result: SearchResult, profile: Profile) -> Plan:
    """The plan file's content for a search result."""
    problem = result.problem
    entries = plan_entries(problem, result.assignment, result.cap_mb)
    fp32 = fp32_ms(result)
    predicted = {"plan": round(result.time_ms, 4),
                 "baselines": {b.name: round(b.time_ms, 4) for b in result.baselines},
                 "speedup_vs_fp32": round(fp32 / result.time_ms, 4)}
    search = {"algorithm": result.algorithm, "time_ms": round(result.search_ms, 2),
              "lower_bound_ms": round(result.lower_bound_ms, 4), "gap": round(result.gap, 4),
              "gap_known": result.gap_known, "exact": result.exact, "evaluations": result.evaluations,
              "options": len(problem.options)}
    info = {"bytecomp_version": bytecomp.__version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "profile": {"path": str(profile.path) if profile.path else None,
                        "model": profile.meta["model"]["spec"],
                        "created": profile.meta.get("created")},
            "cluster": result.cluster.name,
            "objective": {"name": result.objective.name,
                          "min_fidelity": result.objective.min_fidelity,
                          "fidelity_weights": result.objective.weights}}
    if result.fidelity is not None:  # the whole gradient's gain, and effective times
        info["fidelity"] = {
            "plan": round(result.fidelity, 6),
            "baselines": {b.name: round(b.fidelity or 0.0, 6) for b in result.baselines},
            "effective_ms": {"plan": _rounded(result.effective_ms),
                             "baselines": {b.name: _rounded(b.effective_ms)
                                           for b in result.baselines}}}
    cluster = result.cluster
    return Plan(profile.fingerprint, cluster.world_size, cluster.nodes, cluster.ranks_per_node,
                result.cap_mb, entries, predicted, search, info,
                host_workers=problem.host_workers)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4) if math.isfinite(value) else None


def check_plan_fits(plan: Plan, profile: Profile, cluster: Cluster | None) -> None:
    """The plan was made for this profile's model and for the cluster's shape (nodes x
    ranks per node; the profiled one without ``cluster``), or a one-line error."""
    if plan.model_fingerprint != profile.fingerprint:
        raise BytecompError(f"{plan.path or 'the plan'} was made for another model (fingerprint "
                            f"{plan.model_fingerprint[:12]}, profile {profile.fingerprint[:12]})")
    check_plan_shape(plan, profile, cluster)


def check_plan_shape(plan: Plan, profile: Profile, cluster: Cluster | None) -> None:
    """The plan's nodes x ranks per node are the cluster's (the profiled one's without
    ``cluster``), or a one-line error."""
    label = plan.path or "the plan"
    shape = (cluster.nodes, cluster.ranks_per_node) if cluster else \
        (profile.nodes, profile.ranks_per_node)
    if (plan.nodes, plan.ranks_per_node) != shape:
        where = f"cluster {cluster.name}" if cluster else f"the profile ({profile.label})"
        raise BytecompError(f"{label} is for {plan.nodes} x {plan.ranks_per_node} ranks (nodes "
                            f"x ranks per node) but {where} has {shape[0]} x {shape[1]}; pass "
                            f"--cluster with the plan's cluster")


def simulate_plan(planner: Planner, plan: Plan, record: bool = True):
    """Simulate a plan file's own groups (whatever rule made them) on the planner's model."""
    check_plan_shape(plan, planner.profile, None if planner.cluster.measured else planner.cluster)
    problem = planner.problem
    position = {t.name: i for i, t in enumerate(problem.tensors)}
    missing = [e.name for e in plan.entries if e.name not in position]
    planned = plan.by_name()  # (once: a lookup per tensor made it quadratic)
    unknown = [t.name for t in problem.tensors if t.name not in planned]
    if missing or unknown:
        name = (missing or unknown)[0]
        raise BytecompError(f"{plan.path}: tensor {name!r} is "
                            f"{'not in the profile' if missing else 'missing from the plan'}; "
                            f"was the plan made for another model?")
    owner = problem.bucket_of(plan.bucket_cap_mb)
    groups = []
    cluster = planner.cluster
    for group_id, entries in sorted(plan.groups().items()):
        option = entries[0].option
        infeasible = scheme_of(option.scheme).infeasible(cluster.nodes, cluster.ranks_per_node)
        if infeasible:
            raise BytecompError(f"{plan.path}: tensor {entries[0].name!r} uses the "
                                f"{option.scheme} scheme, which {infeasible}; the cluster is "
                                f"{cluster.nodes} x {cluster.ranks_per_node}")
        if option not in problem.options:
            if option.compressed:
                planner.compute.check(option.spec, "cpu" if option.place == "host"
                                      else planner.profile.device_type)
            problem.add_option(option)
        members = tuple(sorted(position[e.name] for e in entries))
        release = max(owner[m] for m in members)  # the executor launches it then
        groups.append((release, group_id, Group(release, problem.options.index(option), members)))
    ordered = [group for _, _, group in sorted(groups, key=lambda item: item[:2])]
    assignment = [0] * len(problem.tensors)
    for group in ordered:
        for member in group.members:
            assignment[member] = group.option
    model = problem.iteration_model(plan.bucket_cap_mb,
                                    problem.is_native(assignment, plan.bucket_cap_mb))
    if model.host_workers != plan.host_workers:  # the executor's pool is the plan's
        model = replace(model, host_workers=plan.host_workers)
    return simulate(model, problem.sim_groups(ordered, plan.bucket_cap_mb), record)
