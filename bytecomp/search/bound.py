"""A lower bound on the predicted iteration time of every plan, from a relaxation.

Whatever the plan, the iteration is at least forward + optimizer plus the
largest of:

* the compute stream's work: the backward pass and every device encode and decode;
* for each tensor (in ready order), its ready time plus the channel work of that
  tensor and of every later one (their buckets launch after it is ready, and the
  channel takes one group at a time);
* the host workers' work shared by the workers, and the copies one after another
  (from the first ready time).

Each (tensor, option) is priced by the least share of a group's cost that the
tensor can carry: the option's cost curves per element, at their cheapest over every
size a group holding the tensor could have, from the tensor's own up to the largest
bucket of any candidate cap (merging amortizes latencies; superlinear compression
costs more in a larger group). The curves are read on a grid of sizes and each
cell's per-element cost taken at its low end's cost over its high end's size, so
monotone costs keep it a lower bound. A low-rank compressor exchanged whole (its
factors' sizes depend on the members' shapes, and two unequal collectives can cost
less than a square matrix's two equal ones) has the channel time of one-element
factors at every size: a floor, not an estimate. The executor's fixed costs,
interference and the last decode are left out.

Any weights on those constraints (summing to 1) give a bound (weak duality): the
weighted sum of their right-hand sides, with each tensor taking its cheapest option
under the weighted costs. :func:`relaxed_bound` takes the best over a grid of
weights and every tensor as the chain's start.
"""

from __future__ import annotations

import math

import numpy as np

from bytecomp.comm.schemes import SCHEMES
from bytecomp.compress import from_spec
from bytecomp.search.problem import Problem

GRID_STEP = 1.5  # consecutive grid sizes differ by at most this factor
COARSE_EVERY = 3  # the coarse grid keeps every third geometric size (steps of 3.4x)
WEIGHTS = np.linspace(0.0, 1.0, 21)  # on the compute stream; the rest on the channel
HOST_WEIGHTS = (0.0, 0.05, 0.15, 0.3)  # on the host workers and on the copies, each


def _grid(sizes: np.ndarray, largest: float, every: int = 1) -> np.ndarray:
    """Geometric steps from the smallest tensor size to ``largest`` and, on the fine grid
    (``every`` 1), every tensor size; the coarse grid keeps every ``every``-th step
    alone (its sizes are also the fine grid's)."""
    points = set(int(s) for s in sizes) if every == 1 else set()
    value = max(1.0, float(sizes.min()))
    step = 0
    while value < largest:
        if step % every == 0:
            points.add(int(value))
        value *= GRID_STEP
        step += 1
    points.add(int(largest))
    return np.array(sorted(p for p in points if p >= 1), dtype=float)


def _curves(problem: Problem, grid: np.ndarray) -> np.ndarray:
    """(option, quantity, size): channel, device work, host work, copies at each size
    (a low-rank option exchanged whole: the channel's floor, see the module docstring)."""
    out = np.zeros((len(problem.options), 4, len(grid)))
    for index, option in enumerate(problem.options):
        scheme = SCHEMES[option.scheme]
        by_shape = problem.low_rank[index] and scheme.whole  # its matrices as they are
        floor = problem.costs.exchange_ms(option.spec, 1, "world",
                                          scheme.flat_rounds(from_spec(option.spec))) \
            if by_shape else 0.0
        for column, numel in enumerate(grid):
            cost = problem.costs.cost(option, int(numel))
            work = cost.encode_ms + cost.decode_ms
            out[index, :, column] = (floor if by_shape else cost.channel_ms,
                                     0.0 if cost.host else work, work if cost.host else 0.0,
                                     cost.copy_in_ms + cost.copy_out_ms)
    return out


def grid_curves(problem: Problem, caps: list[float],
                coarse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The size grid (every tensor's size, and geometric steps up to the largest bucket
    of any of ``caps``; ``coarse``: every third step alone) and :func:`_curves` on it;
    cached on the problem for its options and caps."""
    key = (len(problem.options), tuple(caps), coarse)
    cache = problem.__dict__.setdefault("_grid_curves", {})
    if key not in cache:
        sizes = np.array([t.numel for t in problem.tensors], dtype=float)
        largest = max(1, max(sum(problem.tensors[p].numel for p in bucket)
                             for cap in caps for bucket in problem.buckets(cap)))
        grid = _grid(sizes, float(largest), COARSE_EVERY if coarse else 1)
        cache[key] = grid, _curves(problem, grid)
    return cache[key]


def coarse_curves_computed(problem: Problem) -> tuple[np.ndarray, np.ndarray] | None:
    """The coarse grid and its curves (:func:`grid_curves`) if a bound computed them for
    this problem's options, else None (nothing is computed)."""
    cache = problem.__dict__.get("_grid_curves", {})
    return next((value for (options, _, coarse), value in cache.items()
                 if coarse and options == len(problem.options)), None)


def channel_floors(problem: Problem, caps: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, option x grid): each option's channel time at each size of the coarse
    grid. Channel time does not fall as a group grows, so a group of ``n`` elements
    costs at least its option's value at the largest grid size not above ``n``."""
    grid, curves = grid_curves(problem, caps, coarse=True)
    return grid, curves[:, 0, :]


def tensor_costs(problem: Problem, caps: list[float], upper: bool = False) -> np.ndarray:
    """(tensor, option, quantity): the least cost each tensor carries under each option
    (channel, device work, host work, copies), read from the fine grid's curves.

    ``upper``: not a lower bound but an upper one, from the coarse grid: the least
    per-element cost over the grid sizes from the tensor's own up (a tensor's size
    that is not on it: from the next size up), where the least over every size is
    what the relaxation asks (so the relaxed bound computed from these is no less
    than the one from the exact least costs, itself no less than the one from the
    fine grid)."""
    sizes = np.array([t.numel for t in problem.tensors], dtype=float)
    grid, curves = grid_curves(problem, caps, coarse=upper)
    if upper:  # per element at each grid size, then the cheapest from each size on
        per_element = curves / grid
    else:  # within each cell [grid[i], grid[i+1]]: cost(grid[i]) / grid[i+1]; the last exactly
        per_element = np.concatenate([curves[:, :, :-1] / grid[1:],
                                      curves[:, :, -1:] / grid[-1]], axis=2)
    cheapest_from = np.minimum.accumulate(per_element[:, :, ::-1], axis=2)[:, :, ::-1]
    at = np.searchsorted(grid, sizes)  # the size, or (coarse grid) the next one up
    rates = cheapest_from[:, :, at]  # (option, quantity, tensor)
    return np.transpose(rates, (2, 0, 1)) * sizes[:, None, None]


def relaxed_bound(problem: Problem, caps: list[float]) -> float:
    """A lower bound on the iteration time of any assignment at any of ``caps`` (see the
    module docstring); cached on the problem for its options and caps."""
    return _cached_relaxation(problem, caps, upper=False)


def relaxed_bound_ceiling(problem: Problem, caps: list[float]) -> float:
    """No less than :func:`relaxed_bound`, from a third of its cost model calls: where
    another bound is at least this, the relaxed bound cannot improve on it."""
    return _cached_relaxation(problem, caps, upper=True)


def _cached_relaxation(problem: Problem, caps: list[float], upper: bool) -> float:
    if not problem.tensors:
        return problem.forward_ms + problem.backward_ms + problem.optimizer_ms
    key = (len(problem.options), tuple(caps), upper)
    cache = problem.__dict__.setdefault("_relaxed_bounds", {})
    if key not in cache:
        cache[key] = _relaxed_bound(problem, tensor_costs(problem, caps, upper))
    return cache[key]


def _undominated(costs: np.ndarray) -> np.ndarray:
    """The options (a mask) that some tensor may take at the cheapest under some weights.

    Every weighted sum is non-negative in each quantity, so an option that costs a
    tensor at least as much as another in every quantity never needs to be looked at
    for it. Options that work on the device (no host work, no copies) compete in
    (channel, device work); options on the host (no device work, the same copies for
    every such option of a tensor) in (channel, host work); per tensor, each kind's
    Pareto frontier is kept, and every option not of either kind."""
    tensors, options, _ = costs.shape
    keep = np.zeros(options, dtype=bool)
    channel, device, host, copies = (costs[:, :, q] for q in range(4))
    on_device = np.asarray(~((host > 0) | (copies > 0)).any(axis=0))
    on_host = np.asarray(~(device > 0).any(axis=0) & ~on_device)
    if on_host.any() and np.ptp(copies[:, on_host], axis=1).max() > 1e-12:
        on_host = np.zeros_like(on_host)  # copies that differ: a third quantity, unfiltered
    keep |= ~(on_device | on_host)
    for kind, work in ((on_device, device), (on_host, host)):
        columns = np.flatnonzero(kind)
        if columns.size == 0:
            continue
        x, y = channel[:, columns], work[:, columns]
        order = np.lexsort((y, x), axis=-1)  # by channel, then by work
        ys = np.take_along_axis(y, order, axis=1)
        frontier = np.ones_like(ys, dtype=bool)
        frontier[:, 1:] = ys[:, 1:] < np.minimum.accumulate(ys, axis=1)[:, :-1]
        keep[columns[np.unique(order[frontier])]] = True
    return keep


def _relaxed_bound(problem: Problem, costs: np.ndarray) -> float:
    costs = costs[:, _undominated(costs), :]
    channel, device, host, copies = (costs[:, :, q] for q in range(4))
    host = host / max(1, problem.host_workers)
    fixed = problem.forward_ms + problem.optimizer_ms
    ready = np.array([t.ready_ms for t in problem.tensors])
    first_ready = float(ready.min())
    best = fixed + problem.backward_ms
    shares = WEIGHTS[:, None, None]  # every share at once: (share, tensor, option)
    for host_weight in HOST_WEIGHTS:
        for copy_weight in HOST_WEIGHTS:
            rest = 1.0 - host_weight - copy_weight
            side = host_weight * host + copy_weight * copies
            side_rhs = (host_weight + copy_weight) * first_ready
            compute, chain = rest * shares, rest * (1.0 - shares)
            before = (compute * device + side).min(axis=2)  # not in the chain
            within = (compute * device + chain * channel + side).min(axis=2)
            # chain from tensor t: ready[t] + the channel work of t and every later one
            prefix = np.concatenate([np.zeros((len(WEIGHTS), 1)),
                                     np.cumsum(before, axis=1)[:, :-1]], axis=1)
            suffix = np.cumsum(within[:, ::-1], axis=1)[:, ::-1]
            values = (compute[:, :, 0] * problem.backward_ms + chain[:, :, 0] * ready
                      + side_rhs + prefix + suffix)
            best = max(best, fixed + float(values.max()))
    return best if math.isfinite(best) else fixed + problem.backward_ms
