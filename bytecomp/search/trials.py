"""A verified plan's runtime trial: the trained finalists within the margin of the
chosen one (or of the other kind, within the model's measured error), as the levels
the running job times before it keeps one (:mod:`bytecomp.runtime.trial`)."""

from __future__ import annotations

import math
from dataclasses import replace

from bytecomp.plan_types import Plan
from bytecomp.search.finalists import Finalist
from bytecomp.search.planner import Planner
from bytecomp.search.plans import plan_entries
from bytecomp.search.result import SearchResult
from bytecomp.search.verify import NEVER, REFERENCE, TRIAL_MARGIN, Verification, kind_of

# The runtime trial (bytecomp.runtime.trial): at most 2% of a 1,000-step run, after ten
# steps of warm-up (who takes part: TRIAL_MARGIN, bytecomp.search.verify).
TRIAL_STEPS = 20
TRIAL_WARMUP = 10


def trial_candidates(planner: Planner, verification: Verification) -> list[Finalist]:
    """The trained finalists whose predicted time x measured steps factor is within the
    margin of the chosen one's (:attr:`Verification.trial_margin`, at least the
    profile's noise and :data:`TRIAL_MARGIN`), or could be within the loss's noise floor
    (an uncertain factor, :attr:`~bytecomp.search.finalists.Finalist.best_value`, its
    low end: the floor cannot rule it out), and the best of the other kind where the
    chosen one's lead over it is within the model's measured error (:func:`alternative`):
    what the running job times (the chosen one first). Closer than that, neither the
    prediction nor the search's margin can tell them apart."""
    chosen = verification.choice.finalist
    margin = max(TRIAL_MARGIN, planner.noise(), verification.trial_margin)
    near = [f for f in verification.finalists if f is not chosen and f.steps_factor is not None
            and math.isfinite(f.value) and min(f.value, f.best_value) <= chosen.value * (1 + margin)]
    other = alternative(verification)
    if other is not None and all(other is not f for f in near):
        near.append(other)
    return [chosen, *near]


def alternative(verification: Verification) -> Finalist | None:
    """The best finalist (least predicted time x measured factor) of the other kind than
    the chosen one's, where the chosen one's predicted lead over it is within the
    model's measured error for the chosen one's kind relative to the other's (the
    chosen kind runs that much slower than predicted, against the other): the runtime
    trial measures which is ahead. None where the lead is wider, or the error is not
    measured for both kinds."""
    chosen = verification.choice.finalist
    mine, errors = kind_of(chosen), verification.model_error
    others = [f for f in verification.finalists if kind_of(f) != mine
              and f.steps_factor is not None and math.isfinite(f.value)]
    if not others or len(errors) < 2 or mine not in errors:
        return None
    best = min(others, key=lambda f: f.value)
    error = errors[mine] / errors[kind_of(best)] - 1
    lead = best.value / chosen.value - 1 if chosen.value > 0 else math.inf
    return best if lead <= error else None


def trial_plan(planner: Planner, result: SearchResult, verification: Verification,
               static: Plan) -> Plan | None:
    """The verified plan with its runtime trial: fp32 DDP as level 0 (where the controller
    steps back to on evidence) and the trial's candidates as levels, mildest first, all at
    the chosen finalist's bucket cap (DDP's buckets are fixed); None where only one
    candidate is left, or where the chosen finalist is uncompressed (:func:`uncompressed`:
    a plan that says fp32 runs fp32, and the trial would run compressed levels the
    choice ruled out): the static plan is the plan."""
    from bytecomp.plan_file import FINALISTS
    from bytecomp.plan_types import MIN_TRIAL_PAIRS, Adaptive, Level
    from bytecomp.search.ladder import level_fidelities

    candidates = trial_candidates(planner, verification)
    if len(candidates) < 2 or uncompressed(planner, verification.choice.finalist):
        return None
    cap, problem = verification.choice.finalist.cap_mb, planner.problem
    fp32 = next(f for f in verification.finalists if f.name == REFERENCE)
    members = [fp32] + [f for f in candidates if f is not fp32]
    members.sort(key=lambda f: (f is not fp32, -(f.fidelity or 1.0), f.time_ms))
    results = [replace(result, assignment=list(f.assignment), cap_mb=cap,
                       time_ms=problem.simulate(f.assignment, cap).iteration_ms)
               for f in members]
    gains, fidelities = level_fidelities(planner.profile, results)
    levels = [Level(f.name, plan_entries(problem, f.assignment, cap), round(r.time_ms, 4),
                    None if fidelity is None else round(fidelity, 6),
                    None if gain is None else round(gain, 6), round(f.steps_factor or 1.0, 4))
              for f, r, gain, fidelity in zip(members, results, gains, fidelities)]
    start = members.index(verification.choice.finalist)
    trial = [members.index(f) for f in candidates]
    floor = min((lv.fidelity for lv in levels if lv.fidelity), default=1.0)
    adaptive = Adaptive(FINALISTS, threshold=round(min(0.75, 0.9 * floor), 4),
                        explore_every=NEVER, start=start,
                        agree_every=trial_agreement(results[start].time_ms, len(trial)),
                        trial=tuple(trial),
                        trial_steps=max(TRIAL_STEPS, MIN_TRIAL_PAIRS * len(trial)),
                        trial_warmup=TRIAL_WARMUP)
    return Plan(static.model_fingerprint, static.world_size, static.nodes,
                static.ranks_per_node, cap, levels[0].entries,
                {**static.predicted_ms, "levels": [lv.predicted_ms for lv in levels]},
                dict(static.search), dict(static.info), levels=levels, adaptive=adaptive,
                host_workers=static.host_workers)


def uncompressed(planner: Planner, finalist: Finalist) -> bool:
    """Whether ``finalist`` sends every tensor uncompressed (fp32 allreduce, at any cap)."""
    return not any(planner.problem.options[o].compressed for o in finalist.assignment)


def trial_agreement(step_ms: float, candidates: int) -> int:
    """Steps per agreement of a trial plan: :func:`~bytecomp.search.ladder.
    agreement_interval`'s, made coprime with the number of ``candidates``. The agreement's
    allreduce slows the step after it is issued; the candidates take turns step by step,
    so an interval that is a multiple of their number would put that cost on the same
    candidate's steps every time, a bias the trial would read as a gap."""
    from bytecomp.search.ladder import agreement_interval

    interval = agreement_interval(step_ms, 10)
    while math.gcd(interval, candidates) != 1:
        interval -= 1
    return interval
