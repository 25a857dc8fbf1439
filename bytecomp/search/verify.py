"""``bytecomp plan``'s verification: train the finalists on the profiled ranks, then
choose by predicted time x measured steps (:mod:`bytecomp.search.finalists`).

The training runs the profile's own recipe (its model spec, optimizer and batch size)
on as many ranks as the profile had: spawned here, or this torchrun job's. A finalist
whose scheme the profiled shape cannot run (a hierarchical one planned for a larger
cluster) trains with its compressor's own scheme: steps depend on the compressor, the
scheme decides the time, which the model predicts for the target cluster.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bytecomp.comm.schemes import native_scheme, scheme_of
from bytecomp.compress import canonical, from_spec
from bytecomp.errors import BytecompError
from bytecomp.files import scratch_directory
from bytecomp.options import check_verification
from bytecomp.plan_record import MODEL_KINDS, STOPPED_BUDGET, STOPPED_FLAT, STOPPED_STEPS
from bytecomp.plan_types import NO_COMPRESSION, Plan, PlanEntry
from bytecomp.search.finalists import Choice, Finalist, choose, shortlist
from bytecomp.search.planner import Planner
from bytecomp.search.plans import plan_entries
from bytecomp.search.result import SearchResult
from bytecomp.search.settings import SearchOptions
from bytecomp.ui import Stage

# The runtime trial's least margin (bytecomp.search.trials): finalists within the margin of
# the chosen one take part: the profile's measured noise or the plan's --min-gain,
# whichever is wider, at least TRIAL_MARGIN (a difference the prediction or the search's
# margin calls too small to act on is the running job's to measure, not the prediction's
# to decide).
TRIAL_MARGIN = 0.05
NEVER = 10**9  # a verified plan's controller never climbs: it only steps back
MIN_STEPS = 50  # fewer cannot read a factor firmly: ten evaluations of five steps
# At most, with a budget: it stops sooner once fp32's loss has flattened or the budget is
# spent (docs/planning.md: what it costs and shows); enough for a curve that flattens late
# (the matrix's fp32 curves still fall 2-8% a quarter at 300 steps).
DEFAULT_STEPS = 1_000
DEFAULT_BUDGET_S = 180.0  # wall-clock seconds of finalist training a plan spends by default
# fp32's validation loss falling less than this over the last quarter of the steps trained
# (and by more than this in all): flat, so the run stops and its factors are settled.
SETTLED_FALL = 0.03
REFERENCE = "fp32 DDP"
KEPT_BASELINE = ": the plan is that baseline"  # the search's --min-gain note ends so


@dataclass
class Verification:
    """The finalists with their measured factors, the choice, and the run's facts: the
    steps trained (and planned: what the budget afforded), its wall-clock seconds, how
    much fp32 DDP's loss fell in all and over the last quarter, and the curves and
    median step times measured on the profiled ranks."""

    finalists: list[Finalist]
    choice: Choice
    steps: int
    batches: str
    seconds: float
    fp32_improvement: float
    fp32_last_quarter: float
    notes: list[str] = field(default_factory=list)
    budget_s: float | None = None  # the wall-clock budget (None: a forced step count)
    planned: int = 0
    stopped_by_budget: bool = False
    curves: dict[str, list] = field(default_factory=dict)  # name: [[step, loss], ...]
    step_ms: dict[str, float | None] = field(default_factory=dict)
    # where each finalist's factor came from: "trained", "probe" or "fp32" (by definition)
    factor_from: dict[str, str] = field(default_factory=dict)
    # why the training stopped: STOPPED_FLAT (fp32's loss flattened), STOPPED_BUDGET (the
    # clock) or STOPPED_STEPS (the count: --verify-steps, or all the budget afforded);
    # None where nothing was trained
    stopped_by: str | None = None
    # finalists whose predicted time x measured factor is within this fraction of the
    # chosen one's go to the runtime trial (verify(): noise, --min-gain, TRIAL_MARGIN)
    trial_margin: float = TRIAL_MARGIN
    # where measured steps chose a plan whose predicted fidelity is below --min-fidelity:
    # that fidelity and the floor (the search alone never picks such a plan)
    below_min_fidelity: tuple[float, float] | None = None
    # fp32 DDP's loss noise floor over the second half of the run (the loss's units): the
    # factors count a loss as reached within it (bytecomp.training.factors); None where
    # nothing was trained
    loss_floor: float | None = None
    # the model's measured error by kind of plan (kind_of): the median over the trained
    # finalists of that kind of measured / predicted ms per step on the profiled ranks
    # (model_errors); empty where not measured (nothing trained, or a what-if cluster)
    model_error: dict[str, float] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        """Whether fp32 DDP's loss had flattened in at least :data:`MIN_STEPS` steps (see
        :func:`flattened`): otherwise the factors may move with a longer run."""
        return self.steps >= MIN_STEPS and flattened(self.fp32_improvement,
                                                     self.fp32_last_quarter)

    def bought(self) -> str:
        """What the training bought, why it stopped and how sure it is, in one line."""
        how = (f"--verify-budget {self.budget_s:g} s" if self.budget_s is not None
               else "--verify-steps")
        fall = (f"fp32 DDP's loss fell {100 * self.fp32_last_quarter:.1f}% over the last "
                f"quarter (flat: under {100 * SETTLED_FALL:g}%)")
        if self.stopped_by == STOPPED_FLAT:
            why = f"stopped once {fall}"
        elif self.stopped_by == STOPPED_BUDGET:
            why = f"stopped by the budget ({self.planned} steps planned); {fall}"
        elif self.budget_s is not None:
            why = f"all {self.planned} steps the budget afforded; {fall}"
        else:
            why = fall
        verdict = "factors settled" if self.settled else (
            "factors uncertain (a longer --verify-budget would firm them up)")
        return (f"the finalists trained {self.steps} steps in {self.seconds:.0f} s ({how}); "
                f"{why}: {verdict}")

    def to_meta(self) -> dict:
        meta = {"steps": self.steps, "batches": self.batches,
                "seconds": round(self.seconds, 1),
                "fp32_improvement": round(self.fp32_improvement, 6),
                "fp32_last_quarter": round(self.fp32_last_quarter, 6),
                "chosen": self.choice.finalist.name, "reason": self.choice.reason}
        if self.stopped_by is not None:
            meta["stopped_by"] = self.stopped_by
        if self.loss_floor is not None and math.isfinite(self.loss_floor):
            meta["loss_floor"] = round(self.loss_floor, 6)
        if self.model_error:
            meta["model_error"] = {kind: round(ratio, 4)
                                   for kind, ratio in sorted(self.model_error.items())}
        if self.below_min_fidelity is not None:
            fidelity, floor = self.below_min_fidelity
            meta["below_min_fidelity"] = {"fidelity": round(fidelity, 6),
                                          "min_fidelity": floor}
        return meta


def flattened(improvement: float, last_quarter: float) -> bool:
    """Whether fp32 DDP's validation loss has flattened: it fell by more than
    :data:`SETTLED_FALL` in all (a curve that has not started to fall is not flat, it
    is early) and by at most that over the last quarter of the steps (both fractions of
    the loss they started from, :func:`bytecomp.training.probe.improvement`)."""
    return improvement > SETTLED_FALL and last_quarter <= SETTLED_FALL


def fidelity_override(planner: Planner, chosen: Finalist) -> tuple[float, float] | None:
    """(fidelity, floor) where ``chosen``'s predicted fidelity is below the objective's
    ``--min-fidelity``: the search never picks such a plan, but the finalists include
    the hand-picked baselines whatever their predicted fidelity, and measured steps
    outrank a predicted floor. None where the floor holds or is not scored."""
    objective = planner.problem.objective
    if not objective.uses_fidelity or chosen.fidelity is None or \
            chosen.fidelity >= objective.min_fidelity:
        return None
    return chosen.fidelity, objective.min_fidelity


def _entries_for(planner: Planner, finalist: Finalist) -> list[PlanEntry]:
    """The finalist's entries, every scheme the profiled shape cannot run replaced by the
    compressor's own."""
    nodes, per_node = planner.profile.nodes, planner.profile.ranks_per_node
    out = []
    for entry in plan_entries(planner.problem, finalist.assignment, finalist.cap_mb):
        if scheme_of(entry.scheme).infeasible(nodes, per_node):
            option = entry.option
            scheme = native_scheme(from_spec(option.spec)) if option.compressed else \
                NO_COMPRESSION.scheme
            entry = replace(entry, scheme=scheme)
        out.append(entry)
    return out


def allowed_spec(profile, model: str | None) -> str:
    """The model spec of ``profile`` the finalists may train: a built-in, or the spec the
    user named (``model``); else one line (:mod:`bytecomp.model_spec`)."""
    from bytecomp.model_spec import allowed_model, builtin_name

    spec = allowed_model(profile.meta["model"].get("spec"), model, profile.label,
                         "plan with --no-verify (nothing is trained)")
    if spec is not None and builtin_name(spec) is not None:
        # a built-in too large to build: one line, before any work (its sizes live beside
        # the models, with torch: seconds to import, so the wait is shown)
        with Stage(f"checking {spec} (loading torch)", after_s=0, lines=False):
            from bytecomp.training.builtin_models import check_builtin_size

            check_builtin_size(spec)
    return spec


def _check_runnable(planner: Planner, nproc: int | None,
                    spec: str | None) -> tuple[str, int | None]:
    """``spec`` (:func:`allowed_spec`'s; None for a synthetic profile) and the ranks to
    spawn (None under torchrun) to train it; one line where the profile's model cannot
    be built here or its ranks cannot be spawned."""
    profile = planner.profile
    if spec is None:
        raise BytecompError(f"{profile.label} is synthetic: there is no model to train the "
                            f"finalists on (plan with --no-verify)")
    from bytecomp.launch import in_torchrun
    from bytecomp.plan_types import fingerprint
    from bytecomp.training.workloads import load_workload

    try:
        workload = load_workload(spec)
    except BytecompError as error:
        raise BytecompError(f"cannot build the profile's model to train the finalists: "
                            f"{error} (plan with --no-verify)") from None
    if fingerprint(workload.model) != profile.fingerprint:
        raise BytecompError(f"{spec} is no longer the model profiled (its fingerprint "
                            f"differs): profile it again, or plan with --no-verify")
    if in_torchrun():
        return spec, None
    world = profile.world_size if nproc is None else nproc
    if world != profile.world_size:
        raise BytecompError(f"--nproc {world}: the finalists train on the profile's "
                            f"{profile.world_size} ranks")
    if world > max(2, os.cpu_count() or 1):
        raise BytecompError(f"the profile has {world} ranks, more than this machine's cores: "
                            f"run bytecomp plan under torchrun on the profiled nodes, or "
                            f"plan with --no-verify")
    return spec, world


def probe_factor(planner: Planner, finalist: Finalist) -> float | None:
    """The steps factor the profile's convergence probe measured for exactly this
    finalist, where it trained it already: one compressor on every tensor, each with the
    compressor's own scheme, at the profile's bucket cap, from the same weights on the
    same batches with the same recipe. None where the probe did not (or has no factors)."""
    factors = {canonical(spec): factor for spec, factor in planner.profile.steps_factors.items()}
    options = {planner.problem.options[o] for o in finalist.assignment}
    if not factors or len(options) != 1 or finalist.cap_mb != planner.profile.bucket_cap_mb:
        return None
    option = next(iter(options))
    if not option.compressed or option.scheme != native_scheme(from_spec(option.spec)):
        return None
    return factors.get(canonical(option.spec))


def _say(announce: Callable[[str], None] | None, text: str) -> None:
    if announce is not None:
        announce(text)


def verify(planner: Planner, result: SearchResult, options: SearchOptions | None = None,
           steps: int | None = None, nproc: int | None = None, timeout_s: float = 300.0,
           budget_s: float = DEFAULT_BUDGET_S, model: str | None = None,
           announce: Callable[[str], None] | None = None) -> Verification:
    """Shortlist, train and choose (see the module docstring). Training takes at most
    ``budget_s`` seconds on the clock, counted from this call (the ranks' start-up
    included): the ranks time their first steps and fit the rest in what is left
    (:class:`bytecomp.training.convergence.Budget`), at most :data:`DEFAULT_STEPS`, and
    stop sooner once fp32 DDP's validation loss has flattened (:func:`flattened`, after
    :data:`MIN_STEPS`); ``steps`` forces a count instead. Finalists whose values are
    within the margin (``options.min_gain``, the profile's noise, at least
    :data:`TRIAL_MARGIN`) of the chosen one's are the runtime trial's
    (:func:`~bytecomp.search.trials.trial_plan`). Measured steps may choose a plan
    predicted below ``--min-fidelity``: a note says so and the verification records it. A finalist the profile's convergence probe already
    trained (:func:`probe_factor`) takes the probe's factor and is not trained again.
    ``model``: the spec the user named (``--model``), which a factory profile needs
    (:mod:`bytecomp.model_spec`). ``announce``: told, in one line, what is about to
    be trained, for how long, and how to skip or shorten it."""
    started = time.time()
    check_verification(steps, budget_s)
    # refused up front, whatever is trained, before anything imports the model's module
    spec = None if planner.profile.meta.get("synthetic") else allowed_spec(planner.profile,
                                                                           model)
    with Stage("loading torch", after_s=0, lines=False, enabled=announce is not None):
        from bytecomp.launch import backend_for, run_job  # seconds: shown, not silent
        from bytecomp.training.finalist_runs import FinalistsJob, load_results, train_finalists

    with Stage("choosing the finalists (searching the best plan with each other "
               "promising compressor)", enabled=announce is not None):
        finalists = shortlist(planner, result, options)
    problem = planner.problem
    notes, factor_from = [], {}
    for finalist in finalists:  # fp32 at any cap or scheme: fp32 DDP's steps, no training
        if not any(problem.options[o].compressed for o in finalist.assignment):
            finalist.steps_factor, factor_from[finalist.name] = 1.0, "fp32"
        elif (factor := probe_factor(planner, finalist)) is not None:
            finalist.steps_factor, factor_from[finalist.name] = factor, "probe"
            notes.append(f"{finalist.name}: the profile's convergence probe trained it "
                         f"already (steps factor {factor:.2f}); not trained again")
    margin = max(TRIAL_MARGIN, planner.noise(), options.margin if options else 0.0)
    if all(f.steps_factor is not None for f in finalists):
        return _overridden(Verification(
            finalists, choose(finalists), 0, "none", 0.0, 0.0, 0.0, notes + [
                "no compressed plan predicted faster than fp32 DDP is left to train"],
            factor_from=factor_from, trial_margin=margin), planner)
    trained = [f for f in finalists if f.steps_factor is None or f.name == REFERENCE]
    profile = planner.profile
    ranks = nproc or profile.world_size
    if steps is not None:
        _say(announce, f"training {len(trained)} finalists x {steps} steps on {ranks} ranks "
                       f"(--no-verify skips; --verify-steps sets the count)")
    else:
        _say(announce, f"training {len(trained)} finalists on {ranks} ranks for at most "
                       f"{_duration(budget_s)} (--no-verify skips; --verify-budget sets the "
                       f"time)")
    with Stage(f"building {profile.meta['model'].get('spec')} (loading torch)", after_s=0,
               lines=False, enabled=announce is not None):
        spec, world = _check_runnable(planner, nproc, spec)
    with scratch_directory("finalists") as folder:
        paths = []
        for index, finalist in enumerate(trained):
            plan = Plan(profile.fingerprint, profile.world_size, profile.nodes,
                        profile.ranks_per_node, finalist.cap_mb,
                        _entries_for(planner, finalist), {}, {"algorithm": "finalist"})
            paths.append(str(plan.save(Path(folder) / f"finalist-{index}.yaml")))
        job = FinalistsJob(spec, profile.recipe_optimizer(), int(profile.meta["batch_size"]),
                           profile.device_type, paths, [f.name for f in trained],
                           steps or DEFAULT_STEPS, str(Path(folder) / "results.json"),
                           budget_s=None if steps is not None else budget_s, started=started,
                           flat_fall=None if steps is not None else SETTLED_FALL,
                           flat_least=MIN_STEPS, scheduler=profile.recipe_scheduler())
        run_job(train_finalists, (job,), world, backend_for(profile.device_type), timeout_s)
        measured = load_results(job.out)
    for finalist in trained:
        found = measured["finalists"][finalist.name]
        factor = found["steps_factor"]
        finalist.steps_factor = float(factor) if factor is not None else math.inf
        factor_from[finalist.name] = "fp32" if finalist.name == REFERENCE else "trained"
        if finalist.name != REFERENCE and found.get("steps_factor_low") is not None:
            finalist.steps_low = float(found["steps_factor_low"])
            finalist.steps_high = float(found["steps_factor_high"])
    done = int(measured["steps"])
    verification = Verification(finalists, choose(finalists), done, measured["batches"],
                                time.time() - started, float(measured["fp32_improvement"]),
                                float(measured["fp32_last_quarter"]), notes,
                                budget_s=None if steps is not None else budget_s,
                                planned=int(measured.get("planned", done)),
                                stopped_by_budget=bool(measured.get("stopped_by_budget")),
                                curves={name: f["curve"] for name, f in
                                        measured["finalists"].items()},
                                step_ms={name: f["step_ms"] for name, f in
                                         measured["finalists"].items()},
                                factor_from=factor_from,
                                stopped_by=str(measured.get("stopped_by", STOPPED_STEPS)),
                                trial_margin=margin,
                                loss_floor=measured.get("loss_floor"))
    verification.model_error = model_errors(planner, verification)
    verification.notes.append(verification.bought())
    return _overridden(verification, planner)


def _overridden(verification: Verification, planner: Planner) -> Verification:
    """``verification`` with :func:`fidelity_override`'s finding recorded and said (a
    note): measured steps chose a plan the search's fidelity floor would have refused."""
    chosen = verification.choice.finalist
    found = fidelity_override(planner, chosen)
    if found is not None:
        fidelity, floor = found
        verification.below_min_fidelity = found
        verification.notes.append(
            f"measured steps override the predicted fidelity floor: {chosen.name} is "
            f"predicted at fidelity {fidelity:.3f}, below --min-fidelity {floor:g}, and was "
            f"chosen by predicted time x measured steps (the search alone never picks such "
            f"a plan)")
    return verification


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


SEARCHED, HAND_PICKED = MODEL_KINDS  # the kinds of plan (kind_of)


def kind_of(finalist: Finalist) -> str:
    """A finalist's kind of plan, for the model's error: :data:`HAND_PICKED` (fp32 DDP and
    PyTorch's hooks, which DDP runs) or :data:`SEARCHED` (the search's plans and the
    other mixes, which bytecomp's executor runs, group by group)."""
    return HAND_PICKED if finalist.source == "baseline" else SEARCHED


def model_errors(planner: Planner, verification: Verification) -> dict[str, float]:
    """By kind of plan (:func:`kind_of`), the median over its trained finalists of the
    measured median ms per step on the profiled ranks over the predicted one: where the
    plan is for the profiled cluster itself (the prediction is then for the same ranks);
    empty on a what-if cluster, or where nothing was timed."""
    if not planner.cluster.measured:
        return {}
    ratios: dict[str, list[float]] = {}
    for finalist in verification.finalists:
        measured = verification.step_ms.get(finalist.name)
        if measured is None or not math.isfinite(measured) or measured <= 0 or \
                not 0 < finalist.time_ms < math.inf:
            continue
        ratios.setdefault(kind_of(finalist), []).append(measured / finalist.time_ms)
    return {kind: statistics.median(values) for kind, values in ratios.items()}


def chosen_result(result: SearchResult, verification: Verification) -> SearchResult:
    """The search result with the chosen finalist as its plan."""
    finalist = verification.choice.finalist
    problem = result.problem
    value = problem.objective_of(finalist.time_ms, finalist.assignment)
    if verification.steps:
        evidence = (f"the finalists trained {verification.steps} steps on the profiled ranks "
                    f"(losses on {verification.batches}; {verification.seconds:.0f} s): "
                    f"{verification.choice.reason}")
        warnings = [w for w in result.warnings if w != result.evidence]
    else:
        evidence, warnings = f"{result.evidence}; {verification.choice.reason}", result.warnings
    notes = result.notes
    if (list(finalist.assignment), finalist.cap_mb) != (list(result.assignment), result.cap_mb):
        # the search's "the plan is that baseline" (--min-gain) no longer says what the plan is
        notes = [note.replace(KEPT_BASELINE, f": the search kept that baseline, then the "
                                             f"finalists' training chose {finalist.name}")
                 for note in notes]
    return replace(result, assignment=list(finalist.assignment), cap_mb=finalist.cap_mb,
                   time_ms=finalist.time_ms, fidelity=finalist.fidelity, value=value,
                   notes=notes + verification.notes, warnings=warnings,
                   evidence=evidence,
                   algorithm=result.algorithm + f", then {len(verification.finalists)} "
                                                f"finalists trained")
