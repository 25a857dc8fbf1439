"""What the executor keeps across steps: statistics, and compressor state and
residuals per group, saved and restored with checkpoints."""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.plan import Plan

STATE_FORMAT = 1


@dataclass
class Stats:
    """Totals since the last reset; ``summary()`` gives per-step figures."""

    steps: int = 0
    sent_bytes: int = 0
    fp32_bytes: int = 0
    encode_s: float = 0.0
    communicate_s: float = 0.0
    decode_s: float = 0.0
    hook_s: float = 0.0  # on DDP's thread, inside the hook (encodes of device groups included)
    switches: int = 0  # an adaptive plan's moves between levels
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **amounts: float) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "sent_bytes_per_step": self.sent_bytes / steps,
            "fp32_bytes_per_step": self.fp32_bytes / steps,
            "bytes_vs_fp32": self.sent_bytes / self.fp32_bytes if self.fp32_bytes else 0.0,
            "encode_ms_per_step": 1000 * self.encode_s / steps,
            "communicate_ms_per_step": 1000 * self.communicate_s / steps,
            "decode_ms_per_step": 1000 * self.decode_s / steps,
            "hook_ms_per_step": 1000 * self.hook_s / steps,
            "switches": self.switches,
        }


class GroupStates:
    """Compressor state and residuals per group, keyed by the names of its tensors (so
    DDP's bucket rebuild does not disturb them), and the step count."""

    def __init__(self, plan: Plan, device: torch.device, meter: bool = False) -> None:
        self.plan = plan
        self.device = device
        self.meter = meter  # compressors leave the squared norms of their gain in the state
        self.by_group: dict[str, dict] = {}
        self.step = 0

    def of(self, key: str, shapes: list[tuple]) -> dict:
        """The state dict of the group whose key is ``key`` (created on first use)."""
        state = self.by_group.get(key)
        if state is None:
            state = self.by_group[key] = {"salt": zlib.crc32(key.encode()), "shapes": shapes}
            if self.meter:
                state["meter"] = True
        return state

    def take_gain(self, key: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(squared norm, squared error)`` of the group's last compression, summed over
        its chunks, removed from its state (None: nothing measured). 0-d tensors on the
        group's device: reading them is left to the caller, once for every group (each
        read of a GPU tensor waits for the GPU)."""
        state = self.by_group.get(key)
        if state is None:
            return None
        parts = [state, *(state.get("chunks") or [])]
        measured = [(part.pop("sq_norm"), part.pop("sq_error")) for part in parts
                    if "sq_norm" in part]
        if not measured:
            return None
        if len(measured) == 1:
            return measured[0]
        norms, errors = zip(*measured)
        return torch.stack(norms).sum(), torch.stack(errors).sum()

    def state_dict(self) -> dict:
        """Every rank's states gathered (collective: call it on every rank)."""
        ranks: list = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, to_device(self.by_group, torch.device("cpu")))
        return {"format": STATE_FORMAT, "plan_digest": self.plan.digest(), "step": self.step,
                "world_size": dist.get_world_size(), "ranks": ranks}

    def load_state_dict(self, saved: dict) -> None:
        """Take this rank's part of :meth:`state_dict`, after checking where it is from and
        that the whole of it is well formed (so that every rank, loading the same
        checkpoint, accepts or refuses it alike)."""
        if not isinstance(saved, dict) or saved.get("format") != STATE_FORMAT:
            raise BytecompError("not a bytecomp executor state (expected executor.state_dict())")
        if saved.get("plan_digest") != self.plan.digest():
            raise BytecompError("this executor state was saved with another plan")
        world = dist.get_world_size()
        if saved.get("world_size") != world:
            raise BytecompError(f"this executor state was saved by {saved.get('world_size')} "
                                f"ranks, not {world}")
        problem = _malformed(saved, world)
        if problem:
            raise BytecompError(f"this executor state is corrupted: {problem}")
        self.by_group = to_device(saved["ranks"][dist.get_rank()], self.device)
        self.step = int(saved["step"])


PLAIN = (torch.Tensor, int, float, str, bool, type(None))


def _malformed(saved: dict, world: int) -> str | None:
    """What is wrong with a saved state's layout, or None. A state holds only tensors,
    numbers, strings, lists, tuples and dicts, so ``torch.load(weights_only=True)``
    reads it."""
    step, ranks = saved.get("step"), saved.get("ranks")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"'step' must be a non-negative integer, got {step!r}"
    if not isinstance(ranks, list) or len(ranks) != world:
        return f"'ranks' must be a list of {world} per-rank states"
    for rank, groups in enumerate(ranks):
        if not isinstance(groups, dict) or not all(
                isinstance(key, str) and isinstance(value, dict) for key, value in groups.items()):
            return f"ranks[{rank}] must map group keys to state dicts"
        where = _not_plain(groups, f"ranks[{rank}]")
        if where:
            return f"{where} is not a tensor, number, string, list or dict"
    return None


def _not_plain(value, where: str) -> str | None:
    if isinstance(value, dict):
        for key, item in value.items():
            found = _not_plain(item, f"{where}[{key!r}]") if isinstance(key, (str, int)) else where
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _not_plain(item, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if isinstance(value, PLAIN) else where


def to_device(value, device: torch.device):
    """``value`` with every tensor in it (through dicts and lists) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    return value
