"""A search's result: the plan found, the baselines it was measured against, and
how far it may be from the optimum."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from bytecomp.costs.clusters import Cluster
from bytecomp.search.problem import Objective, Problem
from bytecomp.search.settings import BaselineKind

LOOSE_GAP = 0.5  # a gap above this is the bound's looseness, not the plan's (gap_known)


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


def fp32_ms(result: SearchResult) -> float:
    """fp32 DDP's predicted iteration time in a search result."""
    fp32 = result.baseline(BaselineKind.FP32_DDP)
    assert fp32 is not None  # every search prices it
    return fp32.time_ms
