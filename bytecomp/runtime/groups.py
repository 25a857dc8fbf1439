"""Plan groups as the executor runs them, and moving their gradients in and out of
DDP's buckets."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bytecomp.compress import Compressor, from_spec
from bytecomp.plan_types import NO_COMPRESSION, Plan


@dataclass
class GroupSpec:
    """One plan group as the executor runs it."""

    index: int
    names: list[str]
    compressor: Compressor
    place: str
    scheme: str
    shapes: list[tuple]
    numel: int
    prefix: str = ""  # an adaptive plan's level ("L2:"), so levels keep apart states

    @property
    def key(self) -> str:
        return self.prefix + "|".join(self.names)


def build_groups(plan: Plan, params: dict[str, torch.nn.Parameter],
                 fallback: str | None, prefix: str = "") -> list[GroupSpec]:
    """The plan's groups in group order (one compressor object per spec); with
    ``fallback="fp32"``, one fp32 allreduce group for each parameter the plan lacks.
    ``prefix`` starts every group's state key."""
    groups: list[GroupSpec] = []
    compressors: dict[str, Compressor] = {}

    def add(names: list[str], spec: str, place: str, scheme: str) -> None:
        compressor = compressors.setdefault(spec, from_spec(spec))
        groups.append(GroupSpec(len(groups), names, compressor, place, scheme,
                                [tuple(params[n].shape) for n in names],
                                sum(params[n].numel() for n in names), prefix))

    for _, entries in sorted(plan.groups().items()):
        option = entries[0].option
        add([e.name for e in entries], option.spec, option.place, option.scheme)
    if fallback == "fp32":
        planned = plan.by_name()
        for name in params:
            if name not in planned:
                add([name], NO_COMPRESSION.spec, NO_COMPRESSION.place, NO_COMPRESSION.scheme)
    return groups


def flat_input(views: list[torch.Tensor]) -> tuple[torch.Tensor, bool]:
    """The members as one flat tensor, and whether it is the bucket's own memory
    (when they lie side by side in it: no copy in, the result decoded in place)."""
    adjacent = all(v.is_contiguous() for v in views) and all(
        b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
        for a, b in zip(views, views[1:]))
    if adjacent:
        total = sum(v.numel() for v in views)
        return views[0].reshape(-1).as_strided((total,), (1,)), True
    return torch.cat([v.reshape(-1) for v in views]), False


def write_back(flat: torch.Tensor, views: list[torch.Tensor], non_blocking: bool = False) -> None:
    """Copy consecutive pieces of ``flat`` into the members' places in the bucket."""
    offset = 0
    for view in views:
        view.copy_(flat[offset: offset + view.numel()].view_as(view), non_blocking=non_blocking)
        offset += view.numel()
