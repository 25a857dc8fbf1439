"""Parameter names as plans and profiles compare them: without the prefixes that
wrappers add.

The same model has other parameter names once wrapped: ``module.`` (DDP,
DataParallel), ``_orig_mod.`` (``torch.compile``), ``_checkpoint_wrapped_module.``
(activation checkpointing), ``_forward_module.`` (Lightning before 2.1), and the
attribute a LightningModule or any outer module keeps the network in (``net.``,
``model.``). A plan made on the bare model must run on the wrapped one, so names
are compared *normalized*: the wrappers' prefixes removed, then the leading
components every name shares (never a name's last component). Both sides go
through the same function, so the bare model and its wrapped self normalize alike.
Light: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Prefixes that wrappers put before every name of the module they wrap.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.", "_checkpoint_wrapped_module.")
# Components only wrappers add, wherever they stand (torch's internal attribute names).
WRAPPER_COMPONENTS = frozenset({"_orig_mod", "_checkpoint_wrapped_module"})


@dataclass
class Normalized:
    """Each raw name's normalized name, and the prefixes removed to get them (in the
    order first met; the shared leading components last)."""

    names: dict[str, str]
    removed: list[str] = field(default_factory=list)

    def tried(self) -> str:
        """The prefixes this normalization removes, for messages."""
        return ", ".join(repr(p) for p in self.removed) or "none"


def _strip_wrappers(name: str, removed: dict[str, None]) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix) and len(name) > len(prefix):
                name = name[len(prefix):]
                removed.setdefault(prefix)
                stripped = True
    *path, last = name.split(".")
    for part in path:
        if part in WRAPPER_COMPONENTS:
            removed.setdefault(part + ".")
    return ".".join([*(p for p in path if p not in WRAPPER_COMPONENTS), last])


def _shared_components(names: list[str]) -> list[str]:
    """The leading components every name shares, each name keeping at least its last."""
    split = [name.split(".") for name in names]
    if not split:
        return []
    shared: list[str] = []
    for column in zip(*[parts[:-1] for parts in split]):
        if len(set(column)) != 1:
            break
        shared.append(column[0])
    return shared


def normalize(names: Iterable[str]) -> Normalized:
    """``names`` (one model's parameters) normalized, as described in the module's
    docstring; where that would give two parameters one name, the names unchanged."""
    raw = list(names)
    removed: dict[str, None] = {}
    bare = [_strip_wrappers(name, removed) for name in raw]
    shared = _shared_components(bare)
    if shared:
        removed.setdefault(".".join(shared) + ".")
        bare = [name[len(".".join(shared)) + 1:] for name in bare]
    if len(set(bare)) != len(bare):
        return Normalized({name: name for name in raw})
    return Normalized(dict(zip(raw, bare)), list(removed))
