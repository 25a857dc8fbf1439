"""Lightning: a bytecomp plan as DDPStrategy's communication hook.

    torchrun --nproc_per_node 2 examples/recipes/lightning_ddp.py --plan plan.yaml
    torchrun --nproc_per_node 2 examples/recipes/lightning_ddp.py --autotune plan.yaml --steps 600

With ``--autotune PLAN_OUT`` instead of a plan, ``bytecomp.comm_hook(autotune=...)`` is
the pair: the job measures, plans and chooses while Lightning trains, and saves the plan
to PLAN_OUT.

``bytecomp.comm_hook(plan)`` returns the ``(state, hook)`` pair that
``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)`` registers. The plan was made on
the bare model (names ``0.weight``...); here the LightningModule holds it as ``net``
(``net.0.weight``...): plans compare names without such prefixes.

Lightning registers communication hooks on CUDA devices only (its DDPStrategy skips
them elsewhere), so on CPU ranks this recipe registers the pair itself after Lightning
wraps the model (:class:`CPUHookDDPStrategy`); on GPUs plain ``DDPStrategy`` does.
"""

from __future__ import annotations

import os

import lightning as L
import torch
from common import batch, model, options, parser, report
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

import bytecomp


class Steps(Dataset):
    """Batch ``s`` of this rank (Lightning's sampler is off: each rank draws its own)."""

    def __init__(self, steps: int, size: int, rank: int) -> None:
        self.steps, self.size, self.rank = steps, size, rank

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        return batch(step, self.rank, self.size)


class Classifier(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.net = model()
        self.lr = lr
        self.losses: list[float] = []

    def training_step(self, pair, _):
        inputs, labels = pair
        loss = torch.nn.functional.cross_entropy(self.net(inputs[0]), labels[0])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class CPUHookDDPStrategy(DDPStrategy):
    """DDPStrategy that also registers its communication hook on CPU ranks."""

    def configure_ddp(self) -> None:
        super().configure_ddp()
        if self.root_device.type != "cuda":  # where Lightning does not
            self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)


def main() -> None:
    described = parser(__doc__.splitlines()[0], plan_required=False)
    described.add_argument("--autotune", metavar="PLAN_OUT",
                           help="instead of --plan: tune inside the job, saving the plan here")
    args = options(described)
    if (args.plan is None) == (args.autotune is None):
        described.error("give --plan or --autotune (one of them)")
    if args.autotune is not None:
        state, hook = bytecomp.comm_hook(autotune={"plan_out": args.autotune,
                                                   "measure_steps": 20})
        caps = {}  # DDP's default buckets: the tuner plans for the ones DDP built
    else:
        state, hook = bytecomp.comm_hook(args.plan)
        caps = {"bucket_cap_mb": state.plan.bucket_cap_mb}
    strategy = (DDPStrategy if torch.cuda.is_available() else CPUHookDDPStrategy)(
        ddp_comm_state=state, ddp_comm_hook=hook, **caps)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # torchrun's
    trainer = L.Trainer(accelerator="auto", devices=per_node, strategy=strategy,
                        num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // per_node,
                        max_steps=args.steps, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    module = Classifier(args.lr)
    data = DataLoader(Steps(args.steps, args.batch_size, trainer.global_rank), batch_size=1)
    with state:  # closes the executor after training; a failed check as one error
        trainer.fit(module, data)
    if trainer.global_rank == 0:
        report("lightning", module.losses, state)


if __name__ == "__main__":
    main()
