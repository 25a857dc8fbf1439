"""Gradient fidelity: how much of each tensor's real gradient a compressor keeps.

The gain of a compressor C on a tensor is measured on the gradient it would
compress in training, ``x`` (the rank's local gradient plus, with error
feedback, the residual carried over from earlier iterations)::

    gain = sqrt(max(0, 1 - ||C(x) - x||^2 / ||x||^2))

1 means nothing is lost. For a sparsifier with error feedback (top-k, DGC,
threshold) C(x) keeps a subset of x, so ``||C(x) - x||^2 = ||x||^2 - ||C(x)||^2``
and the gain is GraVAC's compression gain ``||C(x)|| / ||x||``. Unlike GraVAC's
ratio it also stays meaningful for compressors that do not keep a subset:
an unbiased but noisy one (random-k rescaled, QSGD, TernGrad) can send a
larger vector than x, and it is the error, not the size, that costs
convergence; a quantizer with a tiny error (fp16) has a gain close to 1.

A tensor's *norm share* is its part of the squared norm of the whole local
gradient. Gains compose over tensors: the whole gradient's gain is
``sqrt(sum(share * gain^2))`` (uncompressed tensors have gain 1), because the
squared errors of disjoint tensors add up.
"""

from __future__ import annotations

import statistics
import zlib
from typing import Any

import torch
import torch.distributed as dist

from bytecomp.compress import ErrorFeedback, from_spec
from bytecomp.compress.local import gain, roundtrip

COLUMNS = ["tensor", "spec", "gain", "gain_p10", "gain_p90", "norm_share"]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class FidelityMeter:
    """Feeds each iteration's gradients through every compressor, with each compressor's
    state (residuals, factors, step counters) carried from iteration to iteration as
    the executor carries it, and collects gains and norm shares."""

    def __init__(self, specs: list[str], shapes: dict[str, tuple]) -> None:
        self.compressors = {spec: from_spec(spec) for spec in specs}
        self.shapes = shapes
        self.states: dict[tuple[str, str], dict[str, Any]] = {
            (spec, name): {"salt": zlib.crc32(name.encode()), "shapes": [shape]}
            for spec in specs for name, shape in shapes.items()}
        self.gains: dict[tuple[str, str], list[float]] = {key: [] for key in self.states}
        self.shares: dict[str, list[float]] = {name: [] for name in shapes}

    def observe(self, gradients: dict[str, torch.Tensor]) -> None:
        """One iteration's local gradients, by tensor name."""
        norms = {name: float(g.double().pow(2).sum()) for name, g in gradients.items()}
        total = sum(norms.values())
        for name in self.shapes:
            self.shares[name].append(norms[name] / total if total > 0 else 0.0)
        for spec, compressor in self.compressors.items():
            for name in self.shapes:
                flat = gradients[name].reshape(-1)
                state = self.states[(spec, name)]
                x = flat
                residual = state.get("residual")
                if isinstance(compressor, ErrorFeedback) and residual is not None \
                        and residual.shape == flat.shape:
                    x = flat + residual
                approx, _ = roundtrip(compressor, flat, state)
                self.gains[(spec, name)].append(gain(x, approx))

    def rows(self) -> list[dict]:
        """One row per (tensor, spec): median gain, its 10th and 90th percentiles over
        iterations, and the tensor's median norm share."""
        out = []
        for (spec, name), gains in self.gains.items():
            if not gains:
                continue
            out.append({"tensor": name, "spec": spec, "gain": round(statistics.median(gains), 6),
                        "gain_p10": round(_quantile(gains, 0.1), 6),
                        "gain_p90": round(_quantile(gains, 0.9), 6),
                        "norm_share": round(statistics.median(self.shares[name]), 8)})
        return out


def capture_local_gradients(ddp, names: dict[int, str], captured: dict[str, torch.Tensor]):
    """Register a comm hook on ``ddp`` that copies every local gradient (before
    averaging) into ``captured`` by name, then averages the bucket as DDP would."""
    world = dist.get_world_size()

    def hook(_state, bucket):
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            captured[names[id(param)]] = grad.detach().clone().float()
        future = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
        return future.then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, hook)


def measure_fidelity(workload, device: torch.device, batch_size: int, bucket_cap_mb: float,
                     specs: list[str], warmup: int, iterations: int,
                     progress=None) -> list[dict]:
    """Train ``warmup + iterations`` DDP steps (the recipe's optimizer) on fresh batches, with
    a seed per rank as data-parallel ranks see different data; from each step after
    the warm-up, this rank's share of ``specs`` (every ``world``-th) is measured on
    its local gradients. Returns every rank's rows (on every rank)."""
    from bytecomp.profiler.iteration_times import wrap
    from bytecomp.training.workloads import to_device

    model = workload.model.to(device)
    ddp = wrap(model, device, bucket_cap_mb)
    optimizer = workload.make_optimizer(model.parameters())
    names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    rank, world = dist.get_rank(), dist.get_world_size()
    meter = FidelityMeter(specs[rank::world], shapes)
    captured: dict[str, torch.Tensor] = {}
    capture_local_gradients(ddp, names, captured)
    torch.manual_seed(7919 + rank)
    for step in range(warmup + iterations):
        inputs, target = to_device(workload.make_batch(batch_size), device)
        captured.clear()
        workload.loss(ddp(*inputs), target).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= warmup:
            meter.observe(dict(captured))
        if progress:
            progress()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, meter.rows())
    return [row for rows in gathered for row in rows]
