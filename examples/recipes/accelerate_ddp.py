"""Accelerate: a bytecomp plan on the DDP model that ``accelerator.prepare`` returns.

    torchrun --nproc_per_node 2 examples/recipes/accelerate_ddp.py --plan plan.yaml

Accelerate's own ``comm_hook`` option takes only its enum of PyTorch's hooks; a plan
goes on the prepared model with ``bytecomp.apply_plan`` (pass the plan's bucket cap
to DDP through ``DistributedDataParallelKwargs``).
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs
from common import batch, model, options, parser, report

import bytecomp


def main() -> None:
    args = options(parser(__doc__.splitlines()[0]))
    plan = bytecomp.load_plan(args.plan)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=[
        DistributedDataParallelKwargs(bucket_cap_mb=plan.bucket_cap_mb)])
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    ddp, optimizer = accelerator.prepare(net, optimizer)
    losses = []
    with bytecomp.apply_plan(ddp, plan) as executor:
        for step in range(args.steps):
            inputs, labels = (t.to(accelerator.device)
                              for t in batch(step, accelerator.process_index, args.batch_size))
            loss = torch.nn.functional.cross_entropy(ddp(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    if accelerator.is_main_process:
        report("accelerate", losses, executor)
    accelerator.end_training()


if __name__ == "__main__":
    main()
