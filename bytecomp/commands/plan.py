"""``bytecomp plan`` from start to finish (what :func:`bytecomp.plan` calls): read the profile, search,
train the finalists, choose, add the runtime trial, write the plan and its evidence.

:func:`run_plan` is what :func:`bytecomp.plan` and the ``plan`` command both call; it
returns a :class:`PlanResult` and prints nothing but progress (stages on stderr).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bytecomp.files import (
    atomic_files,
    check_output_file,
    check_outputs_spare_inputs,
    check_side_file,
)
from bytecomp.options import (
    DEFAULT_GAIN_THRESHOLD,
    DEFAULT_TIMING,
    DEFAULT_WINDOW,
    PlanOptions,
    check_cluster,
)
from bytecomp.plan_types import Plan
from bytecomp.ui import Stage

if TYPE_CHECKING:
    import pandas as pd

    from bytecomp.search.ladder import LadderResult
    from bytecomp.search.planner import Planner
    from bytecomp.search.result import SearchResult
    from bytecomp.search.verify import Verification


@dataclass
class PlanResult:
    """What :func:`bytecomp.plan` made: the plan and what chose it.

    * ``plan``: the plan file's contents (what :func:`bytecomp.apply_plan` executes);
      ``written``: where it was saved (None where ``out`` was None);
    * ``strategies``, ``tensors``, ``finalists``: the tables, as pandas DataFrames;
    * ``search``: the search's result with the choice applied (a static plan's: the
      predictions, the baselines, the bound), ``ladder`` an adaptive plan's levels;
      ``planner`` the static search's (its fits and tree); ``verification`` the
      finalists' training (None with ``verify=False``);
    * ``evidence``: the finalists' table and curves written beside the plan;
    * ``notes`` and ``warnings``: what the command prints after its table.
    """

    plan: Plan
    written: Path | None
    search: SearchResult | None = None
    ladder: LadderResult | None = None
    planner: Planner | None = None
    verification: Verification | None = None
    evidence: list[Path] = field(default_factory=list)
    extra_warnings: list[str] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        source = self.search if self.search is not None else self.ladder
        return list(source.notes) if source is not None else []

    @property
    def warnings(self) -> list[str]:
        own = list(self.search.warnings) if self.search is not None else []
        return self.extra_warnings + own

    @property
    def composition(self) -> str:
        """The starting plan's strategies, most used first ("7 x int8 twoshot@device,
        ..."), the ``plan:`` line of the command."""
        if self.search is not None:
            return self.search.composition()
        assert self.ladder is not None
        return self.ladder.levels[self.ladder.adaptive.start].composition()

    @property
    def summary(self) -> str:
        """The command's ``plan:`` line: :attr:`composition`, and the runtime trial where
        the plan has one (what the running job then does, level by level)."""
        trial = trial_summary(self.plan) if self.search is not None else None
        return self.composition if trial is None else f"{self.composition}; {trial}"

    @property
    def strategies(self) -> pd.DataFrame:
        """The command's table: a static plan's row first, then every baseline
        (strategy, bucket_cap_mb, iteration_ms, fidelity, effective_ms,
        below_min_fidelity, vs_fp32); an adaptive plan's levels (level, setting,
        iteration_ms, gain, fidelity, effective_ms, vs_fp32)."""
        import pandas as pd

        return pd.DataFrame(self._rows())

    @property
    def tensors(self) -> pd.DataFrame:
        """Per tensor, the strategy training starts with (name, action, compressor, place,
        scheme, group)."""
        import pandas as pd

        return pd.DataFrame([entry.to_dict() for entry in starting_entries(self.plan)])

    @property
    def finalists(self) -> pd.DataFrame | None:
        """The trained finalists (None with ``verify=False`` or an adaptive plan)."""
        import pandas as pd

        return None if self.verification is None else pd.DataFrame(
            self.plan.info.get("finalists", []))

    def _rows(self) -> list[dict]:
        if self.search is not None:
            return [{"strategy": row["strategy"], "bucket_cap_mb": row["cap_mb"],
                     "iteration_ms": row["time_ms"], "fidelity": row["fidelity"],
                     "effective_ms": row["effective_ms"], "below_min_fidelity": row["below"],
                     "vs_fp32": row["vs_fp32"]} for row in self.search.strategy_rows()]
        from bytecomp.search.ladder import level_rows
        from bytecomp.search.result import effective_ms

        assert self.ladder is not None
        return [{"level": number, "setting": setting, "iteration_ms": time_ms, "gain": gain,
                 "fidelity": fidelity,
                 "effective_ms": effective_ms(time_ms, fidelity) if fidelity else None,
                 "vs_fp32": speedup}
                for number, setting, time_ms, gain, fidelity, speedup in
                level_rows(self.ladder)]

    def to_dict(self) -> dict:
        """``plan --format json``: the plan file's fields as written (predictions,
        baselines, fidelity, search, finalists, tensors or levels), where it was written,
        the per-tensor strategies training starts with, the table's rows, notes and
        warnings."""
        document = {"written": None if self.written is None else str(self.written),
                    **self.plan.to_dict(),
                    "tensors": [entry.to_dict() for entry in starting_entries(self.plan)]}
        if self.search is None:
            return {**document, "ladder": self._rows(), "notes": self.notes}
        return {**document, "strategies": self._rows(), "composition": self.composition,
                "summary": self.summary,
                "evidence": self.search.evidence, "notes": self.notes,
                "warnings": self.warnings}


def trial_summary(plan: Plan) -> str | None:
    """What a plan's runtime trial runs, in one clause (None: the plan has none): its
    levels by name, how many steps after how many."""
    adaptive = plan.adaptive
    if adaptive is None or not adaptive.trial or not plan.levels:
        return None
    names = ", ".join(f"{level} {plan.levels[level].setting}" for level in adaptive.trial)
    return (f"the running job first times {len(adaptive.trial)} finalists the prediction "
            f"cannot separate (levels {names}) in turn for {adaptive.trial_steps} steps "
            f"after {adaptive.trial_warmup} ({adaptive.trial_steps} more where they tie)")


def starting_entries(plan: Plan) -> list:
    """The entries training starts with: a static plan's, or its start level's."""
    if plan.levels and plan.adaptive is not None:
        return plan.levels[plan.adaptive.start].entries
    return plan.entries


def input_files(profile: str | None, plan_file: str | None, cluster: str | None) -> list[Path]:
    """The files a command reads, which none of its outputs may overwrite."""
    from bytecomp.costs.clusters import cluster_file
    from bytecomp.profile_store import profile_files

    files = (profile_files(profile) if profile is not None else []) + \
        ([Path(plan_file)] if plan_file else [])
    config = cluster_file(cluster) if cluster else None
    return files + ([config] if config is not None else [])


def load_cluster(cluster: str | None):
    """A cluster config by shipped name or file (None: the profiled cluster)."""
    from bytecomp.costs.clusters import load_cluster as load

    check_cluster(cluster)
    return load(cluster) if cluster is not None else None


def _search_options(options: PlanOptions):
    from bytecomp.search.settings import SearchOptions

    return SearchOptions(
        tuple(options.bucket_cap_mb) or None, options.algorithm, options.budget,
        0.0 if options.min_gain is None else options.min_gain, options.evaluations,
        stop_gap=options.stop_gap)


def _check_outputs(profile: str | None, options: PlanOptions, static: bool) -> list[str]:
    """The plan file and, where finalists are trained, its evidence files beside it:
    writable, and none of them an input (the files of ``profile``, a directory; None: a
    profile built in memory). Returns the evidence paths."""
    from bytecomp.search.evidence import evidence_paths

    out = options.out
    if out is None:
        return []
    check_output_file(out, "--out")
    evidence = [str(path) for path in evidence_paths(out)] if options.verify and static \
        else []
    for path in evidence:  # written beside the plan, never named: checked, never a link
        check_side_file(path, "--out")
    check_outputs_spare_inputs({"--out": out, **{f"--out ({Path(e).name})": e
                                                 for e in evidence}},
                               input_files(profile, None, options.cluster))
    return evidence


def run_plan(profile, options: PlanOptions,
             announce: Callable[[str], None] | None = None) -> PlanResult:
    """Plan ``profile`` (a profile directory, or a :class:`~bytecomp.profile_store.Profile`
    already loaded) with checked ``options``; ``announce`` receives the opening line of
    each long stage (what it does, how long, how to skip it). Writes ``options.out`` (and
    the finalists' evidence beside it) unless it is None."""
    from bytecomp.profile_store import Profile, load_profile

    warnings = []
    if options.nproc is not None:  # only then: bytecomp.launch loads torch
        from bytecomp.launch import check_nproc

        warnings = check_nproc(options.nproc)
    static = options.adaptive is None
    given = profile if isinstance(profile, Profile) else None
    label = str(given.path if given is not None else profile)
    evidence = _check_outputs(None if given is not None and given.path is None else label,
                              options, static)
    if given is not None:
        loaded = given
    else:
        with Stage(f"reading {label}"):
            loaded = load_profile(label)
    if options.verify and static and not loaded.meta.get("synthetic"):
        from bytecomp.search.verify import allowed_spec

        allowed_spec(loaded, options.model)  # refused before any work
    if not static:
        run = _plan_adaptive(loaded, options)
    else:
        run = _plan_static(label, loaded, options, evidence, announce)
    run.extra_warnings[:0] = warnings
    return run


def _plan_adaptive(loaded, options: PlanOptions) -> PlanResult:
    from bytecomp.plan_types import Adaptive
    from bytecomp.search.ladder import plan_ladder, to_ladder_plan
    from bytecomp.search.settings import default_min_gain

    search_options = _search_options(options)
    if options.min_gain is None:  # the levels are searched by time
        search_options = replace(search_options, min_gain=default_min_gain("time"))
    assert options.adaptive is not None
    settings = Adaptive(options.adaptive, DEFAULT_GAIN_THRESHOLD
                        if options.gain_threshold is None else options.gain_threshold,
                        DEFAULT_WINDOW if options.window is None else options.window,
                        timing=options.timing or DEFAULT_TIMING)
    ladder = plan_ladder(loaded, load_cluster(options.cluster), settings, search_options,
                         options.agree_every)
    plan_file = to_ladder_plan(ladder, loaded)
    written = plan_file.save(options.out) if options.out is not None else None
    return PlanResult(plan_file, written, ladder=ladder)


def _plan_static(profile: str, loaded, options: PlanOptions, evidence: list[str],
                 announce: Callable[[str], None] | None) -> PlanResult:
    from bytecomp.search import Planner, to_plan
    from bytecomp.search.settings import default_min_gain

    with Stage(f"fitting the cost model to {profile} and setting up the search"):
        planner = Planner(loaded, load_cluster(options.cluster), list(options.compressor) or None,
                          options.strict, options.objective, options.min_fidelity,
                          options.fidelity_weights, options.probe)
    search_options = _search_options(options)
    if options.min_gain is None:
        search_options = replace(search_options,
                                 min_gain=default_min_gain(planner.problem.objective.name))
    if options.verify and announce is not None:
        how = f"{options.verify_steps} steps each (--verify-steps)" if options.verify_steps \
            else f"at most {options.verify_budget_s:g} s (--verify-budget sets it)"
        announce(f"planning {profile} for {planner.cluster.name}: search, then train the "
                 f"finalists for {how}; --no-verify plans from predictions alone")
    with Stage(f"searching {len(planner.problem.tensors)} tensors x "
               f"{len(planner.problem.options)} options ({options.algorithm}; --budget caps "
               f"it)"):
        result = planner.search(search_options)
    if not options.verify:
        result.warnings.append("--no-verify: the plan is chosen from predictions alone, "
                               "without training its finalists")
        plan_file = to_plan(result, loaded)
        written = plan_file.save(options.out) if options.out is not None else None
        return PlanResult(plan_file, written, search=result, planner=planner)
    from bytecomp.search.trials import trial_candidates, trial_plan, uncompressed
    from bytecomp.search.verify import chosen_result, verify

    verification = verify(planner, result, search_options, options.verify_steps,
                          options.nproc, budget_s=options.verify_budget_s,
                          model=options.model, announce=announce)
    result = chosen_result(result, verification)
    plan_file = to_plan(result, loaded)
    plan_file.info["finalists"] = [
        f.to_meta(f is verification.choice.finalist) for f in verification.finalists]
    plan_file.info["verification"] = verification.to_meta()
    with_trial = None if options.static else trial_plan(planner, result, verification,
                                                        plan_file)
    if with_trial is not None:
        plan_file = with_trial
        result.notes.append(f"{trial_summary(plan_file)}, then keeps the best outside its "
                            f"measured noise (the safer on a tie); --static writes the "
                            f"chosen plan alone")
    elif not options.static and uncompressed(planner, verification.choice.finalist) and \
            len(trial_candidates(planner, verification)) > 1:
        result.notes.append("the chosen plan is uncompressed: it runs as written, with no "
                            "runtime trial of the compressed finalists near it")
    written_evidence: list[Path] = []
    if verification.curves and evidence:
        from bytecomp.search.evidence import write_evidence

        with Stage(f"writing the finalists' curves beside {options.out}"), \
                atomic_files(evidence, follow_links=False) as staged:  # the factors' curves
            write_evidence(verification, staged, f"finalists of {options.out}")
        written_evidence = [Path(path) for path in evidence]
    written = plan_file.save(options.out) if options.out is not None else None
    return PlanResult(plan_file, written, search=result, planner=planner,
                   verification=verification, evidence=written_evidence)
