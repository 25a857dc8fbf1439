"""torch.distributed.checkpoint (DCP): save and load the model, the optimizer and the
plan's state (error-feedback residuals, compressor state, the step) together.

    torchrun --nproc_per_node 2 examples/recipes/dcp_checkpoint.py --plan plan.yaml \\
        --steps 60 --checkpoint ckpt --save-at 30
    torchrun --nproc_per_node 2 examples/recipes/dcp_checkpoint.py --plan plan.yaml \\
        --steps 60 --checkpoint ckpt --resume          # steps 30..59, as the first run did

DCP loads in place into a state dict of the same keys, and a fresh executor has no
residuals yet: the executor's state (the same whole-job state on every rank) travels
as one byte stream, which DCP saves once and hands back on load.
"""

from __future__ import annotations

import gc
import io

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import batch, model, options, parser, report
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

import bytecomp


def save(path: str, ddp, optimizer, executor, step: int) -> None:
    model_state, optimizer_state = get_state_dict(ddp, optimizer)
    plan_state = io.BytesIO()
    torch.save(executor.state_dict(), plan_state)  # collective: every rank
    dcp.save({"model": model_state, "optimizer": optimizer_state, "bytecomp": plan_state,
              "step": torch.tensor(step)}, checkpoint_id=path)


def load(path: str, ddp, optimizer, executor) -> int:
    model_state, optimizer_state = get_state_dict(ddp, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "bytecomp": io.BytesIO(),
             "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(ddp, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    state["bytecomp"].seek(0)
    executor.load_state_dict(torch.load(state["bytecomp"], weights_only=True))
    return int(state["step"])


def main() -> None:
    options_of = parser(__doc__.splitlines()[0])
    options_of.add_argument("--checkpoint", required=True, help="a DCP checkpoint folder")
    options_of.add_argument("--save-at", type=int, default=0, help="save after this step")
    options_of.add_argument("--resume", action="store_true")
    args = options(options_of)
    dist.init_process_group("gloo")
    plan = bytecomp.load_plan(args.plan)
    ddp = DistributedDataParallel(model(), bucket_cap_mb=plan.bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    losses = []
    with bytecomp.apply_plan(ddp, plan) as executor:
        start = load(args.checkpoint, ddp, optimizer, executor) if args.resume else 0
        for step in range(start, args.steps):
            inputs, labels = batch(step, dist.get_rank(), args.batch_size)
            loss = torch.nn.functional.cross_entropy(ddp(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            if step + 1 == args.save_at:
                save(args.checkpoint, ddp, optimizer, executor, step + 1)
    if dist.get_rank() == 0:
        report("dcp-resumed" if args.resume else "dcp", losses, executor)
    # DDP's reducer sits in reference cycles: left to interpreter exit, it is freed after
    # its process group and gloo may abort the process (docs/executor.md, "Shutting down")
    del ddp, optimizer, executor
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
