"""The channel bound: no plan at a bucket cap is faster than :func:`lower_bound`. The
channel can do no better than the cheapest option for each whole bucket (fitted costs
are concave in size, so mixing options inside a bucket cannot beat it), and the
iteration no better than compute.
"""

from __future__ import annotations

import math

import numpy as np

from bytecomp.search.problem import Problem


def asymptotic_slopes(problem: Problem) -> list[float]:
    """Per option, the channel ms per element for very large groups: a lower bound on
    the marginal channel cost of any element (costs are concave in size)."""
    big = float(1 << 30)
    slopes = []
    for option, low_rank in zip(problem.options, problem.low_rank):
        if low_rank:  # factors grow like sqrt(numel): no useful linear bound
            slopes.append(0.0)
            continue
        first = problem.costs.cost(option, int(big)).channel_ms
        second = problem.costs.cost(option, int(2 * big)).channel_ms
        slopes.append(max(0.0, (second - first) / big))
    return slopes


# Beyond this many buckets the channel bound prices each bucket by its grid floor alone
# (a weaker bound, with no cost model call): pricing each was most of the set-up's time
# on 20,000 tensors of distinct sizes (seconds), and no instance of the benchmark sets
# or golden plans has as many buckets
PRICED_BUCKETS = 5_000


def lower_bound(problem: Problem, cap_mb: float, floors=None) -> float:
    """No plan with this bucket cap can be faster than this (see the module docstring).

    ``floors`` (grid, option x grid; :func:`bytecomp.search.bound.channel_floors`): a
    lower bound of each option's channel time at each grid size. With them, a
    bucket's options are priced cheapest floor first, and no further once the next
    floor is no less than the cheapest price found: the same bound, with a few cost
    model calls per bucket instead of one per option (:func:`_cheapest_above_floors`)."""
    model = problem.iteration_model(cap_mb)
    channel = 0.0
    ready_so_far = 0.0
    distinct = distinct_channels(problem)
    first_element, slope = _mixed_floor(problem, distinct)
    buckets = problem.buckets(cap_mb)
    least = None  # per grid size, the least floor of every option: no pricing at all
    if floors is not None and len(buckets) > PRICED_BUCKETS:
        least = floors[1][distinct].min(axis=0)
    for members, ready in zip(buckets, model.bucket_ready_ms):
        numel = sum(problem.tensors[p].numel for p in members)
        # the largest tensor's group costs at least what it costs alone (costs grow with
        # size): the whole bucket's price where it is one tensor
        largest = max(members, key=lambda p: problem.tensors[p].numel)
        alone = problem.tensors[largest]
        if least is not None:
            column = int(np.searchsorted(floors[0], alone.numel, side="right")) - 1
            cheapest = float(least[column]) if column >= 0 else 0.0
        elif floors is None:
            cheapest = min(channel_ms(problem, index, alone.numel, (alone.shape,))
                           for index in distinct)
        else:
            cheapest = _cheapest_above_floors(problem, distinct, floors, alone.numel,
                                              (alone.shape,))
        if len(members) > 1:
            # its tensors may be split between options: each group costs at least its
            # first element's price plus the cheapest marginal price of the rest (costs
            # are concave in size), so the bucket at least one first element and the
            # cheapest slope for every other element. (The cheapest single group for the
            # whole bucket is no bound: a long search found a mix of fp32, host and device
            # groups 0.9% under it.)
            cheapest = max(cheapest, first_element + slope * (numel - 1))
        ready_so_far = max(ready_so_far, ready)
        channel = max(channel, ready_so_far) + cheapest
    return model.forward_ms + max(model.backward_ms, channel) + model.optimizer_ms


def _mixed_floor(problem: Problem, distinct: list[int]) -> tuple[float, float]:
    """The least channel price of a one-element group over ``distinct`` options, and the
    least asymptotic price per element over every option (0 where a low-rank compressor
    is one: its factors grow like a square root)."""
    first = min(channel_ms(problem, index, 1, ((1, 1),)) for index in distinct)
    return first, min(asymptotic_slopes(problem), default=0.0)


def channel_ms(problem: Problem, index: int, numel: int, shapes: tuple) -> float:
    """The channel's price of option ``index`` for a group of ``numel`` elements (its
    ``shapes`` where the option is low-rank)."""
    option = problem.options[index]
    return problem.costs.cost(option, numel,
                              shapes if problem.low_rank[index] else None).channel_ms


def _cheapest_above_floors(problem: Problem, distinct: list[int], floors, numel: int,
                           shapes: tuple) -> float:
    """The least channel price of ``distinct`` options for a group, pricing them cheapest
    floor first and stopping at the first floor no less than the cheapest price found
    (the rest cannot be cheaper)."""
    grid, table = floors
    column = int(np.searchsorted(grid, numel, side="right")) - 1
    below = table[distinct, column] if column >= 0 else np.zeros(len(distinct))
    cheapest = math.inf
    for rank in np.argsort(below, kind="stable"):
        if below[rank] >= cheapest:
            break
        cheapest = min(cheapest, channel_ms(problem, distinct[rank], numel, shapes))
    return cheapest


def distinct_channels(problem: Problem) -> list[int]:
    """One option index per (compressor, scheme, place): the options whose channel costs
    may differ."""
    distinct: dict[tuple, int] = {}
    for index, option in enumerate(problem.options):
        # by place too, whatever the scheme declares: top-k's hierarchical exchange was
        # priced 4.73 ms on the host and 4.96 ms on the device for one 9M-element tensor,
        # and a bound that saw the device alone was above a plan
        distinct.setdefault((option.spec, option.scheme, option.place), index)
    return list(distinct.values())
