"""Finalists: the plans worth training before one is chosen, and the choice.

A search ranks plans by predicted time per step and one-step gains; how many steps
a plan then needs to reach a loss is what the gains predict worst (PowerSGD kept
0.61 of one model's gradient and needed fp32's steps, 0.98 of another's and needed
1.62x). So the planner keeps a short list, :func:`shortlist`:

* the searched plan (and the search's own, where ``--min-gain`` kept a baseline);
* the best plans with other compressor mixes: a search with each of the most
  promising other compressors alone (Espresso's rule: it or nothing);
* the plans a user would pick by hand: fp32 DDP, PyTorch's fp16 hook, and its
  PowerSGD hook at every rank the profile timed (in one bucket, as the hook needs);

trains them on the profiled ranks from the same weights on the same batches with the
user's recipe (:mod:`bytecomp.training.finalist_runs`), and :func:`choose` picks the one
with the least predicted time per step for the target cluster times measured steps
factor (its steps over fp32 DDP's to the same loss). Finalists whose factors are
within :data:`STEPS_TOLERANCE` of each other count as needing the same steps: of
those, the fastest wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bytecomp.compress import from_spec
from bytecomp.compress.base import POWERSGD_HOOK
from bytecomp.search.baselines import hook_specs, powersgd_hook_assignment
from bytecomp.search.planner import Planner
from bytecomp.search.result import SearchResult, composition_of
from bytecomp.search.settings import BaselineKind, SearchOptions

MAX_FINALISTS = 6
OTHER_MIXES = 2  # searches with one other compressor alone
# Steps factors closer than this are the same number of steps: with ten evaluations over a
# run, a factor is read to about a tenth of the steps between two of them, and identical
# strategies train identically (seeded batches, deterministic exchanges).
STEPS_TOLERANCE = 0.03


@dataclass
class Finalist:
    """One plan on the short list: its assignment and bucket cap in the planner's problem,
    what the model predicts of it on the target cluster, and what training measured."""

    name: str
    source: str  # "search", "baseline" or "mix"
    assignment: list[int]
    cap_mb: float
    time_ms: float
    fidelity: float | None = None
    steps_factor: float | None = None  # measured: its steps over fp32 DDP's (None: untrained)
    notes: list[str] = field(default_factory=list)
    # the factor's bounds within fp32's loss noise floor (bytecomp.training.factors; None:
    # not measured so, e.g. the probe's factor or fp32's own)
    steps_low: float | None = None
    steps_high: float | None = None

    @property
    def uncertain(self) -> bool:
        """Whether its measured factor is a range within the loss's noise floor."""
        return self.steps_low is not None and self.steps_high is not None and \
            self.steps_high > self.steps_low

    @property
    def best_value(self) -> float:
        """Predicted time per step x the low end of its factor's range (the factor
        itself where it has none): the best the noise floor allows it."""
        low = self.steps_low if self.uncertain else None
        return self.value if low is None else self.time_ms * low

    @property
    def value(self) -> float:
        """Predicted time per step x measured steps factor (untrained: the time alone)."""
        factor = 1.0 if self.steps_factor is None else self.steps_factor
        return self.time_ms * factor

    def to_meta(self, chosen: bool) -> dict:
        meta = {"name": self.name, "source": self.source, "bucket_cap_mb": self.cap_mb,
                "predicted_ms": round(self.time_ms, 4),
                "fidelity": None if self.fidelity is None else round(self.fidelity, 6),
                "steps_factor": None if self.steps_factor is None else round(self.steps_factor, 4),
                "value": round(self.value, 4) if math.isfinite(self.value) else None,
                "chosen": chosen}
        if self.uncertain:  # optional: a range within fp32's loss noise floor
            assert self.steps_low is not None and self.steps_high is not None
            meta["steps_factor_low"] = round(self.steps_low, 4)
            meta["steps_factor_high"] = round(self.steps_high, 4)
        return meta


def _key(planner: Planner, assignment: list[int], cap: float) -> tuple:
    return tuple(planner.problem.options[o] for o in assignment), cap


def one_bucket_cap(planner: Planner) -> float:
    """The smallest cap at which DDP keeps every gradient in one bucket (the PowerSGD hook's
    need): above the model's bytes, in whole MB."""
    total_mb = sum(t.bytes for t in planner.problem.tensors) / (1 << 20)
    return float(max(planner.profile.bucket_cap_mb, math.floor(total_mb) + 1))


def shortlist(planner: Planner, result: SearchResult, options: SearchOptions | None = None,
              limit: int = MAX_FINALISTS, slower: bool = False) -> list[Finalist]:
    """The finalists of a search result (see the module docstring), at most ``limit``,
    without repeats (the same strategies at the same cap: the first name stays, the
    others become its notes), fp32 DDP first (every steps factor is measured against
    it). A plan predicted no faster than fp32 DDP is left out: it would need fewer steps
    than fp32 DDP to win (kept with ``slower``: the in-job trial measures them, where the
    prediction's error is wider than the gap)."""
    problem = planner.problem
    seen: dict[tuple, Finalist] = {}
    out: list[Finalist] = []
    by_kind = {b.kind: b for b in result.baselines}
    fp32 = by_kind[BaselineKind.FP32_DDP]
    fp32_ms = problem.simulate(fp32.assignment, fp32.cap_mb).iteration_ms

    def add(name: str, source: str, assignment: list[int], cap: float) -> None:
        key = _key(planner, assignment, cap)
        if key in seen:
            seen[key].notes.append(f"also {name}")
            return
        time_ms = problem.simulate(assignment, cap).iteration_ms
        if out and time_ms >= fp32_ms and not slower:
            return
        seen[key] = Finalist(name, source, list(assignment), cap, time_ms,
                             problem.fidelity(assignment))
        out.append(seen[key])

    add(fp32.name, "baseline", fp32.assignment, fp32.cap_mb)
    add("bytecomp plan", "search", result.assignment, result.cap_mb)
    if BaselineKind.FP16_HOOK in by_kind:
        fp16 = by_kind[BaselineKind.FP16_HOOK]
        add(fp16.name, "baseline", fp16.assignment, fp16.cap_mb)
    if result.searched is not None:
        assignment, cap = result.searched
        add("the search's plan", "search", assignment, cap)
    cap = one_bucket_cap(planner)
    for spec in hook_specs({o.spec for o in problem.options if o.compressed}, POWERSGD_HOOK):
        hook = powersgd_hook_assignment(problem, spec)
        if hook is not None:
            rank = from_spec(spec).values["rank"]
            add(f"{BaselineKind.POWERSGD_HOOK.value} (rank {rank})", "baseline", hook, cap)
    for assignment, cap, name in _other_mixes(planner, result, options):
        add(name, "mix", assignment, cap)
    return _kept(out, limit)


def _kept(finalists: list[Finalist], limit: int) -> list[Finalist]:
    """The first ``limit`` finalists, the last place given to the best plan of a second
    kind where none made it (the first "X or nothing" mix beside the searched plan and
    the hooks): the runtime trial then has a real alternative to the searched plan
    whenever the model's measured error calls for one (bytecomp.search.verify)."""
    kept = finalists[:limit]
    if any(f.source == "mix" for f in kept) or limit < 3:
        return kept
    mix = next((f for f in finalists[limit:] if f.source == "mix"), None)
    return kept if mix is None else kept[:limit - 1] + [mix]


def _other_mixes(planner: Planner, result: SearchResult,
                 options: SearchOptions | None) -> list[tuple[list[int], float, str]]:
    """The best plan with each of the most promising compressors the plan does not use
    alone (by their 'on every tensor' baselines), searched by time with it or nothing."""
    problem = planner.problem
    used = {problem.options[o].spec for o in result.assignment if problem.options[o].compressed}
    every = sorted((b for b in result.baselines if b.kind is BaselineKind.EVERY_TENSOR
                    and b.spec not in used and math.isfinite(b.value)), key=lambda b: b.value)
    mixes = []
    for baseline in every[:OTHER_MIXES]:
        assert baseline.spec is not None
        other = Planner(planner.profile, None if planner.cluster.measured else planner.cluster,
                        [baseline.spec], strict=True, objective="time")
        found = other.search(options or SearchOptions())
        assignment = [_index(problem, other.problem.options[o]) for o in found.assignment]
        mixes.append((assignment, found.cap_mb,
                      f"{baseline.spec} or nothing ({composition_of(problem, assignment)})"))
    return mixes


def _index(problem, option) -> int:
    """The option's index in ``problem``, offered there if it was not."""
    try:
        return problem.index_of(option)
    except ValueError:
        return problem.add_option(option)


@dataclass
class Choice:
    """The chosen finalist and why, in one line."""

    finalist: Finalist
    reason: str


def choose(finalists: list[Finalist]) -> Choice:
    """The finalist with the least predicted time x measured steps factor; among those
    whose factors are within :data:`STEPS_TOLERANCE` of the best's, the fastest."""
    factors = {id(f): f.steps_factor for f in finalists
               if f.steps_factor is not None and math.isfinite(f.steps_factor)}
    trained = [f for f in finalists if id(f) in factors]
    if not trained:
        best = min(finalists, key=lambda f: f.time_ms)
        return Choice(best, "nothing was trained: the fastest predicted")
    best = min(trained, key=lambda f: f.value)
    near = [f for f in trained if abs(factors[id(f)] - factors[id(best)]) <= STEPS_TOLERANCE
            and f.time_ms < best.time_ms]
    if near:
        faster = min(near, key=lambda f: f.time_ms)
        return Choice(faster, f"its steps factor {faster.steps_factor:.2f} is within "
                              f"{STEPS_TOLERANCE:g} of the best ({best.name}, "
                              f"{best.steps_factor:.2f}) and it is faster "
                              f"({faster.time_ms:.2f} ms against {best.time_ms:.2f})")
    return Choice(best, f"the least predicted time x measured steps: {best.time_ms:.2f} ms x "
                        f"{best.steps_factor:.2f} = {best.value:.2f} ms per fp32 step")
