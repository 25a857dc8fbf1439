"""The plan in memory: a tensor's strategy (:class:`Option`), a plan's entries, an
adaptive plan's levels and controller settings, and the :class:`Plan` itself, which
writes its file (:meth:`Plan.save`; :mod:`bytecomp.plan_file` reads and validates one).

This module is the vocabulary the planner and the executor share (strategies as
:class:`Option`, the model fingerprint, the host pool size), so that a
training job that imports :mod:`bytecomp.runtime` loads no planner code.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from bytecomp.errors import BytecompError
from bytecomp.files import write_text_atomic
from bytecomp.safe_yaml import dump_yaml
from bytecomp.schema import Integer, Number, OneOf, declared

FORMAT_VERSION = 1  # the plan file's
UNCOMPRESSED = "none"  # the spec of an uncompressed (fp32) strategy
# Host-offload workers per rank: the executor's pool (``apply_plan(host_workers=...)``) and
# the planner's model of it, which must agree. A plan for a cluster config that gives a
# node's cores records that node's cores shared by its ranks instead (``Plan.host_workers``).
HOST_WORKERS = 2
# A verified plan's finalists' training (bytecomp.search.verify): at most this many steps
# (plan --verify-steps, and a plan file's verification.steps)
MAX_VERIFY_STEPS = 100_000
# An adaptive plan's step counts: a window (and an agreement interval) longer than a long
# training run never decides; explore_every up to "never" (bytecomp.search.verify.NEVER).
MAX_WINDOW = 100_000
MAX_EXPLORE_EVERY = 10**9
MAX_TRIAL_STEPS = 1_000_000
TIMINGS = ("measured", "predicted")  # where an adaptive plan's step times come from
# How gradients reach the hook: DDP's buckets at bucket_cap_mb, or one bucket per tensor
# (bucket_cap_mb 0: no tensor merged with another, each exchanged when its gradient is ready)
EXCHANGES = ("ddp-buckets", "per-tensor")


def exchange_of(bucket_cap_mb: float) -> str:
    """The exchange a bucket cap names: ``per-tensor`` for 0, else ``ddp-buckets``."""
    return "per-tensor" if bucket_cap_mb == 0 else "ddp-buckets"


@dataclass(frozen=True)
class Option:
    """A strategy for a tensor: a compressor spec (``"none"``: uncompressed, fp32), where
    it encodes and decodes (``device`` or ``host``) and its collective scheme (a name in
    :data:`bytecomp.comm.schemes.SCHEMES`)."""

    spec: str = UNCOMPRESSED
    place: str = "device"
    scheme: str = "allreduce"

    @property
    def compressed(self) -> bool:
        return self.spec != UNCOMPRESSED

    @property
    def label(self) -> str:
        if not self.compressed:
            return f"fp32 {self.scheme}"
        return f"{self.spec} {self.scheme} @{self.place}"


NO_COMPRESSION = Option(UNCOMPRESSED, "device", "allreduce")


def fingerprint(model) -> str:
    """sha256 over a model's parameter names, shapes and dtypes, in ``named_parameters``
    order: what a plan and a profile record to recognise their model. The names are
    normalized (:mod:`bytecomp.naming`: without wrappers' prefixes such as ``module.``,
    ``_orig_mod.`` or a LightningModule's attribute), so a wrapped model is the same model."""
    from bytecomp.naming import normalize

    named = list(model.named_parameters())
    names = normalize(name for name, _ in named).names
    digest = hashlib.sha256()
    for name, param in named:
        digest.update(f"{names[name]}|{tuple(param.shape)}|{param.dtype}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class PlanEntry:
    """One tensor's strategy (in the file, ``scheme`` is the entry's ``collective``)."""

    name: str
    action: str
    compressor: str | None
    place: str
    scheme: str
    group: int

    @classmethod
    def of(cls, name: str, option: Option, group: int) -> PlanEntry:
        """The entry giving tensor ``name`` the strategy ``option`` in ``group``."""
        if not option.compressed:
            return cls(name, "none", None, option.place, option.scheme, group)
        return cls(name, "compress", option.spec, option.place, option.scheme, group)

    @property
    def option(self) -> Option:
        spec = self.compressor if self.action == "compress" and self.compressor else UNCOMPRESSED
        return Option(spec, self.place, self.scheme)

    def to_dict(self) -> dict:
        return {"name": self.name, "action": self.action, "compressor": self.compressor,
                "place": self.place, "collective": self.scheme, "group": self.group}




# Turns of the runtime trial with every candidate timed that it needs to measure a gap's
# spread at all (bytecomp.runtime.trial decides; the planner sizes trial_steps by it).
MIN_TRIAL_PAIRS = 3


@dataclass(frozen=True)
class Adaptive:
    """How the executor moves along an adaptive plan's levels (see
    :mod:`bytecomp.runtime.controller`): the compressor ``family`` of the ladder, the
    gain ``threshold`` a level must keep, the smoothing ``window`` (EWMA span, and
    the steps spent at a level before deciding), the ``tolerance`` within which two
    neighbours' throughput x gain count as equal (settle on the better), and how
    many steps a settled controller waits before trying the next level again.
    ``timing`` says where the step times it scores levels with come from: its own
    measurements (``measured``), or the plan's predictions (``predicted``: the same
    decisions on every run, e.g. when training away from the cluster planned for).
    ``start`` is the level training starts at (the planner's choice: the best
    predicted effective time among the levels it expects to keep the threshold).
    ``agree_every`` is how many steps' measurements the ranks agree on in one
    allreduce (1: every step; the planner picks more for short steps, where the
    exchange would cost a noticeable share of each step). ``trial``: the levels (a
    verified plan's finalists) the running job times in turn for ``trial_steps`` steps
    after ``trial_warmup`` before keeping one (:mod:`bytecomp.runtime.trial`)."""

    family: str
    threshold: float = declared(0.75, Number(0.0, 1.0))
    window: int = declared(10, Integer(1, MAX_WINDOW, "steps"))
    tolerance: float = declared(0.03, Number(0.0, 1.0))
    explore_every: int = declared(200, Integer(1, MAX_EXPLORE_EVERY, "steps"))
    timing: str = declared("measured", OneOf(TIMINGS))
    start: int = 0  # a level of the plan's (the reader checks it against them)
    agree_every: int = declared(1, Integer(1, MAX_WINDOW, "steps"))
    trial: tuple[int, ...] = ()  # distinct levels of the plan's, two or more
    trial_steps: int = declared(0, Integer(0, MAX_TRIAL_STEPS))  # at least one per level
    trial_warmup: int = declared(0, Integer(0, MAX_TRIAL_STEPS))

    def to_dict(self) -> dict:
        values: dict = {"family": self.family, "threshold": self.threshold,
                        "window": self.window, "tolerance": self.tolerance,
                        "explore_every": self.explore_every, "timing": self.timing,
                        "start": self.start}
        if self.agree_every != 1:  # absent: every step (a plan written before it, whose
            values["agree_every"] = self.agree_every  # digest, in checkpoints, stays)
        if self.trial:
            values.update(trial=list(self.trial), trial_steps=self.trial_steps,
                          trial_warmup=self.trial_warmup)
        return values


@dataclass
class Level:
    """One level of an adaptive plan: the ladder's ``setting`` (a compressor spec of
    the family, or ``none`` / ``fp16`` for the mildest), its entries and what the
    planner predicted for it: iteration time, ``fidelity`` (the profile's gains
    calibrated by its convergence probe) and ``gain`` (the same gains uncalibrated:
    what the executor measures). The controller reads a measured gain ``g`` as
    ``g ** (log fidelity / log gain)``: the fidelity the probe's calibration gives."""

    setting: str
    entries: list[PlanEntry]
    predicted_ms: float | None = None
    fidelity: float | None = None
    gain: float | None = None
    steps_factor: float | None = None  # a verified plan's finalist: measured by training

    @property
    def calibration(self) -> float:
        """The power the controller raises this level's measured gains to (1: none)."""
        fidelity, gain = self.fidelity, self.gain
        if fidelity is None or gain is None or not 0 < fidelity < 1 or not 0 < gain < 1:
            return 1.0
        return math.log(fidelity) / math.log(gain)

    def to_dict(self) -> dict:
        out = {"setting": self.setting, "predicted_ms": self.predicted_ms,
               "fidelity": self.fidelity, "gain": self.gain}
        if self.steps_factor is not None:
            out["steps_factor"] = self.steps_factor
        return {**out, "tensors": [e.to_dict() for e in self.entries]}


@dataclass
class Plan:
    """A validated plan: what apply_plan executes. An adaptive plan has ``levels``
    (``entries`` are then those of level 0) and ``adaptive`` settings."""

    model_fingerprint: str
    world_size: int
    nodes: int
    ranks_per_node: int
    bucket_cap_mb: float
    entries: list[PlanEntry]
    predicted_ms: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # provenance: versions, profile, cluster, created
    path: Path | None = None
    levels: list[Level] | None = None
    adaptive: Adaptive | None = None
    host_workers: int = HOST_WORKERS  # the executor's pool per rank (a node's cores / ranks)

    @property
    def compressors(self) -> list[str]:
        entries = [e for level in self.levels for e in level.entries] if self.levels \
            else self.entries
        return sorted({e.compressor for e in entries if e.compressor is not None})

    def level(self, index: int) -> Plan:
        """Level ``index`` of an adaptive plan as a static plan of its own."""
        if not self.levels:
            raise BytecompError("not an adaptive plan: it has no levels")
        level = self.levels[index]
        return Plan(self.model_fingerprint, self.world_size, self.nodes, self.ranks_per_node,
                    self.bucket_cap_mb, level.entries,
                    {"plan": level.predicted_ms} if level.predicted_ms is not None else {},
                    dict(self.search), dict(self.info), self.path,
                    host_workers=self.host_workers)

    def by_name(self) -> dict[str, PlanEntry]:
        return {entry.name: entry for entry in self.entries}

    def groups(self) -> dict[int, list[PlanEntry]]:
        groups: dict[int, list[PlanEntry]] = {}
        for entry in self.entries:
            groups.setdefault(entry.group, []).append(entry)
        return groups

    def to_dict(self) -> dict:
        out = {
            "format_version": FORMAT_VERSION,
            **self.info,
            "model_fingerprint": self.model_fingerprint,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "bucket_cap_mb": self.bucket_cap_mb,
            "exchange": exchange_of(self.bucket_cap_mb),
            "host_workers": self.host_workers,
            "compressors": self.compressors,
            "predicted_ms": self.predicted_ms,
            "search": self.search,
        }
        if self.levels:
            assert self.adaptive is not None
            out["adaptive"] = self.adaptive.to_dict()
            out["levels"] = [level.to_dict() for level in self.levels]
        else:
            out["tensors"] = [entry.to_dict() for entry in self.entries]
        return out

    def digest(self) -> str:
        """sha256 of what decides execution (not provenance or predictions)."""
        essential: dict = {"fingerprint": self.model_fingerprint, "world": self.world_size,
                           "nodes": self.nodes, "per_node": self.ranks_per_node,
                           "cap": self.bucket_cap_mb,
                           "tensors": [e.to_dict() for e in self.entries]}
        if self.levels:
            assert self.adaptive is not None
            essential["adaptive"] = self.adaptive.to_dict()
            essential["levels"] = [[e.to_dict() for e in level.entries] for level in self.levels]
        return hashlib.sha256(json.dumps(essential, sort_keys=True).encode()).hexdigest()

    def save(self, path) -> Path:
        write_text_atomic(path, dump_yaml(self.to_dict(), sort_keys=False, width=100))
        return Path(path)
