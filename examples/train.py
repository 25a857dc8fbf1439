"""Train a built-in workload under DDP with a bytecomp plan, with checkpoint and resume.

The data needs no download: a fixed random "teacher" network labels Gaussian
inputs, and 10% of the labels are flipped at random, so the task has a real,
learnable signal and a loss floor above zero. Every rank draws its batch of
step ``s`` from a generator seeded by (seed, rank, s), so a resumed run sees
exactly the data the uninterrupted one would have.

    torchrun --nproc_per_node 2 examples/train.py --plan plan.yaml --steps 300 \\
        --checkpoint ckpt.pt --checkpoint-every 100
    torchrun --nproc_per_node 2 examples/train.py --plan plan.yaml --steps 300 \\
        --checkpoint ckpt.pt --resume                 # continues from the checkpoint

Without ``--plan`` it trains with DDP's default fp32 allreduce. The plan must
have been made for the same model: profile it with
``bytecomp profile --model mlp:inputs=64,width=256,depth=3 ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import bytecomp
from bytecomp.errors import BytecompError
from bytecomp.training.data import TeacherTask
from bytecomp.training.workloads import load_workload


@dataclass
class TrainConfig:
    model: str = "mlp:inputs=64,width=256,depth=3"
    plan: str | None = None
    steps: int = 600
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    label_noise: float = 0.1
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    log_every: int = 50
    metrics: str | None = None
    timeout: float = 300.0  # seconds before a collective waiting on a stopped peer fails


def teacher_batch(step: int, rank: int, config: TrainConfig, inputs: int, classes: int):
    """Step ``step``'s batch on ``rank``: labelled by a fixed random teacher, with
    ``label_noise`` flipped labels, drawn from a generator seeded by (seed, rank, step)."""
    draw = torch.Generator().manual_seed(config.seed * 1_000_003 + rank * 10_007 + step)
    return TeacherTask(inputs, classes, config.label_noise).draw(config.batch_size, draw)


def _save_atomic(state: dict, path: str) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    torch.save(state, temporary)
    os.replace(temporary, path)


def load_checkpoint(path: str | None, device: torch.device) -> dict:
    """A checkpoint of :func:`train`, read with ``weights_only=True``: tensors, numbers,
    strings, lists and dicts only, so a crafted file cannot run code on ``--resume``."""
    if not path:
        raise BytecompError("--resume needs --checkpoint PATH")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise BytecompError(f"checkpoint {path} does not exist") from None
    except Exception as error:  # an unpickling error names what the file tried to load
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise BytecompError(f"cannot load checkpoint {path} (weights only): "
                            f"{type(error).__name__}: {reason}") from None
    if not isinstance(checkpoint, dict) or \
            not {"step", "model", "optimizer", "bytecomp"} <= set(checkpoint):
        raise BytecompError(f"{path} is not a checkpoint of examples/train.py (it needs step, "
                            f"model, optimizer and bytecomp)")
    return checkpoint


def resume(checkpoint: dict, path: str, model: torch.nn.Module,
           optimizer: torch.optim.Optimizer, config: TrainConfig, planned: bool) -> int:
    """Load a checkpoint's model and optimizer after checking what it holds (a step
    before ``config.steps``, finite weights of this model's shapes, an optimizer state
    of this optimizer); the step to go on from. Each problem is one line."""
    step = checkpoint["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < config.steps:
        raise BytecompError(f"{path}: step must be an integer from 0 to {config.steps - 1} "
                            f"(--steps {config.steps}), got {step!r}")
    weights = checkpoint["model"]
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor)
                                                for v in weights.values()):
        raise BytecompError(f"{path}: model must map parameter names to tensors")
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise BytecompError(f"{path}: the model's {name} holds NaN or infinite values")
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:  # names the missing, unexpected or misshapen tensors
        raise BytecompError(f"{path}: the model is not --model {config.model}: "
                            f"{' '.join(str(error).split())[:400]}") from None
    state = checkpoint["optimizer"]
    if not isinstance(state, dict) or not state.get("param_groups"):
        raise BytecompError(f"{path}: optimizer must be an optimizer state_dict() with "
                            f"param_groups")
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as error:
        raise BytecompError(f"{path}: the optimizer state does not fit this optimizer: "
                            f"{type(error).__name__}: {error}") from None
    if planned != (checkpoint["bytecomp"] is not None):
        raise BytecompError(f"{path} was saved {'without' if planned else 'with'} a plan; "
                            f"resume it {'without' if planned else 'with'} --plan")
    return step


def check_config(config: TrainConfig) -> None:
    """Every number of the command line in its range, in one line."""
    whole = {"steps": (1, 10 ** 9), "batch_size": (1, 1 << 20), "checkpoint_every": (0, 10 ** 9),
             "log_every": (0, 10 ** 9), "seed": (0, 2 ** 31 - 1)}
    for name, (low, high) in whole.items():
        value = getattr(config, name)
        if not low <= value <= high:
            raise BytecompError(f"--{name.replace('_', '-')} must be from {low} to {high}, "
                                f"got {value}")
    ranges = {"lr": (0.0, 100.0, False), "momentum": (0.0, 1.0, True),
              "label_noise": (0.0, 1.0, True), "timeout": (0.0, 86400.0, False)}
    for name, (low, high, low_included) in ranges.items():
        value = getattr(config, name)
        if not ((low <= value if low_included else low < value) and value < high):
            raise BytecompError(f"--{name.replace('_', '-')} must be in "
                                f"{'[' if low_included else '('}{low:g}, {high:g}), "
                                f"got {value:g}")


def train(config: TrainConfig) -> dict:
    """Train on the initialized process group; returns losses and executor statistics."""
    check_config(config)
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if torch.cuda.is_available() else torch.device("cpu")
    workload = load_workload(config.model, seed=config.seed)
    model = workload.model.to(device)
    inputs = model.hidden[0].in_features
    classes = model.head.out_features
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    plan = bytecomp.load_plan(config.plan) if config.plan else None
    start = 0
    checkpoint = None
    if config.resume:
        checkpoint = load_checkpoint(config.checkpoint, device)
        start = resume(checkpoint, config.checkpoint, model, optimizer, config, plan is not None)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=plan.bucket_cap_mb if plan else None)
    executor = bytecomp.apply_plan(ddp, plan) if plan else None
    if executor is not None and checkpoint is not None:
        executor.load_state_dict(checkpoint["bytecomp"])
    losses = []
    # the executor as a context: closed after the loop, and a peer that dies or stops
    # fails the step with one PeerFailure naming it
    with executor if executor is not None else contextlib.nullcontext():
        for step in range(start, config.steps):
            x, y = teacher_batch(step, rank, config, inputs, classes)
            loss = workload.loss(ddp(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            done = step + 1
            if rank == 0 and config.log_every and done % config.log_every == 0:
                recent = sum(losses[-config.log_every:]) / len(losses[-config.log_every:])
                line = f"step {done}: loss {recent:.4f}"
                if executor is not None:
                    stats = executor.stats.summary()
                    line += (f", bytes/step {stats['sent_bytes_per_step']:,.0f} "
                             f"({100 * stats['bytes_vs_fp32']:.1f}% of fp32)")
                    if stats["encode_ms_per_step"] is not None:  # None: PyTorch's own hook
                        line += (f", encode {stats['encode_ms_per_step']:.2f} ms, communicate "
                                 f"{stats['communicate_ms_per_step']:.2f} ms, decode "
                                 f"{stats['decode_ms_per_step']:.2f} ms per step")
                print(line, flush=True)
            if config.checkpoint and config.checkpoint_every and \
                    done % config.checkpoint_every == 0 and done < config.steps:
                residuals = executor.state_dict() if executor else None  # on every rank
                if rank == 0:
                    _save_atomic({"step": done, "model": model.state_dict(),
                                  "optimizer": optimizer.state_dict(), "bytecomp": residuals},
                                 config.checkpoint)
                dist.barrier()
    result = {"losses": losses, "final_loss": sum(losses[-100:]) / max(len(losses[-100:]), 1),
              "parameters": torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]),
              "stats": executor.stats.summary() if executor else None}
    if config.metrics and rank == 0:
        summary = {k: v for k, v in result.items() if k != "parameters"}
        Path(config.metrics).write_text(json.dumps({"config": asdict(config), **summary}))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = TrainConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(value) if value is not None else str,
                                default=value)
    config = TrainConfig(**vars(parser.parse_args()))
    try:
        check_config(config)
    except BytecompError as error:
        raise SystemExit(f"error: {error}") from None
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout))
    try:
        result = train(config)
        if dist.get_rank() == 0:
            print(f"final loss {result['final_loss']:.4f}")
    except bytecomp.PeerFailure as error:  # a rank died or stopped: one line naming it
        print(f"error: rank {dist.get_rank()}: {error}", file=sys.stderr, flush=True)
        os._exit(2)  # nothing to tear down: the process group would wait for the lost peer
    except BytecompError as error:  # a bad plan or checkpoint: one line, on every rank
        print(f"error: rank {dist.get_rank()}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        # DDP's reducer sits in reference cycles: collected only at exit, after its process
        # group was destroyed, it made gloo abort the process (1 exit in 4 with torch 2.13)
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
