"""Search algorithms over assignments (the lower bound that measures them is
:mod:`bytecomp.search.channel_bound` and :mod:`bytecomp.search.bound`).

* :func:`greedy_over_caps`, in the spirit of Espresso: tensors grouped by size
  (same numel and shape), largest first and, among equals, closest to the
  output first; each group tries the screened options for all its tensors and
  keeps the one that minimizes the simulated iteration; after each pass the
  bucket cap moves to the best of the candidates. Bubble-aware: tensors whose
  communication is followed by an idle channel are hidden behind compute, so
  compressing them cannot help and they are not tried.
* :func:`anneal`: simulated annealing on the fast evaluator for a number of
  evaluations (spent in full unless the budget's target, a value close enough to
  the lower bound, is met; a seeded generator, so the same inputs give the same
  plan; an optional wall-clock deadline only cuts a long search short): moves
  that give one tensor, a whole
  bucket or a size class another option, join a tensor to a neighbour's group,
  or change the bucket cap; worse moves are accepted with a probability that
  falls with the relative loss and the temperature; after a stretch without a
  new best it restarts from the next start (every baseline, then random
  assignments); it ends with a descent from the best assignment, and while evaluations
  are left, further rounds start from a perturbation of the best point.
* the exact search for small problems is :mod:`bytecomp.search.exact`.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from bytecomp.search.bound import coarse_curves_computed
from bytecomp.search.problem import Problem

EPSILON = 1e-9


def size_classes(problem: Problem) -> list[list[int]]:
    """Positions grouped by (numel, shape), largest first, earliest-ready first."""
    classes: dict[tuple, list[int]] = defaultdict(list)
    for position, tensor in enumerate(problem.tensors):
        classes[(tensor.numel, tensor.shape)].append(position)
    return sorted(classes.values(), key=lambda c: (-problem.tensors[c[0]].numel, c[0]))


def _hidden(problem: Problem, assignment, cap_mb: float) -> set[int]:
    """Uncompressed positions whose group's communication is followed by an idle channel."""
    result = problem.simulate(assignment, cap_mb)
    hidden: set[int] = set()
    for index, group in enumerate(problem.groups(assignment, cap_mb)):
        if not problem.options[group.option].compressed and result.idle_after(index):
            hidden.update(group.members)
    return hidden


def screened_options(problem: Problem, members: list[int], keep: int) -> list[int]:
    """A cheap screen before simulating: the options that cost least for ``members``
    exchanged alone. Cost: channel time plus what lands on the compute stream (device
    encode and decode), or for host options the copies and the host work shared by the
    workers. The best ``keep`` of each placement stay, and uncompressed always does."""
    if keep <= 0 or len(problem.options) <= keep:
        return list(range(len(problem.options)))
    key = (tuple(members), keep)
    if key not in problem.screens:  # every pass and every start asks again
        problem.screens[key] = _screen(problem, members, keep)
    return problem.screens[key]


def _screen(problem: Problem, members: list[int], keep: int) -> list[int]:
    numel = sum(problem.tensors[p].numel for p in members)
    shapes = tuple(problem.tensors[p].shape for p in members)
    by_fidelity = problem.objective.uses_fidelity
    gains: dict[int, float] = {}

    def gain(option: int) -> float:
        if option not in gains:
            gains[option] = problem.group_gain(members, option)
        return gains[option]

    def alone(option: int) -> float:
        cost = problem.costs.cost(problem.options[option], numel,
                                  shapes if problem.low_rank[option] else None)
        work = cost.encode_ms + cost.decode_ms
        if cost.host:
            time = cost.channel_ms + cost.copy_in_ms + cost.copy_out_ms + \
                work / problem.host_workers
        else:
            time = cost.channel_ms + work
        if by_fidelity:  # what the time buys: less with a lossy option
            return time / gain(option) if gain(option) > 0 else math.inf
        return time

    chosen = [i for i, o in enumerate(problem.options) if not o.compressed]
    for place in ("device", "host"):
        mine = [i for i, o in enumerate(problem.options) if o.compressed and o.place == place]
        if len(mine) > keep:
            mine = _bracketed(problem, mine, numel, keep, gain if by_fidelity else None)
        chosen += sorted(mine, key=alone)[:keep]
    return chosen


def _bracketed(problem: Problem, options: list[int], numel: int, keep: int,
               gain) -> list[int]:
    """``options`` less those that cannot be among the ``keep`` cheapest alone for a
    group of ``numel`` elements, from the lower bound's coarse cost curves (where the
    search computed them): costs do not fall as a group grows, so an option costs at
    least its cost at the grid size below ``numel`` and at most at the size above.
    An option whose least is above the ``keep``-th smallest most cannot be kept. The
    low-rank options (their costs depend on the shapes) always stay. (The lower
    bound assumes the same monotone costs; were one to fall as a group grows, this
    would be a screen of the screen rather than an exact one.)"""
    curves = coarse_curves_computed(problem)
    if curves is None:
        return options
    grid, table = curves
    above = int(np.searchsorted(grid, numel))  # the first size >= numel
    if above >= len(grid) or grid[0] > numel:
        return options
    below = above if grid[above] == numel else above - 1
    plain = [o for o in options if not problem.low_rank[o]]
    if len(plain) <= keep:
        return options
    rows = table[plain][:, :, [below, above]]  # (option, quantity, (below, above))
    channel, device, host, copies = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    alone = channel + device + copies + host / problem.host_workers
    if gain is not None:
        gains = np.array([gain(o) for o in plain])
        with np.errstate(divide="ignore"):
            alone = np.where(gains[:, None] > 0, alone / np.maximum(gains, 1e-300)[:, None],
                             np.inf)
    most = float(np.partition(alone[:, 1], keep - 1)[keep - 1])
    kept = {o for o, least in zip(plain, alone[:, 0]) if least <= most}
    return [o for o in options if problem.low_rank[o] or o in kept]


def greedy_over_caps(problem: Problem, caps: list[float], cap_mb: float, start: list[int],
                     keep: int = 3, passes: int = 6, target: float = -math.inf,
                     deadline: float = math.inf) -> tuple[list[int], float, float]:
    """Espresso-style greedy over size classes, each class trying its ``keep`` screened
    options, that re-chooses the bucket cap after every pass: the assignment moves
    to whichever of ``caps`` it is best at, and the next pass runs there (a start at
    a cap not in ``caps`` always moves to one). Passes repeat while one improves or
    the cap changes, at most ``passes``; it stops once the plan is at or below
    ``target`` at one of ``caps``. Returns (assignment, value, cap). (A pass is a
    few hundred evaluations at 314 tensors, checking every cap a few: no passes are
    spent polishing an assignment for a cap it then leaves.) ``deadline`` (a
    ``time.perf_counter()`` value) cuts it short: a pass tries one size class per
    option each, so on tens of thousands of distinct shapes a pass is quadratic."""
    current = list(start)
    best = problem.evaluate(current, cap_mb)
    for _ in range(passes):
        before = best
        current, best = _greedy_pass(problem, cap_mb, current, best, keep, target, deadline)
        settled = cap_mb in caps
        if settled and (best <= target or _past(deadline)):
            break
        value, cap = min((problem.evaluate(current, c), c) for c in caps)
        if not settled or value < best - EPSILON:
            best, cap_mb = value, cap
            if best <= target:
                break
        elif best >= before - EPSILON:
            break
        if _past(deadline):  # (after the cap's choice: the plan ends at one of caps)
            break
    return current, best, cap_mb


def _past(deadline: float) -> bool:
    return deadline < math.inf and time.perf_counter() >= deadline


def _greedy_pass(problem, cap_mb, current, best, keep, target, deadline=math.inf):
    hidden = None
    for members in size_classes(problem):
        if best <= target or _past(deadline):
            break
        if hidden is None:  # recomputed only after the assignment changed
            hidden = _hidden(problem, current, cap_mb)
        if set(members) <= hidden:
            continue
        choice = None
        for option in screened_options(problem, members, keep):
            if all(current[p] == option for p in members):
                continue
            trial = list(current)
            for position in members:
                trial[position] = option
            value = problem.evaluate(trial, cap_mb)
            if value < best - EPSILON:
                best, choice = value, trial
        if choice is not None:
            current, hidden = choice, None
    return current, best


@dataclass
class Point:
    """An assignment at a bucket cap, and its objective's value."""

    assignment: list[int]
    cap: float
    value: float


MOVES = (("tensor", 0.35), ("bucket", 0.25), ("class", 0.15), ("join", 0.2), ("cap", 0.05))
HOT, COLD = 0.02, 2e-4  # the temperature: a relative loss accepted with probability 1/e
DESCENT_SHARE = 0.15  # of a round's evaluations kept for its descent
ROUND_EVALUATIONS = 20_000  # at most, so that a long budget (or one cut by a deadline)
# runs several cooled rounds rather than one that never cools


class Budget:
    """What the annealing may spend: a number of evaluations (the search's result
    depends on it and on nothing else), optionally a wall-clock deadline that cuts
    a long search short (then the result depends on the machine's speed too), and
    optionally a ``target``: once a plan at or below it is found, nothing is left
    (the default search's target is the lower bound plus its stop gap: a plan that
    close to the bound is that close to the optimum)."""

    def __init__(self, evaluations: int, deadline: float = math.inf,
                 target: float = -math.inf) -> None:
        self.evaluations, self.deadline, self.used = max(0, evaluations), deadline, 0
        self.target = target
        self.best: Point | None = None  # the best plan evaluated through this budget

    @property
    def left(self) -> int:
        """Evaluations left (0 also once the deadline has passed or the target is met)."""
        if self.deadline < math.inf and time.perf_counter() >= self.deadline:
            return 0
        if self.best is not None and self.best.value <= self.target:
            return 0
        return self.evaluations - self.used

    def evaluate(self, problem: Problem, assignment: list[int], cap: float) -> float:
        """``problem.evaluate``, counted; the best plan so far is kept (copied: callers
        go on changing their lists)."""
        self.used += 1
        value = problem.evaluate(assignment, cap)
        if self.best is None or value < self.best.value - EPSILON:
            self.best = Point(list(assignment), cap, value)
        return value


class Screens:
    """Each size class's screened options (:func:`screened_options`), screened when first
    asked: on tens of thousands of distinct shapes screening them all up front took
    longer than a time cap allows, and a capped walk reaches few of them."""

    def __init__(self, problem: Problem, classes: list[list[int]], keep: int) -> None:
        self.problem, self.classes, self.keep = problem, classes, keep
        self.screened: dict[int, list[int]] = {}

    def __getitem__(self, index: int) -> list[int]:
        found = self.screened.get(index)
        if found is None:
            found = self.screened[index] = screened_options(self.problem,
                                                            self.classes[index], self.keep)
        return found


class Annealer:
    """Simulated annealing over assignments and bucket caps (see :func:`anneal`)."""

    def __init__(self, problem: Problem, caps: list[float], keep: int, rng: random.Random,
                 starts: list[Point], budget: Budget) -> None:
        self.problem, self.caps, self.rng, self.budget = problem, caps, rng, budget
        classes = size_classes(problem)
        self.class_of = [0] * len(problem.tensors)
        for index, members in enumerate(classes):
            for position in members:
                self.class_of[position] = index
        self.candidates = Screens(problem, classes, keep)
        self.classes = classes
        self.starts = list(starts)  # restarts, in order; then random assignments
        self.moves = [name for name, _ in MOVES]
        self.weights = [weight for _, weight in MOVES]

    def evaluate(self, assignment: list[int], cap: float) -> float:
        return self.budget.evaluate(self.problem, assignment, cap)

    def random_start(self) -> Point:
        assignment = [self.rng.choice(self.candidates[self.class_of[p]])
                      for p in range(len(self.problem.tensors))]
        return self.at_best_cap(assignment)

    def at_best_cap(self, assignment: list[int]) -> Point:
        value, cap = min((self.evaluate(assignment, c), c) for c in self.caps)
        return Point(assignment, cap, value)

    def restart(self) -> Point:
        if self.starts:
            start = self.starts.pop(0)
            return self.at_best_cap(list(start.assignment))
        return self.random_start()

    def neighbour(self, point: Point) -> tuple[list[int], float]:
        """A random move from ``point``: (assignment, cap); the assignment may be
        ``point``'s own list (for a cap move) but is never modified in place."""
        rng, problem = self.rng, self.problem
        move = rng.choices(self.moves, self.weights)[0]
        assignment = list(point.assignment)
        position = rng.randrange(len(assignment))
        if move == "cap" and len(self.caps) > 1:
            return point.assignment, rng.choice([c for c in self.caps if c != point.cap])
        if move == "tensor":
            assignment[position] = rng.choice(self.candidates[self.class_of[position]])
        elif move == "class":
            members = self.classes[self.class_of[position]]
            option = rng.choice(self.candidates[self.class_of[position]])
            for member in members:
                assignment[member] = option
        else:
            bucket = problem.buckets(point.cap)[problem.bucket_of(point.cap)[position]]
            if move == "join":
                assignment[position] = assignment[rng.choice(bucket)]
            else:
                option = rng.choice(self.candidates[self.class_of[rng.choice(bucket)]])
                for member in bucket:
                    assignment[member] = option
        return assignment, point.cap

    def run(self, start: Point) -> Point:
        """A descent from ``start``, then rounds of annealing and descent until the budget
        is spent: the first from the descent's point, each later one from a perturbation
        of the best point found. (Descending first: the greedy's result is rarely a local
        optimum over every candidate, and a walk that starts from one spends its
        evaluations around a good point, many of them looked up, not simulated.)"""
        best = current = descend(self.problem, start, self.budget, self.candidates,
                                 self.class_of)
        while self.budget.left > 0:
            found = self.round(current)
            if found.value < best.value - EPSILON:
                best = found
            if self.budget.left <= 0:
                break
            current = self.perturbed(best)
        return best

    def perturbed(self, point: Point) -> Point:
        """``point`` after a few random moves (a kick out of its local optimum)."""
        assignment, cap = point.assignment, point.cap
        for _ in range(max(2, len(assignment) // 20)):
            assignment, cap = self.neighbour(Point(assignment, cap, point.value))
        return Point(assignment, cap, self.evaluate(assignment, cap))

    def round(self, start: Point) -> Point:
        """Annealing for most of the evaluations left, at most ``ROUND_EVALUATIONS`` (the
        temperature falls from ``HOT`` to ``COLD`` over them), then a descent from the
        best point."""
        problem, rng, budget = self.problem, self.rng, self.budget
        span = max(1, int(min(budget.left, ROUND_EVALUATIONS) * (1 - DESCENT_SHARE)))
        current = best = start
        stale, patience = 0, max(300, 20 * len(problem.tensors))
        for step in range(span):
            if budget.left <= 0:
                break
            temperature = HOT * (COLD / HOT) ** (step / span)
            assignment, cap = self.neighbour(current)
            value = self.evaluate(assignment, cap)
            if value <= current.value or (math.isfinite(value) and rng.random() < math.exp(
                    -(value - current.value) / current.value / temperature)):
                current = Point(assignment, cap, value)
                if value < best.value - EPSILON:
                    best, stale = current, 0
            stale += 1
            if stale > patience:  # nothing new for a while: from the next start
                current, stale = self.restart(), 0
                if current.value < best.value - EPSILON:
                    best = current
        return descend(problem, best, budget, self.candidates, self.class_of)


def descend(problem: Problem, point: Point, budget: Budget, candidates, class_of) -> Point:
    """First-improvement descent: whole buckets, then single tensors, each to every
    candidate option of its class, until no move helps or the budget is spent."""
    assignment, value, cap = list(point.assignment), point.value, point.cap
    improved = True
    while improved and budget.left > 0:
        improved = False
        for bucket in problem.buckets(cap):
            options = dict.fromkeys(o for p in bucket for o in candidates[class_of[p]])
            for option in options:
                if budget.left <= 0:
                    return Point(assignment, cap, value)
                if all(assignment[p] == option for p in bucket):
                    continue
                trial = list(assignment)
                for p in bucket:
                    trial[p] = option
                trial_value = budget.evaluate(problem, trial, cap)
                if trial_value < value - EPSILON:
                    assignment, value, improved = trial, trial_value, True
        for position in range(len(assignment)):
            original = assignment[position]
            for option in candidates[class_of[position]]:
                if option == original or budget.left <= 0:
                    continue
                assignment[position] = option
                trial_value = budget.evaluate(problem, assignment, cap)
                if trial_value < value - EPSILON:
                    value, original, improved = trial_value, option, True
            assignment[position] = original
    return Point(assignment, cap, value)


def anneal(problem: Problem, caps: list[float], start: Point, budget: Budget,
           restarts: list[Point], keep: int = 8, seed: int = 0) -> Point:
    """The best point found from ``start`` by simulated annealing within ``budget`` (see
    the module docstring); never worse than ``start``. Deterministic for a given
    ``seed`` and number of evaluations unless the budget's deadline cuts it short.
    ``restarts``: where to go when the walk stalls (then random assignments of the
    screened options); ``keep``: the options screened per size class (0: all)."""
    annealer = Annealer(problem, caps, keep, random.Random(seed), restarts, budget)
    found = annealer.run(start)
    if budget.best is not None and budget.best.value < found.value - EPSILON:
        found = budget.best  # met the target on a point the walk had not kept yet
    return found if found.value < start.value - EPSILON else start
