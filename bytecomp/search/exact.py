"""Exact search for small problems: branch and bound over the tensors, largest first.

Per bucket cap, the tree fixes one tensor at a time, largest first: it joins a group
of its bucket or opens one with an option no group of the bucket uses (the tensors of
a group are merged, as the planner merges them). Leaves are evaluated by the model.

A node is bounded by a relaxation of the timeline that no plan below it can beat,
:func:`relaxed_ms`: the same buckets, groups and channel, with device decodes on a
server of their own instead of interrupting the backward pass, host work and copies
never waiting for a worker or the copy engine, and the channel not slowing the
backward pass; the iteration also lasts at least all the compute stream's work. It
is a max-plus system, so more work never ends sooner in it, and every event of the
model happens no earlier than in it. (The model itself is not monotone: a decode
that arrives earlier can delay the next bucket's launch and end the iteration later,
so a bound from the model's own simulation of part of a plan can be above a plan;
one was, by 0.005 ms of 21.6, on a 10-tensor LSTM.) Buckets not reached are a
*floor group*: the least channel time any of their configurations takes (its largest
tensor alone at its cheapest), and nothing else; the bucket being filled is its
groups' channel work so far, and its hooks and device encodes.

Options whose costs are the same on every resource for a tensor alone in its bucket
give the same timeline: only the first opens its group. The fp32 allreduce on every tensor and PyTorch's hooks run
without bytecomp's executor, so without its fixed costs: the search starts from the
best of them at every cap and the incumbent it is given, and prices the rest through
the executor. Caps that make the same buckets are searched once, those whose root
bound is least first. The search ends, unproven, at a deadline or where a cap's
search reaches its node limit, with the best plan found.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from bytecomp.costs.strategy import GroupCost
from bytecomp.search.algorithms import EPSILON
from bytecomp.search.channel_bound import channel_ms, distinct_channels
from bytecomp.search.problem import UNASSIGNED, Problem
from bytecomp.timeline.iteration import IterationModel, SimGroup

CHECK_EVERY = 64  # nodes between looks at the clock
START = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # relaxed_state before the first bucket


@dataclass
class ExactResult:
    """The best plan found and what was proved: ``proven`` (every cap searched through),
    the caps searched through and those not, and the nodes spent."""

    assignment: list[int]
    cap: float
    value: float
    proven: bool
    searched: list[float] = field(default_factory=list)
    unfinished: list[float] = field(default_factory=list)
    nodes: int = 0


class _Stop(Exception):
    pass


def exact_search(problem: Problem, caps: list[float], incumbent: list[int], cap: float,
                 value: float, deadline: float = math.inf,
                 node_limit: float = math.inf) -> ExactResult:
    """The optimum over ``caps`` from the ``incumbent`` (its ``value`` at ``cap``), or the
    best found by ``deadline`` (a ``time.perf_counter()`` value) or before a cap's search
    spends ``node_limit`` nodes (each cap's: one cap not searched through leaves the
    optimum unproven, so the search ends there): never worse than the incumbent."""
    best = ExactResult(list(incumbent), cap, value, True)
    classes: dict[tuple, list[float]] = {}
    for other in caps:
        key = (tuple(map(tuple, problem.buckets(other))), problem.one_bucket(other))
        classes.setdefault(key, []).append(other)
    _natives(problem, caps, best)
    # the lowest root bounds first: a good plan found early prunes the rest
    searches = [(group, _CapSearch(problem, cap if cap in group else group[0]))
                for group in classes.values()]
    searches.sort(key=lambda item: item[1].root_bound())
    nodes = 0
    for index, (group, search) in enumerate(searches):
        search.best_value = best.value
        search.best = best.assignment if best.cap in group else None
        search.deadline, search.node_limit = deadline, node_limit
        done = search.run()
        nodes += search.nodes
        if search.best is not None and search.best_value < best.value - EPSILON:
            best.assignment, best.value = list(search.best), search.best_value
            best.cap = search.cap
        (best.searched if done else best.unfinished).extend(group)
        if not done:
            best.proven = False
        if index + 1 < len(searches) and (
                not done or time.perf_counter() >= deadline):
            best.proven = False
            for rest, _ in searches[index + 1:]:
                best.unfinished.extend(rest)
            break
    best.nodes = nodes
    best.searched.sort()
    best.unfinished.sort()
    return best


def _natives(problem: Problem, caps: list[float], best: ExactResult) -> None:
    """The plans that run without bytecomp's executor (fp32 allreduce on every tensor at
    every cap, PyTorch's hooks where DDP makes one bucket), which the bounds price through
    it: the best of them and the incumbent is where the search starts."""
    candidates = []
    if problem._native is not None:
        candidates += [(problem.uniform(problem._native), c) for c in caps]
    candidates += [(list(hook), c) for hook in sorted(problem._hooks) for c in caps
                   if problem.one_bucket(c)]
    for assignment, cap in candidates:
        value = problem.evaluate(assignment, cap)
        if value < best.value - EPSILON:
            best.assignment, best.value, best.cap = assignment, value, cap


class _CapSearch:
    """Branch and bound at one cap (see the module docstring)."""

    def __init__(self, problem: Problem, cap: float) -> None:
        self.problem, self.cap = problem, cap
        self.buckets = problem.buckets(cap)
        self.owner = problem.bucket_of(cap)
        self.place = problem._place_in_bucket(cap)
        self.model: IterationModel = problem.iteration_model(cap)
        self.nodes, self.node_limit, self.deadline = 0, math.inf, math.inf
        self.best: list[int] | None = None
        self.best_value = math.inf
        self.partial = [UNASSIGNED] * len(problem.tensors)
        self.gathers = problem.costs.gathers
        distinct = distinct_channels(problem)
        numel = problem._numel
        self.sequence = sorted(range(len(problem.tensors)), key=lambda p: (-numel[p], p))
        self.current: list[list[SimGroup]] = [
            [SimGroup(index, GroupCost(0.0, self._floor(members, distinct), 0.0))]
            for index, members in enumerate(self.buckets)]
        self.blocks: list[list[list[int]]] = [[] for _ in self.buckets]
        self.chosen: list[list[int]] = [[] for _ in self.buckets]
        self.left = [len(members) for members in self.buckets]  # tensors not yet fixed
        self.openers = [self._distinct_options(p) for p in range(len(problem.tensors))]
        self.backward = max([self.model.backward_ms, *self.model.bucket_ready_ms])
        self.made: dict[tuple, SimGroup] = {}  # groups by (bucket, option, members, gathered)

    def _floor(self, members: list[int], distinct: list[int]) -> float:
        """The least channel time of a bucket: its largest tensor alone at its cheapest
        (a group costs no less than any of its tensors alone). (The lower bound's price
        per element for the rest assumes concave costs, and a fitted curve measured a
        hundred nanoseconds under it on the test instances.)"""
        problem = self.problem
        largest = problem.tensors[max(members, key=lambda p: problem.tensors[p].numel)]
        return min(channel_ms(problem, index, largest.numel, (largest.shape,))
                   for index in distinct)

    def _distinct_options(self, position: int) -> list[int]:
        """The options that open a group of the tensor at ``position``: of options whose
        costs for it alone are the same (and its gain, where fidelity counts), the first;
        and only where the tensor is alone in its bucket (a group that others may join
        can differ where it grows)."""
        problem = self.problem
        options = range(len(problem.options))
        if len(self.buckets[self.owner[position]]) > 1:
            return list(options)
        seen: dict[tuple, int] = {}
        weights = problem._weights if problem.objective.uses_fidelity else None
        for option in options:
            cost = problem._sim_group(0, option, (position,), False).cost
            key = (cost, weights[position][option] if weights is not None else None)
            seen.setdefault(key, option)
        return sorted(seen.values())

    # -- bounds ---------------------------------------------------------------------------
    def root_bound(self) -> float:
        return self._bound()

    def _bound(self, bucket: int = 0, prefix: tuple = START) -> float:
        """The bound of the node; ``prefix``: the relaxed state before ``bucket`` (the
        buckets before it as they are now)."""
        scale = self.problem.objective_of(1.0, self.partial)
        if scale == math.inf:
            return math.inf
        state = relaxed_state(self.model, self.current, bucket, len(self.current), prefix)
        return relaxed_end(self.model, state, self.backward) * scale

    def _partial_groups(self, bucket: int, blocks: list[list[int]],
                        options: list[int]) -> Unordered:
        """A bucket with tensors left: its groups so far at their members' price (not
        gathered: a later tensor may join them up), in no order (one joining may change
        it)."""
        return Unordered([self._group(bucket, option, tuple(sorted(members)), False)
                          for members, option in zip(blocks, options)])

    def _group(self, bucket: int, option: int, members: tuple[int, ...],
               gathered: bool) -> SimGroup:
        key = (bucket, option, members, gathered)
        group = self.made.get(key)
        if group is None:
            if len(self.made) > 200_000:  # a memory guard for a long search
                self.made.clear()
            group = self.made[key] = self.problem._sim_group(bucket, option, members, gathered)
        return group

    def _groups(self, bucket: int, blocks: list[list[int]], options: list[int]) -> list[SimGroup]:
        """A whole bucket's groups in launch order (``blocks`` sorted by first member)."""
        check = len(blocks) > 1 and self.gathers
        place = self.place
        return [self._group(bucket, option, tuple(members), check and
                            place[members[-1]] - place[members[0]] + 1 != len(members))
                for members, option in zip(blocks, options)]

    # -- the tree -------------------------------------------------------------------------
    def run(self) -> bool:
        """Search through; False if stopped by the deadline or the node limit."""
        try:
            self._step(0)
        except _Stop:
            return False
        return True

    def _tick(self) -> None:
        self.nodes += 1
        if self.nodes > self.node_limit or (
                self.nodes % CHECK_EVERY == 0 and time.perf_counter() >= self.deadline):
            raise _Stop

    def _step(self, depth: int) -> None:
        """Fix the ``depth``-th tensor (largest first) every way its bucket allows, the
        children with the least bound first."""
        if depth == len(self.sequence):
            value = self.problem.evaluate(self.partial, self.cap)
            if value < self.best_value - EPSILON:
                self.best_value, self.best = value, list(self.partial)
            return
        position = self.sequence[depth]
        bucket = self.owner[position]
        blocks, options = self.blocks[bucket], self.chosen[bucket]
        saved = self.current[bucket]
        self.left[bucket] -= 1
        last = self.left[bucket] == 0
        choices = [(block, options[block]) for block in range(len(blocks))] + \
            [(None, option) for option in self.openers[position] if option not in options]
        prefix = relaxed_state(self.model, self.current, 0, bucket)  # the same for each
        children = []
        for block, option in choices:
            self._tick()
            trial_blocks = [list(b) for b in blocks]
            trial_options = list(options)
            if block is None:
                trial_blocks.append([position])
                trial_options.append(option)
            else:
                trial_blocks[block].append(position)
            self.partial[position] = option
            if last:
                ordered = sorted(zip(trial_blocks, trial_options), key=lambda b: min(b[0]))
                trial_blocks = [sorted(b) for b, _ in ordered]
                trial_options = [o for _, o in ordered]
                groups = self._groups(bucket, trial_blocks, trial_options)
            else:
                groups = self._partial_groups(bucket, trial_blocks, trial_options)
            self.current[bucket] = groups
            bound = self._bound(bucket, prefix)
            if bound < self.best_value - EPSILON:
                children.append((bound, trial_blocks, trial_options, option, groups))
        children.sort(key=lambda child: child[0])
        for bound, trial_blocks, trial_options, option, groups in children:
            if bound >= self.best_value - EPSILON:
                break
            self.partial[position] = option
            self.current[bucket] = groups
            self.blocks[bucket], self.chosen[bucket] = trial_blocks, trial_options
            self._step(depth + 1)
        self.blocks[bucket], self.chosen[bucket] = blocks, options
        self.current[bucket] = saved
        self.partial[position] = UNASSIGNED
        self.left[bucket] += 1


class Unordered(list):
    """A bucket's groups in an order not yet known (see :func:`relaxed_ms`)."""


def relaxed_ms(model: IterationModel, by_bucket: list[list[SimGroup]]) -> float:
    """A lower bound of the iteration time the model gives these groups (bucket by
    bucket, in launch order), and of any plan whose groups take at least this work of
    every resource: the model relaxed as the module docstring says. The backward pass
    advances to each bucket's ready point, the bucket's hooks and device encodes run on
    the compute stream, each group's channel starts once it is encoded (host groups:
    copied in and encoded by a worker of their own) and the channel is free; device
    decodes run one after another on a server of their own from their channel's end,
    host decodes and copies out at once; the iteration ends when all of that is done,
    and no sooner than the compute stream's work (backward, hooks, device encodes and
    decodes) allows.

    A bucket given as :class:`Unordered` is bounded for every order of its groups: the
    hooks and encodes take the compute stream in sum, the channel takes its groups'
    work in sum from the earliest any could start, each group's channel ends no sooner
    than were it first, and the decodes reach their server in that order."""
    return relaxed_end(model, relaxed_state(model, by_bucket, 0, len(by_bucket)))


def relaxed_state(model: IterationModel, by_bucket: list[list[SimGroup]], first: int,
                  stop: int, state: tuple = START) -> tuple:
    """:func:`relaxed_ms`'s state after buckets ``first`` to ``stop`` (excluded), from
    ``state`` (the state before ``first``): the same for every plan that shares the
    buckets before ``first``."""
    hooked = model.through_hook
    busy = model.busy_collective_ms
    clock, work, channel_free, last, decoded, decodes, ready = state
    for bucket in range(first, stop):
        groups = by_bucket[bucket]
        if model.bucket_ready_ms[bucket] > ready:
            ready = model.bucket_ready_ms[bucket]
        if ready > work:
            clock += ready - work
            work = ready
        if hooked:
            clock += model.bucket_hook_ms
        if type(groups) is Unordered:
            launch, first_free, starts, ends = clock, channel_free, [], []
            for group in groups:
                cost = group.cost
                own = launch + (cost.hook_ms if hooked else 0.0) + cost.encode_ms + \
                    cost.copy_in_ms  # (copy_in is 0 on the device)
                occupies = cost.channel_ms + (cost.tail_ms if hooked else 0.0) + \
                    (model.busy_extra_ms(cost, bucket) if busy else 0.0)
                starts.append(own)
                ends.append(((own if own > first_free else first_free) + occupies, cost))
                channel_free += occupies
                clock += (cost.hook_ms if hooked else 0.0) + \
                    (0.0 if cost.host else cost.encode_ms)
            if groups:
                earliest = min(starts)
                channel_free = (earliest if earliest > first_free else first_free) + \
                    channel_free - first_free
            ends = sorted(ends, key=lambda item: item[0])
        else:
            ends = []
            for group in groups:
                cost = group.cost
                if hooked:
                    clock += cost.hook_ms
                if cost.host:
                    encoded = clock + cost.copy_in_ms + cost.encode_ms
                else:
                    clock += cost.encode_ms
                    encoded = clock
                start = encoded if encoded > channel_free else channel_free
                channel_free = start + cost.channel_ms + (cost.tail_ms if hooked else 0.0)
                if busy:
                    channel_free += model.busy_extra_ms(cost, bucket)
                ends.append((channel_free, cost))
        # each group's decode once its channel work ends (``sent``), in that order: a host
        # decode and its copy never wait, a device decode queues on the decodes' server
        for sent, cost in ends:
            if cost.host:
                end = sent + cost.decode_ms + cost.copy_out_ms
            elif cost.decode_ms > 0:
                decoded = (sent if sent > decoded else decoded) + cost.decode_ms
                decodes += cost.decode_ms
                end = decoded
            else:
                end = sent
            if end > last:
                last = end
    return clock, work, channel_free, last, decoded, decodes, ready


def relaxed_end(model: IterationModel, state: tuple, backward: float | None = None) -> float:
    """:func:`relaxed_ms` from the state after the last bucket (``backward``: the
    backward pass's length, where the caller knows it)."""
    clock, work, _, last, _, decodes, _ = state
    if backward is None:
        backward = max([model.backward_ms, *model.bucket_ready_ms])
    if backward > work:
        clock += backward - work
    end = max(clock + decodes, last)
    return model.forward_ms + end + model.optimizer_ms
