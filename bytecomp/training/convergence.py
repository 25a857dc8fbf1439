"""Time to accuracy: what a user buys is a trained model sooner, not faster iterations.

Every strategy (fp32 DDP, the fp16 and PowerSGD hooks, each compressor on every
tensor, the plan) trains from the same initial weights on the same batches (the
batch of step s on rank r is drawn after seeding with (seed, r, s), whatever the
strategy; with ``reference_seed``, fp32 DDP also trains on a second data order, as a
strategy of its own), strategies interleaved step by step, each step timed (after a
barrier; the slowest rank's time). Each step takes the strategies in an order
of its own (:func:`step_order`, the same on every rank), so that no strategy
always follows the same one: a step's time can depend on the step before it,
and a fixed order turns that into a bias for whichever strategy follows a
similar one, an adaptive plan's ladder levels most (measured under a 100 Mbit/s
link, ``benchmarks/interleaving_order.py``: in a fixed order, copies of
PyTorch's PowerSGD hook that followed another ran 2.3% faster than those after
the fp16 hook, and identical copies spread 2.8%; shuffled, 1.6%). Every
``eval_every`` steps the validation loss on fixed held-out batches is recorded
(not timed). The target is ``to_loss``, or else fp32 DDP's validation loss at
``target_fraction`` of its steps. Steps to target come from the loss curve;
time to target is the sum of the strategy's step times up to there, each step
taken as the median of the strategy's steps at the same level (a static
strategy's median step x steps): wall-clock time on the links the job runs on
(under ``bytecomp emulate``, the shaped ones), at whatever level an adaptive
plan was, without the machine's stalls (the raw sum is reported beside it).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bytecomp.training.workloads import to_device

DIVERGED = float("inf")


@dataclass(frozen=True)
class Budget:
    """Wall-clock time a training run may take, on every rank alike.

    ``started`` is when the budget began (``time.time()`` of the process that set it: the
    parent that spawned the ranks, so their start-up counts too), ``seconds`` how long it
    lasts. The run times its first :data:`TIMED_STEPS` steps and its first evaluation,
    then fixes its length (:func:`budgeted_length`): the steps and evaluations that fit
    in what is left, at most ``most`` steps and ``evaluations`` evaluations. It also
    stops at the first step after which an evaluation would end past the budget (a
    machine that got busier), and evaluates there. Every rank decides from the slowest
    rank's times and stops with the others, so all train the same steps.
    """

    seconds: float
    started: float
    most: int
    least: int = 10  # the fewest steps it plans (the clock may still stop it sooner)
    evaluations: int = 10

    def left(self) -> float:
        return self.seconds - (time.time() - self.started)


TIMED_STEPS = 2  # steps a budgeted run times before it fixes its length


@dataclass
class ConvergenceConfig:
    train_steps: int  # with a budget: the most it may run (the budget fixes the count)
    eval_every: int
    to_loss: float | None = None
    lr: float | None = None  # Adam at this rate; None: the workload's recipe
    seed: int = 0
    target_fraction: float = 0.6
    validation_batches: int = 8
    shuffle: bool = True  # each step in its own order (step_order); False: as given
    budget: Budget | None = None  # train for a time, not a count
    # stop at the first evaluation, from step ``flat_least`` on, where the first
    # strategy's (fp32 DDP's) loss has flattened (:func:`flat`): it fell by more than
    # this in all and by at most this over the last quarter of the steps so far
    flat_fall: float | None = None
    flat_least: int = 0
    # also train fp32 DDP on a second data order, its batches drawn under this seed
    # instead of ``seed`` (:func:`reference_name`): how far apart two equally good runs
    # end, the loss's noise floor
    reference_seed: int | None = None


def reference_name(seed: int) -> str:
    """The strategy name of fp32 DDP trained on the batches of data seed ``seed``."""
    return f"fp32 DDP, data seed {seed}"


def improvement(curve: list[tuple[int, float]]) -> float:
    """How much a curve's loss fell, as a fraction of its first: ``(first - best) /
    first`` over its finite points (0 for a curve that never fell)."""
    first = curve[0][1]
    best = min((loss for _, loss in curve if math.isfinite(loss)), default=first)
    return max(0.0, (first - best) / abs(first)) if first and math.isfinite(first) else 0.0


def last_quarter(curve: list[tuple[int, float]], steps: float) -> float:
    """How much ``curve``'s loss fell over the last quarter of ``steps``
    (:func:`improvement` of its points from 0.75 x ``steps`` on; 0 with fewer than two)."""
    points = [(s, loss) for s, loss in curve if s >= 0.75 * steps]
    return improvement(points) if len(points) > 1 else 0.0


def flat(curve: list[tuple[int, float]], steps: float, fall: float) -> bool:
    """Whether ``curve`` (fp32 DDP's) has flattened by ``steps``: its loss fell by more
    than ``fall`` in all (one that has not started to fall is early, not flat) and by at
    most ``fall`` over the last quarter, measured on at least two evaluations there."""
    points = [s for s, _ in curve if s >= 0.75 * steps]
    return len(points) > 1 and improvement(curve) > fall and \
        last_quarter(curve, steps) <= fall


def step_order(count: int, seed: int, step: int) -> list[int]:
    """The order in which step ``step`` takes ``count`` strategies: a permutation drawn
    from (``seed``, ``step``) alone, so the same on every rank (their collectives pair
    up) and on every run."""
    order = list(range(count))
    random.Random(seed * 1_000_003 + step).shuffle(order)
    return order


def training_optimizer(lr: float):
    """Adam, the optimizer the convergence runs train with."""
    def make(parameters) -> torch.optim.Optimizer:
        return torch.optim.Adam(parameters, lr=lr)
    return make


def _batch(workload, batch_size: int, device, seed: int, step: int):
    """Step ``step``'s batch on this rank: the same for every strategy."""
    state = torch.get_rng_state()
    torch.manual_seed(seed * 1_000_003 + dist.get_rank() * 7_919 + step)
    try:
        return to_device(workload.make_batch(batch_size), device)
    finally:
        torch.set_rng_state(state)


@torch.no_grad()
def validation_loss(ddp, workload, batches) -> float:
    """The mean loss over ``batches``, each rank computing its share of them (rank r the
    batches r, r + world, ...) and the sums added up: the same number on every rank, in
    a world-th of the time (every rank must call it)."""
    module = ddp.module
    was_training = module.training
    module.eval()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [float(workload.loss(module(*inputs), target))
            for inputs, target in batches[rank::world]]
    module.train(was_training)
    sums = torch.zeros(world, dtype=torch.float64)
    sums[rank] = math.fsum(mine)  # each rank's own slot: the total adds them in rank order
    dist.all_reduce(sums)
    return math.fsum(sums.tolist()) / len(batches)


def _affordable_batches(strategies, workload, batches, budget: Budget) -> list:
    """The first of ``batches`` a budgeted run evaluates on: as many as keep one
    evaluation of every strategy within :data:`EVALUATION_SHARE` of the budget's tenth,
    at least :data:`MIN_VALIDATION_BATCHES` (timed on one batch, the slowest rank's)."""
    if len(batches) <= MIN_VALIDATION_BATCHES:
        return batches
    module = strategies[0].ddp.module
    was_training = module.training
    module.eval()
    started = time.perf_counter()
    inputs, target = batches[0]
    with torch.no_grad():
        float(workload.loss(module(*inputs), target))
    module.train(was_training)
    (one,) = _agreed_max([time.perf_counter() - started])
    per_batch = one * len(strategies) / dist.get_world_size()
    affordable = int(EVALUATION_SHARE * budget.seconds / budget.evaluations / max(per_batch, 1e-6))
    return batches[:max(MIN_VALIDATION_BATCHES, min(len(batches), affordable))]


MIN_VALIDATION_BATCHES = 2
EVALUATION_SHARE = 0.25  # of a budgeted run's time, at most, in its evaluations (if it can)


@dataclass
class Training:
    """What training gave, by strategy: the validation curve, every step's time (ms, the
    slowest rank's; NaN once stopped) and, for an adaptive plan, its level and smoothed
    gain after every step."""

    curves: dict[str, list[tuple[int, float]]]
    step_ms: dict[str, list[float]]
    levels: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    # a static plan applied with measure_gain: this rank's gain after every step
    gains: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    steps: int = 0  # steps trained
    planned: int = 0  # steps it set out to train (a budgeted run: what the budget afforded)
    stopped_by_budget: bool = False  # a budgeted run that ended early, at its budget
    stopped_flat: bool = False  # ended early: the first strategy's loss had flattened
    seconds: float = 0.0  # wall-clock time of the run on this rank

    def typical_ms(self, name: str) -> list[float]:
        """Each step's time taken as the median of the strategy's steps at the same
        level (a static strategy: its median step): the machine's stalls (a 3 ms step
        that took 30 once) are not the strategy's. NaN once stopped."""
        times = self.step_ms[name]
        levels = [level for _, level, _ in self.levels.get(name, [])] or [0]
        levels += [levels[-1]] * (len(times) - len(levels))
        by_level: dict[int, list[float]] = {}
        for ms, level in zip(times, levels):
            if ms == ms:
                by_level.setdefault(level, []).append(ms)
        medians = {level: statistics.median(values) for level, values in by_level.items()}
        return [medians[level] if ms == ms else math.nan for ms, level in zip(times, levels)]


def _clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _agreed_max(values: list[float]) -> list[float]:
    """``values`` as the slowest rank has them (every rank gets the same)."""
    table = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return table.tolist()


def budgeted_length(budget: Budget, done: int, step_s: float, eval_s: float) -> tuple[int, int]:
    """The steps a budgeted run trains in all and how many evaluations it makes, ``done``
    steps trained at ``step_s`` seconds a step (every strategy's), an evaluation taking
    ``eval_s`` seconds, in the time ``budget`` has left. Evaluations take at most a third
    of that time, from :data:`MIN_EVALUATIONS` to ``budget.evaluations`` of them; the
    steps take the rest, from ``budget.least`` to ``budget.most``."""
    left = max(0.0, budget.left())
    evaluations = int(min(budget.evaluations, max(MIN_EVALUATIONS,
                                                  left / 3 / max(eval_s, 1e-6))))
    affordable = (left - evaluations * eval_s) / max(step_s, 1e-6)
    steps = int(max(budget.least, min(budget.most, done + max(0.0, affordable))))
    return steps, evaluations


MIN_EVALUATIONS = 4  # fewer points cannot place a loss between two of them


def train_curves(strategies, workload, batch_size: int, device, config: ConvergenceConfig,
                 validation, progress=None) -> Training:
    """Each strategy's (step, validation loss) at step 0 and every ``eval_every`` steps,
    its step times and its levels; a strategy whose loss stops being finite is stopped
    and its curve ends in ``inf``. With ``config.budget``, the run's length comes from
    the clock (:class:`Budget`): ``progress`` is then also told the new total
    (``progress(0, total=n)``) once the length is fixed."""
    began = time.time()
    budget = config.budget
    batches = [to_device(b, device) for b in validation]
    if budget is not None:
        batches = _affordable_batches(strategies, workload, batches, budget)
    evaluated = time.time()
    curves = [[(0, validation_loss(s.ddp, workload, batches))] for s in strategies]
    eval_s = time.time() - evaluated
    planned, eval_every = config.train_steps, config.eval_every
    if budget is not None:  # until timed: a count for the timed steps, no evaluation
        planned, eval_every = min(config.train_steps, TIMED_STEPS), config.train_steps + 1
    steps_began, stopped_by_budget, stopped_flat = time.time(), False, False
    times = torch.full((len(strategies), config.train_steps), math.nan, dtype=torch.float64)
    levels: dict[str, list[tuple[int, int, float]]] = {
        s.name: [] for s in strategies if s.executor is not None and s.executor.controller}
    gains: dict[str, list[tuple[int, float]]] = {
        s.name: [] for s in strategies if s.executor is not None and
        s.executor.measures_gain and not s.executor.controller}
    alive = [True] * len(strategies)
    # each strategy's data seed: the run's, or its own (the reference run's second order)
    seeds = [config.seed if getattr(s, "data_seed", None) is None else s.data_seed
             for s in strategies]
    step = 0
    while step < planned:
        step += 1
        drawn = {seed: _batch(workload, batch_size, device, seed, step) for seed in set(seeds)}
        # one per strategy (its loss is finite), and last: this rank is within the budget
        finite = torch.ones(len(strategies) + 1)
        order = step_order(len(strategies), config.seed, step) if config.shuffle \
            else range(len(strategies))
        for index in order:
            strategy = strategies[index]
            if not alive[index]:
                continue
            inputs, target = drawn[seeds[index]]
            dist.barrier()
            started = _clock(device)
            loss = workload.loss(strategy.ddp(*inputs), target)
            loss.backward()
            strategy.optimizer.step()
            strategy.optimizer.zero_grad()
            if getattr(strategy, "scheduler", None) is not None:  # the recipe's schedule
                strategy.scheduler.step()
            times[index, step - 1] = 1000 * (_clock(device) - started)
            if strategy.executor is not None and strategy.executor.controller:
                # the time between this executor's steps holds every other strategy's step
                strategy.executor.report_step_ms(float(times[index, step - 1]))
            finite[index] = float(math.isfinite(loss.item()))
            if strategy.name in gains:
                gains[strategy.name].append((step, strategy.executor.last_gain()))
            if strategy.name in levels:
                control = strategy.executor.controller
                gain = control.gain[control.level]
                levels[strategy.name].append((step, control.level,
                                              math.nan if gain is None else gain))
        if budget is not None and step > TIMED_STEPS and budget.left() < eval_s:
            finite[-1] = 0.0  # the next evaluation would end past the budget: stop here
        # every rank must agree on stopping (the executors' collectives must pair up): one
        # small allreduce per step for all strategies and the budget
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        for index in range(len(strategies)):
            if alive[index] and finite[index] < 1:
                alive[index] = False
                curves[index].append((step, DIVERGED))
        if budget is not None and step == TIMED_STEPS:
            step_s, eval_s = _agreed_max([(time.time() - steps_began) / step, eval_s])
            planned, evaluations = budgeted_length(budget, step, step_s, eval_s)
            planned = min(max(planned, step), config.train_steps)
            eval_every = max(1, planned // evaluations)
            if progress:
                progress(0, total=planned)
        elif budget is not None and finite[-1] < 1 and step < planned:
            stopped_by_budget = True
        if step % eval_every == 0 or step == planned or stopped_by_budget:
            for index, strategy in enumerate(strategies):
                if alive[index]:
                    value = validation_loss(strategy.ddp, workload, batches)
                    if not math.isfinite(value):
                        alive[index], value = False, DIVERGED
                    curves[index].append((step, value))
            # the losses are the same on every rank (validation_loss sums them), so every
            # rank stops here alike
            stopped_flat = config.flat_fall is not None and step >= config.flat_least and \
                step < planned and not stopped_by_budget and \
                flat(curves[0], step, config.flat_fall)
        if progress:
            progress()
        if stopped_by_budget or stopped_flat:
            break
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # NaN where stopped, on every rank alike
    times = times[:, :step]
    return Training({s.name: curve for s, curve in zip(strategies, curves)},
                    {s.name: row for s, row in zip(strategies, times.tolist())}, levels, gains,
                    steps=step, planned=planned, stopped_by_budget=stopped_by_budget,
                    stopped_flat=stopped_flat, seconds=time.time() - began)


def time_at(step_ms: list[float], steps: float) -> float:
    """Seconds to run ``steps`` steps (fractional: that part of the next step)."""
    whole = int(steps)
    seconds = sum(step_ms[:whole]) / 1000.0
    if steps > whole and whole < len(step_ms):
        seconds += (steps - whole) * step_ms[whole] / 1000.0
    return seconds


def loss_at(curve: list[tuple[int, float]], step: float) -> float:
    """The validation loss at ``step``, linear between evaluations."""
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if s0 <= step <= s1:
            return l0 if s1 == s0 else l0 + (l1 - l0) * (step - s0) / (s1 - s0)
    return curve[-1][1]


def steps_to(curve: list[tuple[int, float]], target: float) -> float | None:
    """The first step at which the loss reaches ``target`` (linear between evaluations),
    or None if it never does."""
    if curve[0][1] <= target:
        return 0.0
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if l1 <= target and math.isfinite(l1):
            return s1 if l0 == l1 or not math.isfinite(l0) else s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
    return None


def target_loss(curves: list[list[tuple[int, float]]], config: ConvergenceConfig) -> float:
    """``to_loss``, or else the first curve's (fp32 DDP's) loss at ``target_fraction`` of
    the steps."""
    if config.to_loss is not None:
        return config.to_loss
    return loss_at(curves[0], config.target_fraction * config.train_steps)
