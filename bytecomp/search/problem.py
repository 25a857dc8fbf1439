"""A planning problem: tensors, compute times, options and their costs.

An *assignment* gives every tensor (in gradient-ready order) the index of its
option. Groups follow MergeComp's rule: the tensors of one DDP bucket with the
same option are concatenated and exchanged once (a low-rank compressor keeps
each member as its own matrix). A group is released when its bucket is.
"""

from __future__ import annotations

import copy
import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter

from bytecomp.buckets import ddp_buckets
from bytecomp.compress import from_spec
from bytecomp.costs.strategy import GroupCost, StrategyCosts
from bytecomp.plan_types import HOST_WORKERS, NO_COMPRESSION, Option
from bytecomp.timeline.simulator import (
    IterationModel,
    SimGroup,
    SimResult,
    simulate,
)
from bytecomp.timeline.single_pass import simulate_single_pass

UNASSIGNED = -1
MAX_REMEMBERED = 50_000  # evaluated plans kept for lookup (a few MB at 1,500 tensors)
REMEMBERED_BYTES = 256 << 20  # and at most about this much of their keys (4 B a tensor)


@dataclass(frozen=True)
class Objective:
    """What the search minimizes: ``time`` (predicted iteration time) or ``effective``
    (iteration time / fidelity, never a plan whose fidelity is below
    ``min_fidelity``)."""

    name: str = "time"
    min_fidelity: float = 0.0
    weights: str = "params"  # how tensors' gains compose (bytecomp.costs.gains.WEIGHTS)

    @property
    def uses_fidelity(self) -> bool:
        return self.name == "effective"


def _low_rank(option: Option) -> bool:
    """A low-rank compressor keeps each member of a group as its own matrix."""
    return option.compressed and from_spec(option.spec).per_matrix


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int
    shape: tuple
    ready_ms: float
    element_size: int = 4
    dtype: str = "float32"

    @property
    def bytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class Group:
    """A merged group of an assignment: its bucket, option and members (positions)."""

    bucket: int
    option: int
    members: tuple[int, ...]


class Problem:
    """Everything fixed while searching; evaluates assignments by simulation."""

    def __init__(self, tensors: list[Tensor], forward_ms: float, backward_ms: float,
                 optimizer_ms: float, costs: StrategyCosts, options: list[Option],
                 host_workers: int = HOST_WORKERS, interference: float = 0.0,
                 intra_interference: float | None = None, bucket_hook_ms: float = 0.0,
                 shared_compute: bool = False, busy_collective_ms: float = 0.0) -> None:
        self.tensors = tensors
        self.forward_ms = forward_ms
        self.backward_ms = max(backward_ms, max((t.ready_ms for t in tensors), default=0.0))
        self.optimizer_ms = optimizer_ms
        self.costs = costs
        self.options = options
        self.host_workers = host_workers
        self.interference = interference
        self.intra_interference = intra_interference
        self.bucket_hook_ms = bucket_hook_ms
        self.shared_compute = shared_compute
        self.busy_collective_ms = busy_collective_ms
        # fp32 allreduce on every tensor runs as DDP's own allreduce: no hook, no fixed costs
        self._native = options.index(NO_COMPRESSION) if NO_COMPRESSION in options else None
        self._hooks: frozenset[tuple[int, ...]] = frozenset()  # add_hook's
        # one_bucket's facts (branch and bound asks at every node)
        self._one_dtype = len({t.dtype for t in tensors}) == 1
        self._total_bytes = sum(t.bytes for t in tensors)
        self._buckets: dict[float, list[list[int]]] = {}
        self._models: dict[tuple[float, bool], IterationModel] = {}
        self.low_rank = [_low_rank(o) for o in options]
        self.evaluations = 0
        self._bucket_groups: dict = {}  # (cap, gather) -> per bucket {options: groups}
        self._bucket_entries = 0
        self._layouts: dict = {}
        self._owners: dict = {}
        self._pickers: dict[float, list] = {}
        self._numel = [t.numel for t in tensors]
        self._bytes = [t.bytes for t in tensors]
        self._group_costs: dict[tuple, GroupCost] = {}
        self._labels = [o.label for o in options]
        self.screens: dict[tuple, list[int]] = {}  # search.algorithms.screened_options
        self._values: dict[tuple[float, bytes], float] = {}  # evaluate's, by plan
        self.objective = Objective()
        self._gain_of: Callable[[Tensor, Option], float] | None = None
        # per tensor: share * gain^2 for each option, then the share alone (gain 1), so
        # that UNASSIGNED (-1) reads an unassigned tensor as uncompressed
        self._weights: list[list[float]] | None = None

    # -- buckets ---------------------------------------------------------------------
    def buckets(self, cap_mb: float) -> list[list[int]]:
        if cap_mb not in self._buckets:
            self._buckets[cap_mb] = ddp_buckets([t.bytes for t in self.tensors],
                                                [t.dtype for t in self.tensors], cap_mb)
        return self._buckets[cap_mb]

    def bucket_of(self, cap_mb: float) -> list[int]:
        """Each position's bucket (do not modify: it is cached)."""
        owner = self._owners.get(cap_mb)
        if owner is None:
            owner = self._owners[cap_mb] = [0] * len(self.tensors)
            for index, members in enumerate(self.buckets(cap_mb)):
                for position in members:
                    owner[position] = index
        return owner

    def iteration_model(self, cap_mb: float, native: bool = False) -> IterationModel:
        """The iteration's compute and buckets; ``native``: run as DDP's own allreduce,
        without bytecomp's hook (so without the executor's fixed costs)."""
        key = (cap_mb, native)
        if key not in self._models:
            ready = [max(self.tensors[p].ready_ms for p in members)
                     for members in self.buckets(cap_mb)]
            self._models[key] = IterationModel(self.forward_ms, self.backward_ms,
                                               self.optimizer_ms, ready, self.host_workers,
                                               self.interference, self.intra_interference,
                                               through_hook=not native,
                                               bucket_hook_ms=self.bucket_hook_ms,
                                               shared_compute=self.shared_compute,
                                               busy_collective_ms=self.busy_collective_ms)
        return self._models[key]

    def add_hook(self, assignment) -> None:
        """An assignment that runs as PyTorch's own hook, without bytecomp's executor, at
        a cap where DDP makes one bucket (PowerSGD's,
        :func:`bytecomp.search.baselines.powersgd_hook_assignment`: see
        :func:`bytecomp.runtime.native.one_bucket`)."""
        self._hooks = self._hooks | {tuple(assignment)}

    def one_bucket(self, cap_mb: float) -> bool:
        """Whether DDP keeps every gradient in one bucket at ``cap_mb`` by the executor's
        rule (:func:`bytecomp.runtime.native.one_bucket`): one dtype, less than the cap."""
        return self._one_dtype and self._total_bytes < cap_mb * (1 << 20)

    def is_native(self, assignment, cap_mb: float) -> bool:
        """Whether the assignment runs without bytecomp's executor (so without its fixed
        costs) at ``cap_mb``: fp32 allreduce on every tensor (DDP's own), or one of the
        hooks' in one bucket."""
        if self._native is not None and assignment.count(self._native) == len(assignment):
            return True
        return bool(self._hooks) and tuple(assignment) in self._hooks and \
            self.one_bucket(cap_mb)

    def may_be_native(self, assignment, cap_mb: float) -> bool:
        """Whether some completion of a partial assignment is :meth:`is_native`."""
        if self._native is not None and \
                assignment.count(self._native) + assignment.count(UNASSIGNED) == len(assignment):
            return True
        return self.one_bucket(cap_mb) and any(
            all(a == UNASSIGNED or a == h for a, h in zip(assignment, hook))
            for hook in self._hooks)

    # -- groups and evaluation ---------------------------------------------------------
    def groups(self, assignment, cap_mb: float) -> list[Group]:
        """Merged groups in launch order: bucket by bucket, options in order of first use."""
        out = []
        for index, members in enumerate(self.buckets(cap_mb)):
            by_option: dict[int, list[int]] = {}
            for position in members:
                option = assignment[position]
                if option != UNASSIGNED:
                    by_option.setdefault(option, []).append(position)
            out += [Group(index, option, tuple(positions))
                    for option, positions in by_option.items()]
        return out

    def scattered(self, members: tuple[int, ...], cap_mb: float) -> bool:
        """True unless the members are one run of adjacent tensors in one bucket, i.e.
        the executor must gather them into one tensor and scatter the result back."""
        if len(members) < 2:
            return False
        owner, place = self.bucket_of(cap_mb), self._place_in_bucket(cap_mb)
        if any(owner[p] != owner[members[0]] for p in members):
            return True
        indices = [place[p] for p in members]
        return max(indices) - min(indices) + 1 != len(members)

    def _place_in_bucket(self, cap_mb: float) -> list[int]:
        """Each position's index inside its bucket."""
        place = self._layouts.get(cap_mb)
        if place is None:
            place = self._layouts[cap_mb] = [0] * len(self.tensors)
            for positions in self.buckets(cap_mb):
                for index, position in enumerate(positions):
                    place[position] = index
        return place

    def sim_groups(self, groups: list[Group], cap_mb: float | None = None) -> list[SimGroup]:
        """Groups with their costs; with ``cap_mb``, scattered members pay for gathering."""
        return [self._sim_group(group.bucket, group.option, group.members,
                                cap_mb is not None and self.scattered(group.members, cap_mb))
                for group in groups]

    def _sim_group(self, bucket: int, option: int, members: tuple[int, ...],
                   scattered: bool) -> SimGroup:
        key = (option, members, scattered)
        cost = self._group_costs.get(key)
        if cost is None:
            if len(self._group_costs) > 200_000:
                self._group_costs.clear()
            numel = sum(map(self._numel.__getitem__, members))
            shapes = tuple(self.tensors[p].shape for p in members) \
                if self.low_rank[option] else None
            cost = self.costs.cost(self.options[option], numel, shapes)
            if scattered:
                cost = self.costs.gathered(cost, sum(map(self._bytes.__getitem__, members)))
            self._group_costs[key] = cost
        return SimGroup(bucket, cost, self._labels[option], members)

    def _fast_sim_groups(self, assignment, cap_mb: float, gather: bool = True) -> list[SimGroup]:
        """``sim_groups(groups(...))``, with each bucket's groups cached by its options.
        ``gather=False`` leaves out the cost of gathering scattered members (a partial
        assignment's groups may become contiguous later: bounds must not count it)."""
        return [group for groups in self._groups_by_bucket(assignment, cap_mb, gather)
                for group in groups]

    def _groups_by_bucket(self, assignment, cap_mb: float,
                          gather: bool = True) -> list[list[SimGroup]]:
        """:meth:`_fast_sim_groups` bucket by bucket (each bucket's list is cached: do
        not modify it)."""
        out: list[list[SimGroup]] = []
        pickers = self._pickers.get(cap_mb)
        if pickers is None:  # reads a bucket's options in one C call (this is the hot loop)
            pickers = self._pickers[cap_mb] = [itemgetter(*members, members[0])
                                               for members in self.buckets(cap_mb)]
        caches = self._bucket_groups.get((cap_mb, gather))
        if caches is None:  # per bucket: its groups by its members' options
            caches = self._bucket_groups[(cap_mb, gather)] = [{} for _ in pickers]
        for index, members in enumerate(self.buckets(cap_mb)):
            picked = pickers[index](assignment)  # the members' options, then the first's again
            cache = caches[index]
            cached = cache.get(picked)
            if cached is None:
                self._bucket_entries += 1
                if self._bucket_entries > 200_000:  # a memory guard
                    self._bucket_entries = 0
                    for tables in self._bucket_groups.values():
                        for table in tables:
                            table.clear()
                by_option: dict[int, list[int]] = {}
                for position, option in zip(members, picked):
                    if option != UNASSIGNED:
                        by_option.setdefault(option, []).append(position)
                # one option in the bucket: its group is the whole bucket, never scattered;
                # else members (in bucket order) are scattered unless they are a run
                check = gather and len(by_option) > 1 and self.costs.gathers
                place = self._place_in_bucket(cap_mb)
                cached = cache[picked] = [
                    self._sim_group(index, option, tuple(p), check and
                                    place[p[-1]] - place[p[0]] + 1 != len(p))
                    for option, p in by_option.items()]
            out.append(cached)
        return out

    def simulate(self, assignment, cap_mb: float, record: bool = False) -> SimResult:
        self.evaluations += 1
        model = self.iteration_model(cap_mb, self.is_native(assignment, cap_mb))
        if record:
            return simulate(model, self._fast_sim_groups(assignment, cap_mb), record)
        return simulate_single_pass(model, [], self._groups_by_bucket(assignment, cap_mb))

    def evaluate(self, assignment, cap_mb: float) -> float:
        """The objective's value: predicted iteration time, or effective time (infinite
        for a plan below the minimum fidelity, found without simulating it). A plan
        evaluated before is looked up, not simulated again; either way it counts as
        an evaluation, so what a search spends does not depend on the lookups."""
        key = (cap_mb, array("i", assignment).tobytes())
        value = self._values.get(key)
        if value is not None:
            self.evaluations += 1
            return value
        divisor = self._objective_divisor(assignment)
        if divisor is None:
            self.evaluations += 1
            value = math.inf
        else:
            value = self.simulate(assignment, cap_mb).iteration_ms / divisor
        if len(self._values) >= min(MAX_REMEMBERED, REMEMBERED_BYTES // len(key[1] or b"-")):
            self._values.clear()
        self._values[key] = value
        return value

    def objective_of(self, time_ms: float, assignment) -> float:
        """The objective's value for an assignment predicted at ``time_ms``. For a partial
        assignment (UNASSIGNED tensors counted uncompressed) it is a lower bound of
        every completion's, given a lower bound ``time_ms`` of their times."""
        divisor = self._objective_divisor(assignment)
        return math.inf if divisor is None else time_ms / divisor

    def _objective_divisor(self, assignment) -> float | None:
        """What the objective divides the time by: 1, or the plan's fidelity; None for a
        plan below the minimum fidelity (its objective is infinite)."""
        if not self.objective.uses_fidelity:
            return 1.0
        fidelity = self.fidelity(assignment)
        if fidelity is None:
            raise ValueError("the effective-time objective needs the tensors' gains")
        if fidelity < self.objective.min_fidelity - 1e-12 or fidelity <= 0:
            return None
        return fidelity

    # -- fidelity ------------------------------------------------------------------------
    def set_fidelity(self, gain_of: Callable[[Tensor, Option], float], shares: list[float],
                     objective: Objective) -> None:
        """Give every tensor its weight (``shares``, summing to 1) and every (tensor, option)
        its gain, and set the objective."""
        self._gain_of = gain_of
        self._weights = [[share * gain_of(tensor, option) ** 2 for option in self.options]
                         + [share] for tensor, share in zip(self.tensors, shares)]
        self.objective = objective
        self._values = {}

    def fidelity(self, assignment) -> float | None:
        """The plan's fidelity, ``sqrt(sum(weight * gain^2))`` (None: gains unknown)."""
        if self._weights is None:
            return None
        return math.sqrt(sum(map(list.__getitem__, self._weights, assignment)))

    def group_gain(self, members, option: int) -> float:
        """The gain of ``members`` (positions) alone under ``option`` (1 if unknown)."""
        if self._weights is None:
            return 1.0
        share = sum(self._weights[p][-1] for p in members)
        if share <= 0:
            return 1.0
        return math.sqrt(sum(self._weights[p][option] for p in members) / share)

    def add_option(self, option: Option) -> int:
        """Offer one more option (a plan's own, when simulating it); its index."""
        self.options.append(option)
        if option == NO_COMPRESSION and self._native is None:
            self._native = len(self.options) - 1
        self.low_rank.append(_low_rank(option))
        self._labels.append(option.label)
        if self._weights is not None and self._gain_of is not None:
            for tensor, weights in zip(self.tensors, self._weights):
                weights.insert(len(weights) - 1, weights[-1] * self._gain_of(tensor, option) ** 2)
        return len(self.options) - 1

    def restricted(self, count: int) -> Problem:
        """A view offering only the first ``count`` options (so its assignments are valid
        for this problem too); it shares the tensors, models and cost caches."""
        view = copy.copy(self)
        view.options = self.options[:count]
        view.low_rank = self.low_rank[:count]
        view._labels = self._labels[:count]
        view.screens = {}  # screens depend on the options offered
        view._values = {}
        if view._native is not None and view._native >= count:
            view._native = None
        view._hooks = frozenset(hook for hook in self._hooks if max(hook, default=0) < count)
        return view

    # -- helpers -----------------------------------------------------------------------
    def index_of(self, option: Option) -> int:
        """The index of an option the problem offers (``ValueError`` if it does not)."""
        return self.options.index(option)

    def uniform(self, option_index: int) -> list[int]:
        return [option_index] * len(self.tensors)
