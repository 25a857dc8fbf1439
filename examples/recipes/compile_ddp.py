"""torch.compile and a bytecomp plan, in either order.

    torchrun --nproc_per_node 2 examples/recipes/compile_ddp.py --plan plan.yaml --order compile-then-ddp
    torchrun --nproc_per_node 2 examples/recipes/compile_ddp.py --plan plan.yaml --order ddp-then-compile

``compile-then-ddp``: DDP wraps the compiled module, whose parameters are named
``_orig_mod.0.weight``...; plans compare names without that prefix. ``ddp-then-compile``
(what PyTorch recommends): compile the DDP model after ``apply_plan`` (or before: it
takes the compiled DDP too); dynamo's DDPOptimizer splits the graph at DDP's buckets
and the hook runs on them as in eager mode. What cannot work is refused in one line:
DDP built under ``torch._dynamo.config.optimize_ddp = "python_reducer"`` (compiled
autograd) calls hooks per parameter, never per bucket (``--order compiled-autograd``
shows the refusal).
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from common import batch, model, options, parser, report
from torch.nn.parallel import DistributedDataParallel

import bytecomp

ORDERS = ("compile-then-ddp", "ddp-then-compile", "compiled-autograd")


def main() -> None:
    options_of = parser(__doc__.splitlines()[0])
    options_of.add_argument("--order", choices=ORDERS, default="ddp-then-compile",
                            help="compiled-autograd: refused, as it cannot work")
    args = options(options_of)
    order = args.order
    dist.init_process_group("gloo")
    plan = bytecomp.load_plan(args.plan)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    if order == "compile-then-ddp":
        ddp = DistributedDataParallel(torch.compile(net), bucket_cap_mb=plan.bucket_cap_mb)
        executor = bytecomp.apply_plan(ddp, plan)
        train = ddp
    else:
        if order == "compiled-autograd":
            torch._dynamo.config.optimize_ddp = "python_reducer"
        ddp = DistributedDataParallel(net, bucket_cap_mb=plan.bucket_cap_mb)
        try:
            executor = bytecomp.apply_plan(ddp, plan)
        except bytecomp.BytecompError as error:
            raise SystemExit(f"error: rank {dist.get_rank()}: {error}") from None
        train = torch.compile(ddp)
    losses = []
    with executor:
        for step in range(args.steps):
            inputs, labels = batch(step, dist.get_rank(), args.batch_size)
            loss = torch.nn.functional.cross_entropy(train(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    if dist.get_rank() == 0:
        report(order, losses, executor)
    # DDP's reducer sits in reference cycles: left to interpreter exit, it is freed after
    # its process group and gloo may abort the process (docs/executor.md, "Shutting down")
    del ddp, train, optimizer, executor
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
