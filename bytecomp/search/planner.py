"""From a profile and a cluster to the best assignment, with baselines and a bound."""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import bytecomp
from bytecomp.buckets import SEARCHED_CAPS_MB
from bytecomp.comm.schemes import native_scheme, scheme_of
from bytecomp.compress import canonical, from_spec
from bytecomp.compress.base import FP16_HOOK, POWERSGD_HOOK
from bytecomp.compress.lowrank import powersgd_compresses
from bytecomp.costs.clusters import PROFILE_LINK, Cluster
from bytecomp.costs.executor_costs import ExecutorCosts
from bytecomp.costs.fit_quality import collective_quality, compressor_quality
from bytecomp.costs.fitted import CommModel, ComputeModel, profiled_cluster
from bytecomp.costs.gains import FidelityModel
from bytecomp.costs.scheme_costs import scheme_cost
from bytecomp.costs.strategy import StrategyCosts, cast_specs
from bytecomp.errors import BytecompError
from bytecomp.plan_file import MAX_HOST_WORKERS
from bytecomp.plan_record import OBJECTIVES
from bytecomp.plan_types import HOST_WORKERS, NO_COMPRESSION, Option, Plan, PlanEntry
from bytecomp.profile_store import Profile
from bytecomp.profile_tables import ELEMENT_SIZES
from bytecomp.search.algorithms import (
    Budget,
    Point,
    anneal,
    greedy_over_caps,
    lower_bound,
)
from bytecomp.search.bound import channel_floors, relaxed_bound, relaxed_bound_ceiling
from bytecomp.search.exact import ExactResult, exact_search
from bytecomp.search.problem import Group, Objective, Problem, Tensor
from bytecomp.search.settings import BaselineKind, SearchOptions
from bytecomp.search.tree import add_exchange, build_tree, options_of
from bytecomp.timeline.simulator import simulate

DEFAULT_CAPS = SEARCHED_CAPS_MB  # and the profiled cap; 0: one bucket per tensor
LOOSE_GAP = 0.5  # a gap above this is the bound's looseness, not the plan's (gap_known)
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
# Above this many tensors the default caps leave out 0 (one bucket per tensor) and the
# lower bound is the channel bound alone (the relaxed one took seconds at 50,000)
LARGE_TENSORS = 5_000
MAX_TENSORS = 50_000  # parameter tensors a profile may have to be planned (docs/search.md)


def default_evaluations(tensors: int) -> int:
    """Evaluations of the annealing when none are asked: 100,000 / tensors, from 600 to
    4,000 (an evaluation's cost grows with the tensors, so this keeps the default
    search's time roughly flat; the scale and classic sets of ``benchmarks/search.py``
    measure it). Half what it was before the annealing began with a descent: since
    then the same plans or better come from half the walk (docs/search.md)."""
    return min(4000, max(600, 100_000 // max(1, tensors)))


def default_caps(profiled_mb: float, tensors: int) -> list[float]:
    """The bucket caps searched unless some are asked: the profiled cap and
    :data:`DEFAULT_CAPS`, less 0 (one bucket per tensor) above
    :data:`LARGE_TENSORS` tensors: a collective per tensor does not pay there, and
    pricing each of that many buckets was most of the search's time."""
    caps = [profiled_mb, *DEFAULT_CAPS]
    return caps if tensors <= LARGE_TENSORS else [cap for cap in caps if cap > 0]


def host_workers_of(cluster: Cluster) -> int:
    """Host-offload workers per rank: a node's cores shared by its ranks (the cluster
    config's ``cpu_cores``), else the executor's default pool."""
    if cluster.cpu_cores is None:
        return HOST_WORKERS
    return min(MAX_HOST_WORKERS, max(1, cluster.cpu_cores // cluster.ranks_per_node))


def effective_ms(time_ms: float, fidelity: float | None) -> float | None:
    """Iteration time / fidelity (None: fidelity unknown; infinite at fidelity 0)."""
    if fidelity is None:
        return None
    return time_ms / fidelity if fidelity > 0 else math.inf


@dataclass
class Baseline:
    """A hand-picked plan (``kind``) as the search's model predicts it; ``name`` is how
    tables and plan files show it."""

    kind: BaselineKind
    name: str
    assignment: list[int]
    cap_mb: float
    time_ms: float = math.nan
    fidelity: float | None = None  # None: the profile measured no fidelity
    value: float = math.nan  # the objective's value: time_ms, or effective time
    spec: str | None = None  # the compressor's, for one on every tensor

    @property
    def effective_ms(self) -> float | None:
        return effective_ms(self.time_ms, self.fidelity)


@dataclass
class SearchResult:
    problem: Problem
    cluster: Cluster
    specs: list[str]
    assignment: list[int]
    cap_mb: float
    time_ms: float
    baselines: list[Baseline]
    algorithm: str
    search_ms: float
    lower_bound_ms: float
    exact: bool
    evaluations: int
    notes: list[str] = field(default_factory=list)
    objective: Objective = field(default_factory=Objective)
    fidelity: float | None = None
    value: float = math.nan  # the objective's value
    evidence: str = "iteration time alone"  # what decided between compressors, in words
    warnings: list[str] = field(default_factory=list)
    # the search's own plan, where --min-gain kept a baseline instead: (assignment, cap)
    searched: tuple[list[int], float] | None = None

    @property
    def effective_ms(self) -> float | None:
        return effective_ms(self.time_ms, self.fidelity)

    @property
    def gap(self) -> float:
        """How far the objective's value may be from the optimum (the lower bound is one
        on iteration time, hence on effective time too: fidelity is at most 1)."""
        value = self.value if self.value == self.value else self.time_ms
        return max(0.0, value / self.lower_bound_ms - 1.0) if self.lower_bound_ms else 0.0

    @property
    def gap_known(self) -> bool:
        """Whether :attr:`gap` says something: proven optimal, or a gap of at most
        :data:`LOOSE_GAP`. Above it the bound is the loose part (by effective time it
        bounds the iteration time alone; the simulated overlap of compute and
        communication, which the bound relaxes, decides the rest): plans that 40,000
        evaluations did not improve were printed 74-414% above it."""
        return self.exact or self.gap <= LOOSE_GAP

    def gap_text(self) -> str:
        """The optimality claim, in words: "optimal" (proven: nothing beside it, as the
        search line names the algorithm that proved it), "gap <= x%" or "gap unknown"."""
        if self.exact:
            return "optimal"
        if self.gap_known:
            return f"gap <= {100 * self.gap:.1f}%"
        return f"gap unknown: the bound is loose here ({100 * self.gap:.0f}% below the plan)"

    def strategy_rows(self) -> list[dict]:
        """The rows of ``bytecomp plan``'s table, the plan first, then every baseline:
        strategy, cap_mb, time_ms, fidelity, effective_ms, below (under the minimum
        fidelity of an effective-time objective) and vs_fp32 (fp32 DDP's objective over
        the row's: effective time, or iteration time)."""
        fp32 = self.baseline(BaselineKind.FP32_DDP)
        assert fp32 is not None  # every search result has it
        effective = self.objective.name == "effective"
        entries: list[tuple[str, SearchResult | Baseline]] = [("bytecomp plan", self)]
        entries += [(baseline.name, baseline) for baseline in self.baselines]
        rows = []
        for name, entry in entries:
            below = effective and entry.fidelity is not None and \
                entry.fidelity < self.objective.min_fidelity - 1e-12
            reference, value = (fp32.effective_ms, entry.effective_ms) if effective else \
                (fp32.time_ms, entry.time_ms)
            assert reference is not None and value is not None  # effective time has fidelity
            ratio = reference / value
            rows.append({"strategy": name, "cap_mb": entry.cap_mb, "time_ms": entry.time_ms,
                         "fidelity": entry.fidelity, "effective_ms": entry.effective_ms,
                         "below": below, "vs_fp32": ratio})
        return rows

    def composition(self) -> str:
        """The plan's strategies, most used first: ``"26 x fp32 allreduce, 16 x ..."``."""
        return composition_of(self.problem, self.assignment)

    def baseline(self, kind: BaselineKind) -> Baseline | None:
        """The first baseline of this kind (None: the profile could not price one)."""
        return next((b for b in self.baselines if b.kind is kind), None)


def composition_of(problem: Problem, assignment: list[int]) -> str:
    """An assignment's strategies, most used first: ``"26 x fp32 allreduce, 16 x ..."``."""
    counts = Counter(problem.options[o].label for o in assignment)
    return ", ".join(f"{n} x {label}" for label, n in counts.most_common())


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


def powersgd_hook_assignment(problem: Problem, spec: str) -> list[int] | None:
    """What PyTorch's ``powerSGD_hook`` does with PowerSGD ``spec`` (error feedback and
    warm start on, as the hook's), as an assignment: ``spec`` on the matrices its rule
    compresses, fp32 on the rest; None where ``spec`` is not that or an option is missing."""
    compressor = from_spec(spec)
    if compressor.runs_as_pytorch_hook() != POWERSGD_HOOK:
        return None
    try:
        compress = problem.index_of(native_option(spec))
        keep = problem.index_of(NO_COMPRESSION)
    except ValueError:
        return None
    rank = compressor.values["rank"]
    return [compress if powersgd_compresses(t.shape, rank) else keep for t in problem.tensors]


def hook_specs(specs, hook: str) -> list[str]:
    """The specs (sorted) whose compressor is what PyTorch's ``hook`` does."""
    return [s for s in sorted(specs) if from_spec(s).runs_as_pytorch_hook() == hook]


def _baseline_options(profile_specs: set[str]) -> tuple[str | None, str | None]:
    """The specs of the fp16 and PowerSGD hooks' baselines (PowerSGD at rank 4 where the
    profile has it), among the profiled ones."""
    fp16 = next(iter(hook_specs(profile_specs, FP16_HOOK)), None)
    powersgd = sorted(hook_specs(profile_specs, POWERSGD_HOOK),
                      key=lambda s: (from_spec(s).values["rank"] != 4, s))
    return fp16, (powersgd[0] if powersgd else None)


def native_option(spec: str) -> Option:
    """``spec`` on the device, on the one-stage scheme its own rounds end with."""
    return Option(spec, "device", native_scheme(from_spec(spec)))


def check_size(profile: Profile) -> None:
    """At most :data:`MAX_TENSORS` tensors, or one line before any work: the search's
    set-up (baselines, bounds, screens) grows with the tensors, and beyond the range it
    is measured on it would not fit its time cap."""
    count = len(profile.tensors)
    if count > MAX_TENSORS:
        raise BytecompError(f"{profile.label}: {count:,} parameter tensors, more than the "
                            f"{MAX_TENSORS:,} bytecomp plans; merge small parameters into "
                            f"larger ones (e.g. fused layers), or plan part of the model")


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
        fp16, powersgd = _baseline_options(timed)  # their methods run on the device
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
           :func:`default_evaluations`), spent in full unless the stop gap is met,
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
           (:func:`_baseline_to_keep`); other plans close to the result are the
           finalists' business (trained, or trialled in the running job).

        The result is never worse on the objective than any start (before step 5).
        The lower bound is the better of a linear relaxation over every option of
        every tensor (:func:`bytecomp.search.bound.relaxed_bound`) and the channel
        bound of :func:`bytecomp.search.algorithms.lower_bound`.
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
        kept = _baseline_to_keep(baselines, searchable, value, min_gain,
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


def _baseline_to_keep(baselines: list[Baseline], searchable: set[int], value: float,
                      min_gain: float, fidelity: float | None = None) -> Baseline | None:
    """fp32 DDP, when the search beats it by less than ``min_gain`` (and, by effective
    time, it keeps at least the search's ``fidelity``: it always does): a gain smaller
    than the model's error is not worth compressing.

    Only fp32 DDP: it is a baseline under every choice of compressors, so the margin never
    makes more choice worse. Were another baseline kept (the fp16 hook, a compressor on
    every tensor), a search with more compressors, finding a better plan, could keep a
    baseline within the margin above it that a search with fewer does not have (ResNet-101
    with every compressor kept a uniform plan at 93.61 ms over the search's 90.20, where
    dgc alone planned 92.76). Plans within the margin of each other are the finalists'
    business: trained, or trialled in the running job, rather than picked by prediction."""
    if min_gain <= 0:
        return None
    fp32 = next((b for b in baselines if b.kind is BaselineKind.FP32_DDP
                 and set(b.assignment) <= searchable), None)
    if fp32 is None or value <= fp32.value * (1 - min_gain):
        return None
    if fidelity is not None and (fp32.fidelity or 0.0) < fidelity - 1e-9:
        return None
    return fp32


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


def fp32_ms(result: SearchResult) -> float:
    """fp32 DDP's predicted iteration time in a search result."""
    fp32 = result.baseline(BaselineKind.FP32_DDP)
    assert fp32 is not None  # every search prices it
    return fp32.time_ms


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
