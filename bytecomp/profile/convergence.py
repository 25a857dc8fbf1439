"""Time to accuracy: what a user buys is a trained model sooner, not faster iterations.

Every strategy (fp32 DDP, the fp16 and PowerSGD hooks, each compressor on every
tensor, the plan) trains from the same initial weights on the same batches (the
batch of step s on rank r is drawn after seeding with (seed, r, s), whatever the
strategy), strategies interleaved step by step, each step timed (after a
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

from bytecomp.profile.training import to_device

DIVERGED = float("inf")


@dataclass
class ConvergenceConfig:
    train_steps: int
    eval_every: int
    to_loss: float | None = None
    lr: float | None = None  # Adam at this rate; None: the workload's recipe
    seed: int = 0
    target_fraction: float = 0.6
    validation_batches: int = 8
    shuffle: bool = True  # each step in its own order (step_order); False: as given


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
    module = ddp.module
    was_training = module.training
    module.eval()
    total = sum(float(workload.loss(module(*inputs), target)) for inputs, target in batches)
    module.train(was_training)
    return total / len(batches)


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


def train_curves(strategies, workload, batch_size: int, device, config: ConvergenceConfig,
                 validation, progress=None) -> Training:
    """Each strategy's (step, validation loss) at step 0 and every ``eval_every`` steps,
    its step times and its levels; a strategy whose loss stops being finite is stopped
    and its curve ends in ``inf``."""
    batches = [to_device(b, device) for b in validation]
    curves = [[(0, validation_loss(s.ddp, workload, batches))] for s in strategies]
    times = torch.full((len(strategies), config.train_steps), math.nan, dtype=torch.float64)
    levels: dict[str, list[tuple[int, int, float]]] = {
        s.name: [] for s in strategies if s.executor is not None and s.executor.controller}
    gains: dict[str, list[tuple[int, float]]] = {
        s.name: [] for s in strategies if s.executor is not None and
        s.executor.measures_gain and not s.executor.controller}
    alive = [True] * len(strategies)
    for step in range(1, config.train_steps + 1):
        inputs, target = _batch(workload, batch_size, device, config.seed, step)
        finite = torch.ones(len(strategies))
        order = step_order(len(strategies), config.seed, step) if config.shuffle \
            else range(len(strategies))
        for index in order:
            strategy = strategies[index]
            if not alive[index]:
                continue
            dist.barrier()
            started = _clock(device)
            loss = workload.loss(strategy.ddp(*inputs), target)
            loss.backward()
            strategy.optimizer.step()
            strategy.optimizer.zero_grad()
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
        # every rank must agree on stopping (the executors' collectives must pair up): one
        # small allreduce per step for all strategies
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        for index in range(len(strategies)):
            if alive[index] and finite[index] < 1:
                alive[index] = False
                curves[index].append((step, DIVERGED))
        if step % config.eval_every == 0 or step == config.train_steps:
            for index, strategy in enumerate(strategies):
                if alive[index]:
                    value = validation_loss(strategy.ddp, workload, batches)
                    if not math.isfinite(value):
                        alive[index], value = False, DIVERGED
                    curves[index].append((step, value))
        if progress:
            progress()
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # NaN where stopped, on every rank alike
    return Training({s.name: curve for s, curve in zip(strategies, curves)},
                    {s.name: row for s, row in zip(strategies, times.tolist())}, levels, gains)


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
