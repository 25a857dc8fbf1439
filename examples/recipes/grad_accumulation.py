"""Gradient accumulation with a bytecomp plan: ``ddp.no_sync()`` on all but the last
micro-batch of a step, so DDP (and the plan's hook) exchanges once per step.

    torchrun --nproc_per_node 2 examples/recipes/grad_accumulation.py --plan plan.yaml --micro 4

Inside ``no_sync`` DDP calls no hook: the gradients accumulate locally, and the
last micro-batch's backward hands the plan the sum. The executor counts one step per
exchange, so its bytes per step are per optimizer step.
"""

from __future__ import annotations

import contextlib
import gc

import torch
import torch.distributed as dist
from common import batch, model, options, parser, report
from torch.nn.parallel import DistributedDataParallel

import bytecomp


def main() -> None:
    options_of = parser(__doc__.splitlines()[0])
    options_of.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    args = options(options_of)
    if not 1 <= args.micro <= 1024:
        options_of.error("--micro must be 1..1024")
    dist.init_process_group("gloo")
    plan = bytecomp.load_plan(args.plan)
    ddp = DistributedDataParallel(model(), bucket_cap_mb=plan.bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    size = max(args.batch_size // args.micro, 1)
    losses = []
    with bytecomp.apply_plan(ddp, plan) as executor:
        for step in range(args.steps):
            inputs, labels = batch(step, dist.get_rank(), size * args.micro)
            total = 0.0
            for micro in range(args.micro):
                last = micro == args.micro - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    part = slice(micro * size, (micro + 1) * size)
                    loss = torch.nn.functional.cross_entropy(ddp(inputs[part]), labels[part])
                    (loss / args.micro).backward()
                total += loss.item() / args.micro
            optimizer.step()
            optimizer.zero_grad()
            losses.append(total)
    if dist.get_rank() == 0:
        report("accumulation", losses, executor)
    # DDP's reducer sits in reference cycles: left to interpreter exit, it is freed after
    # its process group and gloo may abort the process (docs/executor.md, "Shutting down")
    del ddp, optimizer, executor
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
