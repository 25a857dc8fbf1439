"""From a profile and a cluster to the best assignment, with baselines and a bound."""

from __future__ import annotations

import contextlib
import gc
import math
import time

from bytecomp.comm.schemes import scheme_of
from bytecomp.compress import from_spec
from bytecomp.costs.clusters import PROFILE_LINK, Cluster
from bytecomp.costs.executor_costs import ExecutorCosts
from bytecomp.costs.fit_quality import collective_quality, compressor_quality
from bytecomp.costs.fitted import CommModel, ComputeModel, profiled_cluster
from bytecomp.costs.gains import FidelityModel
from bytecomp.costs.scheme_costs import scheme_cost
from bytecomp.costs.strategy import StrategyCosts, cast_specs
from bytecomp.errors import BytecompError
from bytecomp.plan_record import OBJECTIVES
from bytecomp.plan_types import NO_COMPRESSION
from bytecomp.profile_store import Profile
from bytecomp.search.algorithms import (
    Budget,
    Point,
    anneal,
    greedy_over_caps,
)
from bytecomp.search.baselines import (
    baseline_options,
    baseline_to_keep,
    native_option,
    powersgd_hook_assignment,
)
from bytecomp.search.bound import channel_floors, relaxed_bound, relaxed_bound_ceiling
from bytecomp.search.channel_bound import lower_bound
from bytecomp.search.exact import ExactResult, exact_search
from bytecomp.search.problem import Objective, Problem
from bytecomp.search.profile_inputs import check_size, choose_specs, host_workers_of, tensors_of
from bytecomp.search.result import LOOSE_GAP, Baseline, SearchResult, composition_of
from bytecomp.search.settings import (
    LARGE_TENSORS,
    BaselineKind,
    SearchOptions,
    default_caps,
    default_evaluations,
)
from bytecomp.search.tree import add_exchange, build_tree, options_of

# auto tries to prove the optimum (bytecomp/search/exact.py) of a problem of at most this
# many tensors, within this many nodes per bucket cap (a count, not a time, so the plan
# does not depend on the machine's speed: 3-7 us a node here; the 10-tensor LSTMs it
# proves take at most 2,412 at a cap); where it cannot, it anneals
EXACT_AUTO_TENSORS = 30
EXACT_AUTO_NODES = 3_000
EXACT_CAP_S = 10.0  # --algorithm exact without --budget: its time cap in seconds
# The default search stops once its plan is within this fraction (1%) of the lower bound, so
# of the optimum (the model's own error is several percent; --min-gain asks 5-10%)
DEFAULT_STOP_GAP = 0.01
DEFAULT_MIN_FIDELITY = 0.75  # GraVAC's threshold on the compression gain
# The default search's wall-clock cap without --budget (seconds from the search's start):
# it plans the documented range (up to MAX_TENSORS) in far less, so it only stops a search
# that would otherwise run on; --budget replaces it, and caps the greedy's passes, the
# exact pass and the annealing alike
SEARCH_CAP_S = 30.0


class Planner:
    """Builds the problem for a profile and cluster, then searches it."""

    def __init__(self, profile: Profile, cluster: Cluster | None = None,
                 specs: list[str] | None = None, strict: bool = False,
                 objective: str | None = None, min_fidelity: float | None = None,
                 fidelity_weights: str = "params", calibrate: bool = True) -> None:
        self.profile = profile
        check_size(profile)
        self.cluster = cluster or profiled_cluster(profile)
        if self.cluster.world_size < 2:
            raise BytecompError(f"{self.cluster.name}: a single rank has nothing to exchange, "
                                f"so there is nothing to plan; plan for a cluster of several "
                                f"ranks (--cluster, or a profile taken on several ranks)")
        self.compute = ComputeModel(profile)
        self.comm = CommModel(profile, self.cluster)
        self.specs = choose_specs(profile, specs, self.compute)
        self.notes: list[str] = []  # about the problem; each search adds its own
        # what decides between compressors beyond the model's time (one line), and what the
        # user should know is missing
        self.evidence = "iteration time alone"
        self.warnings: list[str] = []
        if specs and len(self.specs) == 1:  # the user's accuracy decision (Espresso)
            strict = True
            self.notes.append(f"only {self.specs[0]} compresses (or nothing): the plan's "
                              f"accuracy is at least that of {self.specs[0]} on every tensor")
        timed = {spec for spec, device in self.compute.encode if device == profile.device_type}
        fp16, powersgd = baseline_options(timed)  # their methods run on the device
        self.baseline_specs = {BaselineKind.FP16_HOOK: fp16, BaselineKind.POWERSGD_HOOK: powersgd}
        searched = list(self.specs)
        if not strict:  # the baselines' methods are always candidates, so no baseline wins
            searched += [s for s in (fp16, powersgd) if s and s not in searched]
        host_specs = {spec for spec, device in self.compute.encode if device == "cpu"}
        tree = build_tree(searched, self.cluster.nodes, self.cluster.ranks_per_node,
                          profile.device_type,
                          set(cast_specs({s for s, d in self.compute.encode
                                          if d == profile.device_type})),
                          host_specs, set(cast_specs(host_specs)))
        self.tree = tree
        options = options_of(tree)
        searchable = len(options)
        for spec in [s for s in (fp16, powersgd, *self.specs) if s]:
            option = native_option(spec)
            if option not in options:
                options.append(option)
        times = profile.meta["times"]
        executor = ExecutorCosts.from_meta(profile.meta.get("executor"))
        costs = StrategyCosts(self.comm, self.compute, profile.device_type, executor=executor)
        # Communication's cost to the compute stream was measured on the profiled network
        # only; a cluster config's links (GPUs, NCCL) are taken as not interfering.
        measured = (profile.meta.get("interference") or {}) if self.cluster.measured else {}
        self.problem = Problem(tensors_of(profile), times["forward"]["median_ms"],
                               times["backward_compute"]["median_ms"],
                               times["optimizer"]["median_ms"], costs, options,
                               host_workers=host_workers_of(self.cluster),
                               interference=float(measured.get("fraction", 0.0)),
                               intra_interference=measured.get("intra_fraction"),
                               bucket_hook_ms=executor.bucket_ms,
                               shared_compute=profile.device_type == "cpu",
                               busy_collective_ms=float(measured.get("busy_collective_ms", 0.0)))
        self.searchable = list(range(searchable))
        # a plan that is what PyTorch's powerSGD_hook does runs as that hook where DDP
        # makes one bucket (see bytecomp.runtime.native), without the executor's costs
        self.hooks = [hook for hook in (powersgd_hook_assignment(self.problem, spec)
                                        for spec in searched) if hook is not None]
        for hook in self.hooks:
            self.problem.add_hook(hook)
        self._set_objective(objective, min_fidelity, fidelity_weights, calibrate)

    def noise(self) -> float:
        """The profile's measured noise: half the p10-p90 spread of its iteration times,
        relative to their median (0 where it recorded no spread)."""
        times = self.profile.meta["times"]["iteration"]
        median = float(times.get("median_ms", 0.0))
        if median <= 0:
            return 0.0
        return max(0.0, float(times.get("p90_ms", median)) - float(times.get("p10_ms", median))) \
            / (2 * median)

    def _within_noise(self, baselines: list[Baseline], assignment: list[int], cap: float,
                      value: float) -> list[str]:
        """A note where another baseline is predicted as good as the plan within the
        profile's noise: a profile taken again may well choose it."""
        noise = self.noise()
        others = [b for b in baselines if (b.assignment, b.cap_mb) != (assignment, cap)
                  and math.isfinite(b.value)]
        if not others or noise <= 0 or not math.isfinite(value) or value <= 0:
            return []
        closest = min(others, key=lambda b: abs(b.value - value))
        apart = abs(closest.value - value) / value
        if apart > noise:
            return []
        return [f"the plan and the {closest.name} baseline are predicted {100 * apart:.1f}% "
                f"apart, within the profile's noise (its iteration times spread "
                f"+-{100 * noise:.1f}%): a profile taken again may choose the other"]

    def poor_fits(self, assignment: list[int]) -> list[str]:
        """The poor fits (costs/fit_quality.py) that the plan ``assignment`` is priced with: the
        sweeps of the collectives its schemes use, where the cluster's links are the
        profiled ones, and of the compressors it uses."""
        options = {self.problem.options[o] for o in assignment}
        fits = []
        if self.cluster.measured or PROFILE_LINK in (self.cluster.intra, self.cluster.inter):
            used = {c for o in options for c in scheme_cost(o.scheme).collectives_used(
                scheme_of(o.scheme), from_spec(o.spec) if o.compressed else None)}
            fits += [fit for key, fit in collective_quality(
                self.profile.collectives.to_dict("records")).items() if key[0] in used]
        rows = self.profile.compressors
        rows = rows[rows["spec"].isin({o.spec for o in options if o.compressed})]
        fits += list(compressor_quality(rows.to_dict("records")).values())
        return [fit.describe() for fit in sorted((f for f in fits if f.poor),
                                                 key=lambda fit: fit.worst_relative_error,
                                                 reverse=True)]

    def _set_objective(self, name: str | None, min_fidelity: float | None,
                       weights: str, calibrate: bool = True) -> None:
        """Effective time by default where the profile measured fidelity, else time."""
        if name is not None and name not in OBJECTIVES:
            raise BytecompError(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")
        if min_fidelity is not None and not 0 <= min_fidelity <= 1:
            raise BytecompError(f"--min-fidelity must be between 0 and 1, got {min_fidelity:g}")
        wants_fidelity = name == "effective" or min_fidelity is not None
        if name != "time":
            evidence, self.evidence = self.profile.evidence()
            if evidence and not calibrate:
                evidence, self.evidence = False, "raw gains only: the probe's calibration was " \
                                                 "turned off (--no-probe)"
            if not evidence:
                self.warnings.append(self.evidence)
        if not self.profile.has_fidelity and not wants_fidelity:
            self.notes.append("fidelity unknown (the profile has no fidelity table): planning "
                              "by iteration time alone")
            self.evidence = "iteration time alone"
            return
        name = name or "effective"
        fidelity = FidelityModel(self.profile, weights, calibrate)  # one line without the table
        used = {o.spec for o in self.problem.options if o.compressed}
        factors = {spec: f for spec, f in fidelity.factors.items() if spec in used}
        if factors:
            steps = int(self.profile.meta.get("probe", {}).get("steps", 0))
            self.notes.append(
                f"gains calibrated by the profile's convergence probe ({steps} steps): steps "
                f"factor " + ", ".join(f"{spec} {f:.2f}" for spec, f in sorted(factors.items())))
        if name == "effective":
            for option in self.problem.options:
                if option.compressed:
                    fidelity.check(option.spec)
        floor = DEFAULT_MIN_FIDELITY if min_fidelity is None else min_fidelity
        objective = Objective(name, floor if name == "effective" else 0.0, weights)
        self.problem.set_fidelity(lambda tensor, option: fidelity.gain(tensor.name, option.spec),
                                  [fidelity.shares[t.name] for t in self.problem.tensors],
                                  objective)

    # -- baselines -----------------------------------------------------------------------
    def baseline_notes(self) -> list[str]:
        """Why a baseline is missing (the profile has no timings for its method)."""
        notes = []
        if not self.baseline_specs[BaselineKind.FP16_HOOK]:
            notes.append("no fp16 timings in the profile: the fp16 hook baseline is omitted")
        if not self.baseline_specs[BaselineKind.POWERSGD_HOOK]:
            notes.append("no PowerSGD timings in the profile: its baseline is omitted")
        return notes

    def baselines(self) -> list[Baseline]:
        problem, cap = self.problem, self.profile.bucket_cap_mb
        kind = BaselineKind
        out = [Baseline(kind.FP32_DDP, kind.FP32_DDP.value,
                        problem.uniform(problem.index_of(NO_COMPRESSION)), cap)]
        fp16, powersgd = (self.baseline_specs[BaselineKind.FP16_HOOK],
                          self.baseline_specs[BaselineKind.POWERSGD_HOOK])
        if fp16:
            out.append(Baseline(kind.FP16_HOOK, kind.FP16_HOOK.value,
                                problem.uniform(problem.index_of(native_option(fp16))), cap))
        if powersgd:
            rank = from_spec(powersgd).values["rank"]
            assignment = powersgd_hook_assignment(problem, powersgd)
            assert assignment is not None  # its options are always offered
            out.append(Baseline(kind.POWERSGD_HOOK, f"{kind.POWERSGD_HOOK.value} (rank {rank})",
                                assignment, cap))
        for spec in self.specs:
            option = native_option(spec)
            out.append(Baseline(kind.EVERY_TENSOR,
                                f"{spec} {kind.EVERY_TENSOR.value} ({option.scheme})",
                                problem.uniform(problem.index_of(option)), cap, spec=spec))
        for baseline in out:
            baseline.time_ms = problem.simulate(baseline.assignment, baseline.cap_mb).iteration_ms
            baseline.fidelity = problem.fidelity(baseline.assignment)
            baseline.value = problem.objective_of(baseline.time_ms, baseline.assignment)
        return out

    # -- search ----------------------------------------------------------------------------
    def search(self, options: SearchOptions | None = None, *,
               starts: list[tuple[list[int], float]] | None = None,
               **fields) -> SearchResult:
        """Find the best assignment and bucket cap, as ``options`` say (default: a
        :class:`~bytecomp.search.settings.SearchOptions` of ``fields``, e.g.
        ``search(algorithm="greedy", min_gain=5)``); ``starts``: further
        assignments to start from, as (assignment, cap).

        1. Every start (each baseline whose options the search may use, and any
           ``starts`` given as (assignment, cap)) is evaluated at its cap; the greedy
           runs from the best of them. The lower bound is computed first: with a
           ``stop_gap`` (percent), the greedy and the annealing stop as soon as a
           plan is within it of the bound, hence of the optimum. Its default is
           :data:`DEFAULT_STOP_GAP` (1%) when neither ``evaluations`` nor
           ``budget_s`` is given, else 0 (what is asked is spent).
        2. After each of the greedy's passes its assignment is evaluated at every
           candidate cap (0: one bucket per tensor) and moves to a better one, where
           the next pass runs (:func:`~bytecomp.search.algorithms.greedy_over_caps`).
        3. Unless ``algorithm == "greedy"`` or the plan is within the stop gap:
           simulated annealing for ``evaluations`` evaluations of the model (default
           :func:`~bytecomp.search.settings.default_evaluations`), spent in full unless the stop gap is met,
           restarting from every other start and then from random assignments
           when it stalls, and a final descent (``local``: over every option, else the
           screened ones). Its random moves come from a generator seeded with
           ``seed``: the same inputs give the same plan. ``budget_s`` (default none)
           is a wall-clock cap that cuts the annealing short, the one thing that makes
           a result depend on the machine's speed.
        4. ``auto``, on a problem of at most :data:`EXACT_AUTO_TENSORS` tensors: before
           the annealing, branch and bound over buckets (:mod:`bytecomp.search.exact`)
           from the greedy's plan for at most :data:`EXACT_AUTO_NODES` nodes per cap; where it
           searches through, the plan is proven optimal (``exact``) and nothing anneals,
           else the annealing runs as above and the better plan is kept.
           ``algorithm="exact"``: the default search (not cut by ``budget_s``), then
           branch and bound from its plan until it has searched through, or until
           ``budget_s`` seconds (default :data:`EXACT_CAP_S`) from the start of the
           search: then the plan is the best found, never worse than the default
           search's, and a note says what was proved.
        5. Unless the result is predicted at least ``min_gain`` (percent)
           faster than fp32 DDP, fp32 DDP is the plan: a gain smaller than the
           model's error is not worth compressing. Only fp32 DDP, a baseline under
           every choice of compressors, so that more choice never gives a worse plan
           (:func:`~bytecomp.search.baselines.baseline_to_keep`); other plans close to
           the result are the finalists' business (trained, or trialled in the running job).

        The result is never worse on the objective than any start (before step 5).
        The lower bound is the better of a linear relaxation over every option of
        every tensor (:func:`bytecomp.search.bound.relaxed_bound`) and the channel
        bound of :func:`bytecomp.search.channel_bound.lower_bound`.
        """
        if options is None:
            options = SearchOptions(**fields)
        elif fields:
            raise TypeError("pass either SearchOptions or its fields, not both")
        with _collector_paused():
            return self._search(options, starts)

    def _hook_rank(self, assignment: list[int], cap: float) -> int | None:
        """The rank of PyTorch's PowerSGD hook that ``assignment`` at ``cap`` is, if any."""
        if assignment not in self.hooks or not self.problem.one_bucket(cap):
            return None
        spec = next((self.problem.options[i].spec for i in set(assignment)
                     if self.problem.options[i].compressed), None)
        # None: the hook compresses none of these tensors (all too small for its rank)
        return None if spec is None else from_spec(spec).values["rank"]

    def _describe(self, assignment: list[int], cap: float) -> str:
        """A searched plan in a note: the hook it is, or its strategies and bucket cap."""
        rank = self._hook_rank(assignment, cap)
        if rank is not None:
            return f"PyTorch's powerSGD_hook at rank {rank}"
        return f"{composition_of(self.problem, assignment)}, {cap:g} MB buckets"

    def _search(self, options: SearchOptions, starts) -> SearchResult:
        started = time.perf_counter()
        algorithm, budget_s, min_gain = options.algorithm, options.budget_s, options.margin
        evaluations, seed, stop_gap = options.evaluations, options.seed, options.gap
        problem = self.problem
        baselines = self.baselines()
        caps = sorted(set(options.caps or default_caps(self.profile.bucket_cap_mb,
                                                       len(problem.tensors))))
        caps = add_exchange(self.tree, {cap: problem.buckets(cap) for cap in caps})
        view = problem.restricted(len(self.searchable))
        searchable = set(self.searchable)
        offered = [Point(list(b.assignment), b.cap_mb, math.nan) for b in baselines
                   if set(b.assignment) <= searchable]
        offered += [Point(list(hook), cap, math.nan) for hook in self.hooks
                    if set(hook) <= searchable for cap in caps if problem.one_bucket(cap)]
        for assignment, cap in starts or []:
            if len(assignment) != len(problem.tensors) or not set(assignment) <= searchable:
                raise BytecompError("a start must give every tensor a searchable option")
            offered.append(Point(list(assignment), cap, math.nan))
        for point in offered:
            point.value = view.evaluate(point.assignment, point.cap)
        offered.sort(key=lambda point: point.value)
        bound = _lower_bound(view, caps)
        if stop_gap is None:  # asked for evaluations or time: spend them (exact's budget
            # is the branch and bound's, after the default search)
            spend = evaluations is not None or (budget_s is not None and algorithm != "exact")
            stop_gap = 0.0 if spend else DEFAULT_STOP_GAP
        target = bound * (1 + stop_gap) if stop_gap > 0 else -math.inf
        first = offered[0]
        # the default search's cap (--budget's, but exact's budget is its own, below)
        deadline = started + (SEARCH_CAP_S if budget_s is None or algorithm == "exact"
                              else budget_s)
        assignment, value, cap = greedy_over_caps(view, caps, first.cap, first.assignment,
                                                  target=target, deadline=deadline)
        # --algorithm exact: the default search, then branch and bound within the budget
        default = algorithm in ("auto", "exact")
        proof: ExactResult | None = None
        if default and len(problem.tensors) <= EXACT_AUTO_TENSORS:
            proof = exact_search(view, caps, assignment, cap, value, deadline,
                                 EXACT_AUTO_NODES)
            if proof.proven:
                assignment, value, cap = proof.assignment, proof.value, proof.cap
        exact = proof is not None and proof.proven
        if algorithm != "greedy" and value > target and not exact:
            if evaluations is None:
                evaluations = default_evaluations(len(problem.tensors))
            found = anneal(view, caps, Point(assignment, cap, value),
                           Budget(evaluations, deadline, target), offered[1:],
                           keep=0 if algorithm == "local" else 8, seed=seed)
            assignment, cap, value = found.assignment, found.cap, found.value
        if proof is not None and proof.value < value - 1e-9:  # found, though not proven
            assignment, value, cap = proof.assignment, proof.value, proof.cap
        stopped = value <= target
        cut = not stopped and not exact and time.perf_counter() >= deadline
        exact_note = None
        if algorithm == "exact" and not exact:
            limit = EXACT_CAP_S if budget_s is None else budget_s
            proof = exact_search(view, caps, assignment, cap, value, started + limit)
            assignment, value, cap, exact = proof.assignment, proof.value, proof.cap, \
                proof.proven
            if not exact:
                exact_note = _unproven(proof, limit, budget_s is None, bound)
        names = {"greedy": "greedy", "local": "greedy + annealing (every option)",
                 "auto": "greedy + annealing", "exact": "greedy + annealing"}
        name = "exact (branch and bound)" if exact else names[algorithm]
        if algorithm == "exact" and not exact:
            name += ", then branch and bound, stopped at its time cap"
        if stopped and not exact:
            name += f", stopped within {100 * stop_gap:g}% of the lower bound"
        if cut:
            name += f", stopped at its {deadline - started:g} s time cap"
        notes = self.notes + self.baseline_notes() + ([exact_note] if exact_note else [])
        if cut:
            whose = "--budget" if budget_s is not None and algorithm != "exact" else \
                "the default; --budget sets it"
            notes.append(f"the search stopped at its {deadline - started:g} s time cap "
                         f"({whose}) before its evaluations were spent: the plan is the best "
                         f"found")
        by_fidelity = problem.objective.uses_fidelity
        kept = baseline_to_keep(baselines, searchable, value, min_gain,
                                 problem.fidelity(assignment) if by_fidelity else None)
        unit = "ms" if problem.objective.name == "time" else "ms effective"
        searched = None
        if kept is not None:
            searched = (list(assignment), cap)
            notes.append(f"the search's plan ({self._describe(assignment, cap)}; {value:.2f} "
                         f"{unit}; --min-gain 0 keeps it) is predicted less than "
                         f"{100 * min_gain:g}% better than the {kept.name} baseline "
                         f"({kept.value:.2f} {unit})" + (
                             f", which keeps as much of the gradient or more (fidelity "
                             f"{kept.fidelity:.3f})" if by_fidelity else "") +
                         ": the plan is that baseline")
            assignment, value, cap = list(kept.assignment), kept.value, kept.cap_mb
            name += f", then the {kept.name} baseline kept (--min-gain)"
        time_ms = view.simulate(assignment, cap).iteration_ms
        rank = self._hook_rank(assignment, cap)
        if rank is not None:
            notes.append(f"the plan is what PyTorch's powerSGD_hook does at rank {rank} (PowerSGD "
                         f"on the matrices it compresses, fp32 on the rest): apply_plan "
                         f"registers that hook")
        problem.evaluations = view.evaluations
        notes += self._within_noise(baselines, assignment, cap, value)
        warnings = list(self.warnings)
        poor = self.poor_fits(assignment)
        if poor:
            warnings.append(f"the plan is priced with {len(poor)} poor fit(s) of the profile "
                            f"(the worst: {poor[0]}): its prediction may be off; re-profile "
                            f"on a quieter machine (bytecomp plan -v shows every fit)")
        return SearchResult(problem, self.cluster, self.specs, assignment, cap, time_ms, baselines,
                          name, 1000 * (time.perf_counter() - started), bound, exact,
                          view.evaluations, notes, problem.objective,
                          problem.fidelity(assignment), value, self.evidence, warnings,
                          searched)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the search: the search's caches hold
    hundreds of thousands of objects, which every full collection walks (measured: up
    to half the search time at 161 tensors), and it makes no cycles to collect."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _lower_bound(problem: Problem, caps: list[float]) -> float:
    """The better of the relaxed bound and the channel bound (the least over the caps).
    The relaxed bound, the costlier, is computed only where its ceiling (from a coarse
    grid of sizes) is above the channel bound: elsewhere it cannot be the better one."""
    floors = channel_floors(problem, caps)
    channel = min(lower_bound(problem, cap, floors) for cap in caps)
    if len(problem.tensors) > LARGE_TENSORS or relaxed_bound_ceiling(problem, caps) <= channel:
        return channel
    return max(channel, relaxed_bound(problem, caps))


def _unproven(proof: ExactResult, limit: float, default: bool, bound: float) -> str:
    """The note of an exact search stopped at its time cap: what it proved."""
    gap = max(0.0, proof.value / bound - 1.0) if bound > 0 else 0.0
    claim = f"gap <= {100 * gap:.1f}% to the lower bound" if gap <= LOOSE_GAP else \
        "gap unknown (the lower bound is loose here)"
    proved = (f"; searched through at bucket caps {_caps_text(proof.searched)} MB, not at "
              f"{_caps_text(proof.unfinished)} MB") if proof.searched else ""
    return (f"exact search stopped at its {limit:g} s cap "
            f"({'the default; ' if default else ''}--budget) before proving the optimum: "
            f"the plan is the best found, {claim}{proved}")


def _caps_text(caps: list[float]) -> str:
    return ", ".join(f"{cap:g}" for cap in caps)


