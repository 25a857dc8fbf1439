"""What the executor keeps across steps: statistics, and compressor state and
residuals per group, saved and restored with checkpoints."""

from __future__ import annotations

import math
import threading
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.plan_types import Plan

STATE_FORMAT = 1


# The totals Stats keeps (summed by add), in summary order.
TOTALS = ("steps", "sent_bytes", "fp32_bytes", "encode_s", "communicate_s", "decode_s", "hook_s",
          "switches")


@dataclass
class Stats:
    """What the plan's run sent and spent: totals since the start (:meth:`summary`) and
    since the last read (:meth:`interval`), per step; :meth:`log_every` hands the
    interval's figures to a logger every N steps."""

    steps: int = 0
    sent_bytes: int = 0
    fp32_bytes: int = 0
    encode_s: float = 0.0
    communicate_s: float = 0.0
    decode_s: float = 0.0
    hook_s: float = 0.0  # on DDP's thread, inside the hook (encodes of device groups included)
    switches: int = 0  # an adaptive plan's moves between levels
    # False where PyTorch's own hook runs the exchange (bytecomp.runtime.native): bytes
    # are counted, times are not measured, and the figures say None rather than 0.0
    timed: bool = True
    # a verified plan's runtime trial, in words: the line it said when it started and the
    # one when it decided (Adaptation._announce)
    trial: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _read: dict = field(default_factory=lambda: dict.fromkeys(TOTALS, 0), repr=False)
    _log: tuple | None = field(default=None, repr=False)  # (every, sink)

    def add(self, **amounts: float) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)
            due = self._log is not None and "steps" in amounts and \
                self.steps % self._log[0] == 0
        if due:
            assert self._log is not None
            _emit(self._log[1], self.interval(), self.steps)

    def summary(self) -> dict:
        """Per-step figures since the start: steps, sent and fp32 bytes per step, their
        ratio, encode / communicate / decode / hook milliseconds per step (None where
        not measured: a plan run by PyTorch's own hook), switches."""
        with self.lock:
            return _figures({name: getattr(self, name) for name in TOTALS}, self.timed)

    def interval(self) -> dict:
        """The :meth:`summary` figures of the steps since the last call (or the start)."""
        with self.lock:
            now = {name: getattr(self, name) for name in TOTALS}
            since = {name: now[name] - self._read[name] for name in TOTALS}
            self._read = now
        return _figures(since, self.timed)

    def log_every(self, steps: int, to) -> None:
        """Every ``steps`` steps, hand :meth:`interval`'s figures to ``to``: a
        ``torch.utils.tensorboard.SummaryWriter`` (one scalar per figure, tagged
        ``bytecomp/<figure>``, at the step), or any callable ``to(figures, step)``.
        It runs on the thread that ends the step (DDP's, in the backward pass)."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise BytecompError(f"log_every takes a whole number of steps >= 1, got {steps!r}")
        if not callable(to) and not callable(getattr(to, "add_scalar", None)):
            raise BytecompError(f"log_every logs to a SummaryWriter or a callable "
                                f"(figures, step), got {type(to).__name__}")
        self._log = (steps, to)


def _figures(totals: dict, timed: bool = True) -> dict:
    steps = max(totals["steps"], 1)

    def ms(name: str) -> float | None:
        return 1000 * totals[name] / steps if timed else None

    return {
        "steps": totals["steps"],
        "sent_bytes_per_step": totals["sent_bytes"] / steps,
        "fp32_bytes_per_step": totals["fp32_bytes"] / steps,
        "bytes_vs_fp32": totals["sent_bytes"] / totals["fp32_bytes"]
        if totals["fp32_bytes"] else 0.0,
        "encode_ms_per_step": ms("encode_s"),
        "communicate_ms_per_step": ms("communicate_s"),
        "decode_ms_per_step": ms("decode_s"),
        "hook_ms_per_step": ms("hook_s"),
        "switches": totals["switches"],
    }


def _emit(sink, figures: dict, step: int) -> None:
    add_scalar = getattr(sink, "add_scalar", None)
    if callable(add_scalar):  # a SummaryWriter
        for name, value in figures.items():
            if value is not None:  # not measured: nothing to plot
                add_scalar(f"bytecomp/{name}", value, step)
    else:
        sink(figures, step)


class GroupTimes:
    """Per-group timestamps of the next ``steps`` steps (:meth:`Executor.record_group_times`):
    when each group was launched (its last gradient arrived), encoded, put on the wire,
    off it, and written back, in ms after the step's first bucket came to the hook."""

    PHASES = ("launched", "encoded", "sent", "received", "done")

    def __init__(self, steps: int) -> None:
        self.steps_left = steps
        self.rows: list[dict] = []
        self.lock = threading.Lock()

    def add(self, step: int, group: int, origin: float, times: dict[str, float]) -> None:
        """One group's timestamps (``perf_counter`` seconds) of step ``step``, whose first
        bucket came at ``origin``; a phase its path does not have (the host path's wire
        start is its FIFO turn) is taken from the phase before."""
        row: dict = {"step": step, "group": group}
        last = times["launched"]
        for phase in self.PHASES:
            last = times.get(phase, last)
            row[f"{phase}_ms"] = 1000 * (last - origin)
        with self.lock:
            self.rows.append(row)


@dataclass(frozen=True)
class GroupLayout:
    """What a group's saved state must fit: its tensors' shapes, their total size and the
    gradients' dtype."""

    shapes: tuple[tuple[int, ...], ...]
    numel: int
    dtype: torch.dtype


# State entries that hold a floating tensor of the group's size where present, and its
# dtype: the error-feedback residual (added to the gradients: theirs, None here) and
# Signum's momentum (kept in float32).
WHOLE_GROUP_TENSORS = {"residual": None, "momentum": torch.float32}
# Integers a state keeps: the seed salt of its random draws, a compressor's step count.
COUNTERS = ("salt", "step")
# Sub-states of pieces of the group (chunks of a scheme, its server and inter-node stages):
# their residuals are at most the group's size.
PIECE_STATES = ("chunks", "server", "inter")


class GroupStates:
    """Compressor state and residuals per group, keyed by the names of its tensors (so
    DDP's bucket rebuild does not disturb them), and the step count. ``layouts`` (by
    group key): what a loaded state must fit, checked by :meth:`load_state_dict`."""

    def __init__(self, plan: Plan, device: torch.device, meter: bool = False,
                 layouts: dict[str, GroupLayout] | None = None) -> None:
        self.plan = plan
        self.device = device
        self.meter = meter  # compressors leave the squared norms of their gain in the state
        self.layouts = layouts
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
        problem = _malformed(saved, world, self.layouts)
        if problem:
            raise BytecompError(f"this executor state is corrupted: {problem}")
        self.by_group = to_device(saved["ranks"][dist.get_rank()], self.device)
        self.step = int(saved["step"])


PLAIN = (torch.Tensor, int, float, str, bool, type(None))


def _malformed(saved: dict, world: int, layouts: dict[str, GroupLayout] | None) -> str | None:
    """What is wrong with a saved state, or None. A state holds only tensors, numbers,
    strings, lists, tuples and dicts, so ``torch.load(weights_only=True)`` reads it; no
    tensor in it is NaN or infinite; with ``layouts``, every group is one of them and its
    residuals fit it."""
    step, ranks = saved.get("step"), saved.get("ranks")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"'step' must be a non-negative integer, got {step!r}"
    if not isinstance(ranks, list) or len(ranks) != world:
        return f"'ranks' must be a list of {world} per-rank states"
    for rank, groups in enumerate(ranks):
        if not isinstance(groups, dict) or not all(
                isinstance(key, str) and isinstance(value, dict) for key, value in groups.items()):
            return f"ranks[{rank}] must map group keys to state dicts"
        leaves = list(_leaves(groups, f"ranks[{rank}]"))
        where = next((place for place, item in leaves if not isinstance(item, PLAIN)), None)
        if where:
            return f"{where} is not a tensor, number, string, list or dict"
        where = next((place for place, item in leaves if not _finite(item)), None)
        if where:
            return f"{where} holds NaN or infinite values"
        where = next((place for place, item in leaves if not _bounded(item)), None)
        if where:
            return (f"{where} has a norm beyond {MAX_STATE_NORM:.3g} (its square overflows "
                    f"float32, in which the executor measures gains: no residual of a run "
                    f"that had not diverged)")
        if layouts is None:
            continue
        for key, state in groups.items():
            problem = _misfit(state, layouts.get(key), f"ranks[{rank}][{key!r}]")
            if problem:
                return problem
    return None


def _misfit(state: dict, layout: GroupLayout | None, where: str) -> str | None:
    """What in a group's saved state does not fit the group, or None."""
    if layout is None:
        return f"{where} is not a group of this plan on this model"
    shapes = state.get("shapes")
    if not isinstance(shapes, (list, tuple)) or \
            [tuple(s) for s in shapes if isinstance(s, (list, tuple))] != list(layout.shapes):
        return f"{where}['shapes'] must be {[list(s) for s in layout.shapes]}, got {shapes!r}"
    pieces: list[tuple[object, int | None, str]] = [
        (state, layout.numel, where), (state.get("inner"), layout.numel, f"{where}['inner']")]
    for name in PIECE_STATES:
        part = state.get(name)
        parts = part if isinstance(part, list) else [part]
        pieces += [(p, None, f"{where}[{name!r}]") for p in parts]
    for piece, numel, place in pieces:
        if piece is None:
            continue
        if not isinstance(piece, dict):
            return f"{place} must be a state dict"
        for name in COUNTERS:
            value = piece.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return f"{place}[{name!r}] must be a non-negative integer, got {value!r}"
        for name, dtype in WHOLE_GROUP_TENSORS.items():
            problem = _tensor_misfit(piece.get(name), numel, layout, dtype or layout.dtype,
                                     f"{place}[{name!r}]")
            if problem:
                return problem
    return None


def _tensor_misfit(value, numel: int | None, layout: GroupLayout, dtype: torch.dtype,
                   where: str) -> str | None:
    """A residual (``numel``: the group's size, None: a piece of it, at most that) must be
    a floating tensor of that size and ``dtype``."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return f"{where} must be a floating-point tensor, got {type(value).__name__}" + \
            (f" of {value.dtype}" if isinstance(value, torch.Tensor) else "")
    if value.dtype != dtype:
        return f"{where} must be of {dtype}, got {value.dtype}"
    fits = value.numel() == numel if numel is not None else value.numel() <= layout.numel
    if not fits:
        size = f"{numel}" if numel is not None else f"at most {layout.numel}"
        return f"{where} must hold {size} elements, got shape {list(value.shape)}"
    return None


BAD_KEY = object()  # what _leaves yields for a dict key that is neither a str nor an int


def _leaves(value, where: str):
    """``(place, item)`` of every value under ``value`` that is not a dict, list or tuple,
    depth first; a dict key that is neither a str nor an int yields ``(place of the dict,
    BAD_KEY)``."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, (str, int)):
                yield from _leaves(item, f"{where}[{key!r}]")
            else:
                yield where, BAD_KEY
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{where}[{index}]")
    else:
        yield where, value


# The largest norm a floating tensor (a residual, Signum's momentum, a low-rank factor) or
# number of a saved state may have: its square is float32's largest. The executor measures
# gains from squared norms in float32 (bytecomp.compress.feedback) and the low-rank
# compressors multiply the residual's matrices, so beyond it the next step's gain is NaN;
# a residual is gradient not yet sent, of the gradients' magnitude, nowhere near it.
MAX_STATE_NORM = math.sqrt(torch.finfo(torch.float32).max)  # about 1.84e19


def _bounded(item) -> bool:
    """False for a floating tensor whose norm, or a float whose magnitude, is above
    :data:`MAX_STATE_NORM` (taken in float64: no overflow of its own)."""
    if isinstance(item, torch.Tensor):
        return not item.is_floating_point() or item.numel() == 0 or \
            float(torch.linalg.vector_norm(item.double())) <= MAX_STATE_NORM
    return not isinstance(item, float) or abs(item) <= MAX_STATE_NORM


def _finite(item) -> bool:
    """False for a float, or a floating tensor, holding NaN or an infinity."""
    if isinstance(item, torch.Tensor):
        return not item.is_floating_point() or bool(torch.isfinite(item).all())
    return not isinstance(item, float) or math.isfinite(item)


def to_device(value, device: torch.device):
    """``value`` with every tensor in it (through dicts and lists) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    return value
