"""The plan file: schema, save and load with full validation.

::

    format_version: 1
    model_fingerprint: 942e1f...          # sha256 over parameter names, shapes, dtypes
    world_size: 2
    nodes: 1
    ranks_per_node: 2
    bucket_cap_mb: 25.0                   # pass it to DistributedDataParallel (0: a bucket per tensor)
    exchange: ddp-buckets                 # or per-tensor (bucket_cap_mb 0): said for readers
    host_workers: 2                       # host-offload workers per rank (apply_plan's default)
    compressors: [topk:ratio=0.01]        # specs the entries use
    predicted_ms: {plan: 61.2, baselines: {fp32 DDP: 78.4, ...}}
    search: {algorithm: ..., time_ms: ..., lower_bound_ms: ..., gap: ..., exact: ...}
    objective: {name: effective, min_fidelity: 0.75}   # or time
    fidelity: {plan: 0.93, baselines: {...}, effective_ms: {...}}   # where measured
    tensors:                              # one entry per parameter
      - {name: fc.weight, action: compress, compressor: topk:ratio=0.01,
         place: device, collective: allgather, group: 0}
      - {name: fc.bias, action: none, compressor: null, place: device,
         collective: allreduce, group: 1}

Tensors with the same ``group`` are concatenated and exchanged once; they
must share their strategy. An entry's ``collective`` names its collective scheme
(:mod:`bytecomp.comm.schemes`; :attr:`Option.scheme` in Python). Files are read with a safe YAML loader only (no anchors or
aliases: :func:`bytecomp.files.load_yaml`), and a
bad one is reported with its path, the field and the reason.

An *adaptive* plan (``bytecomp plan --adaptive FAMILY``) holds, instead of
``tensors``, a ladder of ``levels`` from mild to aggressive, each a complete
set of entries, and the settings of the controller that moves between them
while training (:mod:`bytecomp.runtime.controller`)::

    adaptive: {family: topk, threshold: 0.75, window: 10, tolerance: 0.03,
               explore_every: 200, start: 1}
    levels:
      - {setting: none, predicted_ms: 41.0, fidelity: 1.0, gain: 1.0, tensors: [...]}
      - {setting: topk:ratio=0.1, predicted_ms: 33.2, fidelity: 0.93, gain: 0.95,
         tensors: [...]}
      - ...

Every level names the same tensors and shares the plan's bucket cap (DDP's
buckets are fixed when it is built). The compressed entries of every level
have error feedback (the controller measures the gain on the compensated
gradient, as GraVAC), except fp16 and bf16, whose gain is taken as 1.

This module is the vocabulary the planner and the executor share (strategies as
:class:`Option`, the model fingerprint, the host pool size), so that a
training job that imports :mod:`bytecomp.runtime` loads no planner code.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from bytecomp.comm.schemes import SCHEMES, supported_schemes, uncompressed_schemes
from bytecomp.compress import canonical, from_spec, ladder_families
from bytecomp.errors import BytecompError
from bytecomp.files import control_character, dump_yaml, read_yaml_file, write_text_atomic

FORMAT_VERSION = 1
ACTIONS = ("none", "compress")
PLACES = ("device", "host")
UNCOMPRESSED = "none"  # the spec of an uncompressed (fp32) strategy
# Host-offload workers per rank: the executor's pool (``apply_plan(host_workers=...)``) and
# the planner's model of it, which must agree. A plan for a cluster config that gives a
# node's cores records that node's cores shared by its ranks instead (``Plan.host_workers``).
HOST_WORKERS = 2
MAX_HOST_WORKERS = 1024  # a rank's pool: a thread each
MAX_RANKS = 1 << 20
MAX_BUCKET_CAP_MB = 1e6
MAX_PREDICTED_MS = 1e9  # a level's predicted step time
OBJECTIVES = ("effective", "time")  # what a search minimizes (bytecomp.search.problem)
PLAN_OBJECTIVES = (*OBJECTIVES, "adaptive")  # objective.name in a plan file
MAX_STEPS_FACTOR = 10.0  # a measured steps factor's cap (bytecomp.profiler.probe.MAX_FACTOR)
# An adaptive plan's step counts: a window (and an agreement interval) longer than a long
# training run never decides; explore_every up to "never" (bytecomp.search.verify.NEVER).
MAX_WINDOW = 100_000
MAX_EXPLORE_EVERY = 10**9
# A verified plan's record of its finalists' training (bytecomp.search.verify): its steps
# (bytecomp.search.verify.MAX_STEPS) and seconds, the finalists' sources.
MAX_VERIFY_STEPS = 100_000
MAX_VERIFY_SECONDS = 1e7  # about four months
FINALIST_SOURCES = ("search", "baseline", "mix")
VERIFY_BATCHES = ("validation", "held-out training batches", "none")  # "none": none trained
# why the finalists' training stopped: fp32 DDP's loss flattened, the clock, or the count
# (forced, or all the budget afforded)
STOPPED_FLAT, STOPPED_BUDGET, STOPPED_STEPS = "flattened", "budget", "steps"
VERIFY_STOPS = (STOPPED_FLAT, STOPPED_BUDGET, STOPPED_STEPS)
# the kinds of plan whose model error a verified plan records (bytecomp.search.verify.
# kind_of): the search's plans (bytecomp's executor) and the hand-picked baselines (DDP and
# PyTorch's hooks); the error, measured over predicted ms per step, up to MAX_MODEL_ERROR
MODEL_KINDS = ("searched", "hand-picked")
MAX_MODEL_ERROR = 1000.0
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


ADAPTIVE_DEFAULTS = {"threshold": 0.75, "window": 10, "tolerance": 0.03, "explore_every": 200,
                     "timing": "measured", "start": 0, "agree_every": 1, "trial": [],
                     "trial_steps": 0, "trial_warmup": 0}
MAX_TRIAL_STEPS = 1_000_000
FINALISTS = "finalists"  # the family of a verified plan's levels (bytecomp.search.verify)
TIMINGS = ("measured", "predicted")


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
    threshold: float = 0.75
    window: int = 10
    tolerance: float = 0.03
    explore_every: int = 200
    timing: str = "measured"
    start: int = 0
    agree_every: int = 1
    trial: tuple[int, ...] = ()
    trial_steps: int = 0
    trial_warmup: int = 0

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


# -- loading and validation -------------------------------------------------------------


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, reason: str):
        raise BytecompError(f"{self.path}: {where}: {reason}")

    def field(self, data: dict, key: str, kinds, where: str = ""):
        label = f"{where}{key}"
        if key not in data:
            self.fail(label, "missing")
        value = data[key]
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            self.fail(label, f"must be {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            self.fail(label, f"must be {_kind_names(kinds)}, got {type(value).__name__}")
        return value


def _kind_names(kinds) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _printable(reader: _Reader, where: str, name: str) -> None:
    control = control_character(name)
    if control:
        reader.fail(where, f"holds the control character {control} (a name is printed: no "
                           f"escape sequences)")


def _entry(reader: _Reader, index: int, data, within: str = "tensors") -> PlanEntry:
    where = f"{within}[{index}]."
    if not isinstance(data, dict):
        reader.fail(f"{within}[{index}]", "must be a mapping")
    name = reader.field(data, "name", str, where)
    _printable(reader, f"{where}name", name)
    action = reader.field(data, "action", str, where)
    if action not in ACTIONS:
        reader.fail(f"{where}action", f"{action!r} is not one of {', '.join(ACTIONS)}")
    compressor = reader.field(data, "compressor", (str, type(None)), where)
    place = reader.field(data, "place", str, where)
    if place not in PLACES:
        reader.fail(f"{where}place", f"{place!r} is not one of {', '.join(PLACES)}")
    collective = reader.field(data, "collective", str, where)
    if collective not in SCHEMES:
        reader.fail(f"{where}collective", f"{collective!r} is not one of {', '.join(SCHEMES)}")
    group = reader.field(data, "group", int, where)
    if group < 0:
        reader.fail(f"{where}group", "must not be negative")
    if action == "compress":
        if compressor is None:
            reader.fail(f"{where}compressor", "needed when action is compress")
        try:
            compressor = canonical(compressor)
        except BytecompError as error:
            reader.fail(f"{where}compressor", str(error))
        if compressor == UNCOMPRESSED:
            reader.fail(f"{where}compressor", "none compresses nothing: an uncompressed "
                                              "tensor has action none and compressor null")
        if collective not in supported_schemes(from_spec(compressor)):
            reader.fail(f"{where}collective", f"{compressor} cannot run on {collective}")
    else:
        if compressor is not None:
            reader.fail(f"{where}compressor", "must be null when action is none")
        if collective not in uncompressed_schemes():
            reader.fail(f"{where}collective", f"uncompressed tensors use "
                                              f"{', '.join(uncompressed_schemes())}")
    return PlanEntry(name, action, compressor, place, collective, group)


def plan_from_dict(data, path: str = "<plan>") -> Plan:
    """Validate a parsed plan (see the module docstring for the schema)."""
    reader = _Reader(path)
    if not isinstance(data, dict):
        reader.fail("top level", "must be a YAML mapping")
    version = reader.field(data, "format_version", int)
    if version != FORMAT_VERSION:
        reader.fail("format_version", f"{version} is not supported (this bytecomp reads "
                                      f"{FORMAT_VERSION})")
    model_fingerprint = reader.field(data, "model_fingerprint", str)
    world = reader.field(data, "world_size", int)
    nodes = reader.field(data, "nodes", int)
    per_node = reader.field(data, "ranks_per_node", int)
    for key, value in (("world_size", world), ("nodes", nodes), ("ranks_per_node", per_node)):
        if not 1 <= value <= MAX_RANKS:
            reader.fail(key, f"must be between 1 and {MAX_RANKS:,}")
    if nodes * per_node != world:
        reader.fail("world_size", f"{world} is not nodes x ranks_per_node = {nodes * per_node}")
    cap = reader.field(data, "bucket_cap_mb", (int, float))
    if not 0 <= cap <= MAX_BUCKET_CAP_MB:  # also false for NaN
        reader.fail("bucket_cap_mb", f"must be a number of MB from 0 (one bucket per tensor) "
                                     f"to {MAX_BUCKET_CAP_MB:g}, got {cap}")
    if "exchange" in data and data["exchange"] != exchange_of(cap):
        reader.fail("exchange", f"must be {exchange_of(cap)} with bucket_cap_mb {cap:g} (one of "
                                f"{', '.join(EXCHANGES)}; per-tensor is bucket_cap_mb 0)")
    workers = data.get("host_workers", HOST_WORKERS)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_HOST_WORKERS:
        reader.fail("host_workers", f"must be an integer from 1 to {MAX_HOST_WORKERS}")
    levels, adaptive = None, None
    if "levels" in data:
        if "tensors" in data:
            reader.fail("tensors", "an adaptive plan holds its entries under levels, not here")
        levels, adaptive = _ladder(reader, data)
        entries = levels[0].entries
    else:
        if "adaptive" in data:
            reader.fail("adaptive", "an adaptive plan needs its levels")
        entries = _entries(reader, reader.field(data, "tensors", list), "tensors")
    if cap == 0:
        for where, level in ([("tensors", entries)] if levels is None else
                             [(f"levels[{i}].tensors", lv.entries) for i, lv in enumerate(levels)]):
            _check_per_tensor(reader, level, where)
    info_keys = ("bytecomp_version", "created", "profile", "cluster", "objective", "fidelity",
                 "finalists", "verification")
    info = {key: data[key] for key in info_keys if key in data}
    for key in ("objective", "fidelity", "verification"):
        if key in info and not isinstance(info[key], dict):
            reader.fail(key, "must be a mapping")
    if "finalists" in info:
        chosen = _check_finalists(reader, info["finalists"])
        if levels is not None and adaptive is not None and adaptive.family == FINALISTS:
            names = [f["name"] for f in info["finalists"]]
            claimed: dict[str, int] = {}
            for number, rung in enumerate(levels):
                if rung.setting not in names:
                    reader.fail(f"levels[{number}].setting", f"{rung.setting!r} is not one of "
                                                             f"the finalists ({', '.join(names)})")
                if rung.setting in claimed:
                    reader.fail(f"levels[{number}].setting", f"{rung.setting!r} is also "
                                f"levels[{claimed[rung.setting]}]: each finalist is one level")
                claimed[rung.setting] = number
            if levels[adaptive.start].setting != chosen:
                reader.fail("adaptive.start", f"level {adaptive.start} is "
                            f"{levels[adaptive.start].setting!r}, but the chosen finalist is "
                            f"{chosen!r} (a verified plan starts at the chosen finalist)")
        _check_verification(reader, info.get("verification"), chosen)
    elif "verification" in info:
        reader.fail("verification", "records the finalists' training, but the plan has no "
                                    "finalists")
    _check_objective(reader, info.get("objective"))
    _check_fidelity(reader, info.get("fidelity"))
    predicted = data.get("predicted_ms", {})
    search = data.get("search", {})
    for key, value in (("predicted_ms", predicted), ("search", search)):
        if not isinstance(value, dict):
            reader.fail(key, "must be a mapping")
    _check_numbers(reader, predicted, "predicted_ms", MAX_PREDICTED_MS)
    for key, kinds in (("plan", (int, float, type(None))), ("baselines", dict),
                       ("levels", list)):
        if key in predicted:
            reader.field(predicted, key, kinds, "predicted_ms.")
    for name, value in predicted.get("baselines", {}).items():
        if not (value is None or _number(value, 0.0, MAX_PREDICTED_MS)):
            reader.fail(f"predicted_ms.baselines.{name}", f"must be a number from 0 to "
                                                          f"{MAX_PREDICTED_MS:g} or null, got "
                                                          f"{value!r}")
    return Plan(model_fingerprint, world, nodes, per_node, float(cap), entries, predicted, search,
                info, levels=levels, adaptive=adaptive, host_workers=workers)


def _number(value, low: float, high: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and \
        low <= value <= high  # also false for NaN


def _check_numbers(reader: _Reader, value, where: str, high: float) -> None:
    """Every number under ``value`` (through mappings and lists) from 0 to ``high``, or null;
    nothing else but strings as keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_numbers(reader, item, f"{where}.{key}", high)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_numbers(reader, item, f"{where}[{index}]", high)
    elif value is not None and not (_number(value, 0.0, high) and math.isfinite(value)):
        reader.fail(where, f"must be a finite number from 0 to {high:g} or null, got {value!r}")


def _check_objective(reader: _Reader, objective: dict | None) -> None:
    """``objective``: what the plan was searched for (informative, but shown and compared,
    so checked as everything else)."""
    if objective is None:
        return
    name = reader.field(objective, "name", str, "objective.")
    if name not in PLAN_OBJECTIVES:
        reader.fail("objective.name", f"{name!r} is not one of {', '.join(PLAN_OBJECTIVES)}")
    for key in ("min_fidelity", "threshold"):
        value = objective.get(key)
        if value is not None and not _number(value, 0.0, 1.0):
            reader.fail(f"objective.{key}", f"must be a number from 0 to 1, got {value!r}")


def _check_fidelity(reader: _Reader, fidelity: dict | None) -> None:
    """``fidelity``: gains from 0 to 1 (the plan's and the baselines'), and effective times."""
    if fidelity is None:
        return
    for key in ("plan", "baselines"):
        _check_numbers(reader, fidelity.get(key), f"fidelity.{key}", 1.0)
    # time / fidelity: unbounded above as the fidelity nears 0 (null where it is 0)
    _check_numbers(reader, fidelity.get("effective_ms"), "fidelity.effective_ms", math.inf)


def _check_finalists(reader: _Reader, finalists) -> str:
    """The finalists a verified plan records (bytecomp.search.finalists): what they are,
    what was predicted and measured, and which was chosen (one, whose name is returned).
    Each name once; ``value`` is ``predicted_ms`` x ``steps_factor`` (1 where untrained),
    as rounded in the file."""
    if not isinstance(finalists, list) or not finalists:
        reader.fail("finalists", "must be a non-empty list")
    chosen: list[str] = []
    seen: dict[str, int] = {}
    for index, finalist in enumerate(finalists):
        where = f"finalists[{index}]."
        if not isinstance(finalist, dict):
            reader.fail(f"finalists[{index}]", "must be a mapping")
        name = reader.field(finalist, "name", str, where)
        _printable(reader, f"{where}name", name)
        if name in seen:
            reader.fail(f"{where}name", f"{name!r} is also finalists[{seen[name]}]")
        seen[name] = index
        source = reader.field(finalist, "source", str, where)
        if source not in FINALIST_SOURCES:
            reader.fail(f"{where}source", f"{source!r} is not one of "
                                          f"{', '.join(FINALIST_SOURCES)}")
        for key, high, optional in (("bucket_cap_mb", MAX_BUCKET_CAP_MB, False),
                                    ("predicted_ms", MAX_PREDICTED_MS, False),
                                    ("fidelity", 1.0, True), ("steps_factor", MAX_STEPS_FACTOR, True),
                                    ("value", MAX_PREDICTED_MS * MAX_STEPS_FACTOR, True)):
            value = finalist.get(key)
            if not (optional and value is None) and not _number(value, 0.0, high):
                reader.fail(f"{where}{key}", f"must be a number from 0 to {high:g}"
                                             f"{' or null' if optional else ''}, got {value!r}")
        value, predicted = finalist.get("value"), finalist["predicted_ms"]
        factor = finalist.get("steps_factor")
        _check_factor_range(reader, finalist, factor, where)
        expected = predicted * (1.0 if factor is None else factor)
        if value is not None and abs(value - expected) > 1e-3 * (1 + expected):
            reader.fail(f"{where}value", f"{value!r} is not predicted_ms x steps_factor "
                                         f"({expected:.4f})")
        if reader.field(finalist, "chosen", bool, where):
            chosen.append(name)
    if len(chosen) != 1:
        reader.fail("finalists", f"exactly one must be chosen, {len(chosen)} are")
    return chosen[0]


def _check_factor_range(reader: _Reader, finalist: dict, factor, where: str) -> None:
    """A finalist's optional ``steps_factor_low`` and ``steps_factor_high``: its factor's
    range within fp32's loss noise floor (bytecomp.profiler.factors), both or neither,
    numbers from 0 to the cap around its ``steps_factor``."""
    low, high = finalist.get("steps_factor_low"), finalist.get("steps_factor_high")
    if low is None and high is None:
        return
    for key, bound in (("steps_factor_low", low), ("steps_factor_high", high)):
        if not _number(bound, 0.0, MAX_STEPS_FACTOR):
            reader.fail(f"{where}{key}", f"must be a number from 0 to {MAX_STEPS_FACTOR:g}, "
                                         f"given with the other bound, got {bound!r}")
    # rounded to 4 places in the file, as the factor is
    assert low is not None and high is not None  # _number held
    if factor is None or not low - 1e-4 <= factor <= high + 1e-4:
        reader.fail(f"{where}steps_factor_low", f"the range {low!r} to {high!r} must hold the "
                                                f"steps_factor ({factor!r})")


def _check_verification(reader: _Reader, verification: dict | None, chosen: str) -> None:
    """``verification``: the finalists' training (bytecomp.search.verify): its steps
    (0: nothing was trained), batches, seconds, fp32 DDP's improvement, why it stopped
    (optional), the chosen finalist's predicted fidelity where it is below the floor
    (optional), and the chosen finalist, which must be the one the finalists mark
    chosen."""
    if verification is None:
        return
    where = "verification."
    steps = reader.field(verification, "steps", int, where)
    if not 0 <= steps <= MAX_VERIFY_STEPS:
        reader.fail(f"{where}steps", f"must be an integer from 0 to {MAX_VERIFY_STEPS:,}, "
                                     f"got {steps}")
    batches = reader.field(verification, "batches", str, where)
    if batches not in VERIFY_BATCHES:
        reader.fail(f"{where}batches", f"{batches!r} is not one of {', '.join(VERIFY_BATCHES)}")
    for key, high in (("seconds", MAX_VERIFY_SECONDS), ("fp32_improvement", math.inf),
                      ("fp32_last_quarter", math.inf)):
        value = verification.get(key, 0.0)
        if not (_number(value, 0.0, high) and math.isfinite(value)):
            reader.fail(f"{where}{key}", f"must be a finite number from 0 to {high:g}, got "
                                         f"{value!r}" if high < math.inf else
                        f"must be a finite number, at least 0, got {value!r}")
    floor = verification.get("loss_floor")  # optional: fp32's loss noise floor
    if floor is not None and not (_number(floor, 0.0, math.inf) and math.isfinite(floor)):
        reader.fail(f"{where}loss_floor", f"must be a finite number, at least 0, or absent, "
                                          f"got {floor!r}")
    errors = verification.get("model_error")  # optional: measured / predicted, by kind
    if errors is not None and not (isinstance(errors, dict) and errors and all(
            kind in MODEL_KINDS and _number(ratio, 0.0, MAX_MODEL_ERROR) and ratio > 0
            for kind, ratio in errors.items())):
        reader.fail(f"{where}model_error", f"must map kinds of plan ({', '.join(MODEL_KINDS)}) "
                                           f"to numbers above 0, at most {MAX_MODEL_ERROR:g}, "
                                           f"got {errors!r}")
    stopped = verification.get("stopped_by", STOPPED_STEPS)
    if stopped not in VERIFY_STOPS:
        reader.fail(f"{where}stopped_by", f"{stopped!r} is not one of {', '.join(VERIFY_STOPS)}")
    below = verification.get("below_min_fidelity")
    if below is not None and not (isinstance(below, dict) and all(
            _number(below.get(key), 0.0, 1.0) for key in ("fidelity", "min_fidelity"))):
        reader.fail(f"{where}below_min_fidelity", f"must hold a fidelity and a min_fidelity "
                                                  f"from 0 to 1, got {below!r}")
    named = reader.field(verification, "chosen", str, where)
    if named != chosen:
        reader.fail(f"{where}chosen", f"{named!r}, but the finalist marked chosen is {chosen!r}")
    reader.field(verification, "reason", str, where)


def _check_per_tensor(reader: _Reader, entries: list[PlanEntry], where: str) -> None:
    """One bucket per tensor (bucket_cap_mb 0) merges no tensors: a group each."""
    first: dict[int, int] = {}
    for index, entry in enumerate(entries):
        if entry.group in first:
            reader.fail(f"{where}[{index}].group", f"group {entry.group} also holds "
                        f"{where}[{first[entry.group]}], but bucket_cap_mb 0 (one bucket per "
                        f"tensor) merges no tensors")
        first[entry.group] = index


def _entries(reader: _Reader, raw_entries: list, where: str) -> list[PlanEntry]:
    """Validated entries of ``where`` (the top-level tensors, or a level's)."""
    if not raw_entries:
        reader.fail(where, "is empty")
    entries = [_entry(reader, i, entry, where) for i, entry in enumerate(raw_entries)]
    seen: dict[str, int] = {}
    strategies: dict[int, tuple] = {}
    for index, entry in enumerate(entries):
        if entry.name in seen:
            reader.fail(f"{where}[{index}].name",
                        f"{entry.name!r} also at {where}[{seen[entry.name]}]")
        seen[entry.name] = index
        strategy = (entry.action, entry.compressor, entry.place, entry.scheme)
        if strategies.setdefault(entry.group, strategy) != strategy:
            reader.fail(f"{where}[{index}].group", f"group {entry.group} mixes strategies")
    return entries


def _adaptive(reader: _Reader, data) -> Adaptive:
    if not isinstance(data, dict):
        reader.fail("adaptive", "must be a mapping")
    family = reader.field(data, "family", str, "adaptive.")
    families = (*ladder_families(), FINALISTS)
    if family not in families:
        reader.fail("adaptive.family", f"{family!r} is not one of {', '.join(families)}")
    values = {key: data.get(key, default) for key, default in ADAPTIVE_DEFAULTS.items()}
    for key, most in (("window", MAX_WINDOW), ("explore_every", MAX_EXPLORE_EVERY),
                      ("agree_every", MAX_WINDOW)):
        if isinstance(values[key], bool) or not isinstance(values[key], int) or \
                not 1 <= values[key] <= most:
            reader.fail(f"adaptive.{key}", f"must be an integer from 1 to {most:,} (steps), "
                                           f"got {values[key]!r}")
    for key, low, high in (("threshold", 0.0, 1.0), ("tolerance", 0.0, 1.0)):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not low <= value <= high or value != value:
            reader.fail(f"adaptive.{key}", f"must be a number from {low:g} to {high:g}, "
                                           f"got {value!r}")
    if values["timing"] not in TIMINGS:
        reader.fail("adaptive.timing", f"{values['timing']!r} is not one of {', '.join(TIMINGS)}")
    unknown = sorted(set(data) - {"family", *ADAPTIVE_DEFAULTS})
    if unknown:
        reader.fail(f"adaptive.{unknown[0]}", f"unknown setting; the settings are family, "
                                              f"{', '.join(ADAPTIVE_DEFAULTS)}")
    if isinstance(values["start"], bool) or not isinstance(values["start"], int) or \
            values["start"] < 0:
        reader.fail("adaptive.start", f"must be a level number (0 or more), got "
                                      f"{values['start']!r}")
    trial = values["trial"]
    if not isinstance(trial, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                          for t in trial) or len(set(trial)) != len(trial) \
            or len(trial) == 1:
        reader.fail("adaptive.trial", f"must be a list of two or more distinct level numbers "
                                      f"(or empty), got {trial!r}")
    for key, least in (("trial_steps", len(trial)), ("trial_warmup", 0)):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or \
                not least <= value <= MAX_TRIAL_STEPS:
            reader.fail(f"adaptive.{key}", f"must be an integer from {least} to "
                                           f"{MAX_TRIAL_STEPS:,}, got {value!r}")
    return Adaptive(family, float(values["threshold"]), int(values["window"]),
                    float(values["tolerance"]), int(values["explore_every"]),
                    str(values["timing"]), int(values["start"]), int(values["agree_every"]),
                    tuple(trial), int(values["trial_steps"]), int(values["trial_warmup"]))


def _metered(entry: PlanEntry) -> bool:
    """Whether the controller can measure this entry's gain (error feedback), or need
    not (uncompressed, or a compressor it takes as keeping the whole gradient: a
    16-bit cast)."""
    if entry.compressor is None:
        return True
    compressor = from_spec(entry.compressor)
    return compressor.error_feedback or compressor.metered_without_ef


def _ladder(reader: _Reader, data: dict) -> tuple[list[Level], Adaptive]:
    adaptive = _adaptive(reader, data.get("adaptive"))
    raw_levels = reader.field(data, "levels", list)
    if len(raw_levels) < 2:
        reader.fail("levels", "an adaptive plan needs at least two levels")
    levels: list[Level] = []
    for number, raw in enumerate(raw_levels):
        where = f"levels[{number}]"
        if not isinstance(raw, dict):
            reader.fail(where, "must be a mapping")
        setting = reader.field(raw, "setting", str, f"{where}.")
        entries = _entries(reader, reader.field(raw, "tensors", list, f"{where}."),
                           f"{where}.tensors")
        for index, entry in enumerate(entries):
            if adaptive.family != FINALISTS and not _metered(entry):
                reader.fail(f"{where}.tensors[{index}].compressor",
                            f"{entry.compressor} has no error feedback: the controller "
                            f"measures the gain on the compensated gradient (drop ef=false)")
        predicted, fidelity, gain = raw.get("predicted_ms"), raw.get("fidelity"), \
            raw.get("gain")
        factor = raw.get("steps_factor")
        for key, value, high in (("predicted_ms", predicted, MAX_PREDICTED_MS),
                                 ("fidelity", fidelity, 1.0), ("gain", gain, 1.0),
                                 ("steps_factor", factor, MAX_STEPS_FACTOR)):
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, (int, float)) or
                                      not 0 <= value <= high):  # also false for NaN
                reader.fail(f"{where}.{key}", f"must be a number from 0 to {high:g} or null, "
                                              f"got {value!r}")
        if adaptive.family != FINALISTS:
            _check_setting(reader, where, setting, entries)
        if levels and {e.name for e in entries} != {e.name for e in levels[0].entries}:
            reader.fail(f"{where}.tensors", "must name the same tensors as levels[0]")
        levels.append(Level(setting, entries, predicted, fidelity, gain, factor))
    if adaptive.start >= len(levels):
        reader.fail("adaptive.start", f"level {adaptive.start} does not exist (levels 0 to "
                                      f"{len(levels) - 1})")
    if any(level >= len(levels) for level in adaptive.trial):
        reader.fail("adaptive.trial", f"names a level that does not exist (levels 0 to "
                                      f"{len(levels) - 1})")
    return levels, adaptive


def _check_setting(reader: _Reader, where: str, setting: str, entries: list[PlanEntry]) -> None:
    """A ladder level's ``setting``: the compressor specs it was searched with, joined by
    ", " (or ``none``); the level's entries compress with those or not at all (the
    search may leave a tensor uncompressed at any setting)."""
    specs = set()
    for part in setting.split(", "):
        try:
            specs.add(canonical(part.strip()))
        except BytecompError as error:
            reader.fail(f"{where}.setting", f"{setting!r} is not compressor specs joined by "
                                            f"', ' ({error})")
    used = sorted({e.compressor for e in entries if e.compressor is not None} - specs)
    if used:
        reader.fail(f"{where}.setting", f"{setting!r} does not name {used[0]}, which the "
                                        f"level's entries use")


def load_plan(path) -> Plan:
    """Read and validate a plan file (``path``: a str or an os.PathLike)."""
    if not isinstance(path, (str, os.PathLike)) or (isinstance(path, str) and not path.strip()):
        raise BytecompError(f"load_plan takes the path of a plan file (a str or a Path), got "
                            f"{type(path).__name__} {path!r}"[:300])
    path = Path(path)
    plan = plan_from_dict(read_yaml_file(path, "plan file"), str(path))
    plan.path = path
    return plan


def plan_for_model(model, choose, world_size: int, nodes: int = 1,
                   bucket_cap_mb: float = 25.0, predicted_ms: dict | None = None,
                   ready_order: list[str] | None = None) -> Plan:
    """A plan that gives each parameter ``choose(name, param) -> Option``, grouped as
    the planner groups: DDP's buckets at ``bucket_cap_mb`` and, inside a bucket, one
    group per option. Buckets follow ``ready_order`` (parameter names in the order
    their gradients become ready, e.g. a profile's tensors.csv) or else the reverse
    parameter order, DDP's own first guess. Used for baselines ("this compressor on
    every tensor") and tests.

    >>> plan = plan_for_model(model, lambda n, p: Option("topk:ratio=0.01", "device",
    ...                       "allgather"), world_size=4)
    """
    from bytecomp.buckets import ddp_buckets

    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if ready_order is not None:
        named = dict(params)
        ready = [(name, named[name]) for name in ready_order if name in named]
    else:
        ready = list(reversed(params))
    buckets = ddp_buckets([p.numel() * p.element_size() for _, p in ready],
                          [str(p.dtype) for _, p in ready], bucket_cap_mb)
    entries: dict[str, PlanEntry] = {}
    group = 0
    for members in buckets:
        by_option: dict[Option, list[str]] = {}
        for position in members:
            name, param = ready[position]
            by_option.setdefault(choose(name, param), []).append(name)
        for option, names in by_option.items():
            canonical_option = replace(option, spec=canonical(option.spec))
            for name in names:
                entries[name] = PlanEntry.of(name, canonical_option, group)
            group += 1
    ordered = [entries[name] for name, _ in ready]
    plan = Plan(fingerprint(model), world_size, nodes, world_size // nodes, float(bucket_cap_mb),
                ordered, predicted_ms or {}, {"algorithm": "plan_for_model"})
    return plan_from_dict(plan.to_dict(), "<plan_for_model>")  # validated like a file


def ladder_for_model(model, chooses: list, world_size: int, adaptive: Adaptive, nodes: int = 1,
                     bucket_cap_mb: float = 25.0, predicted_ms: list | None = None,
                     ready_order: list[str] | None = None) -> Plan:
    """An adaptive plan whose level ``i`` gives each parameter ``chooses[i](name, param)``,
    grouped as :func:`plan_for_model` groups (used by tests and benches).

    >>> plan = ladder_for_model(model, [lambda n, p: Option(), lambda n, p: Option(
    ...     "topk:ratio=0.01", "device", "allgather")], 2, Adaptive("topk"))
    """
    levels: list[Level] = []
    for number, choose in enumerate(chooses):
        level = plan_for_model(model, choose, world_size, nodes, bucket_cap_mb,
                               ready_order=ready_order)
        levels.append(Level(", ".join(level.compressors) or UNCOMPRESSED, level.entries,
                            predicted_ms[number] if predicted_ms else None))
    plan = Plan(fingerprint(model), world_size, nodes,
                world_size // nodes, float(bucket_cap_mb), levels[0].entries, {},
                {"algorithm": "ladder_for_model"}, levels=levels, adaptive=adaptive)
    return plan_from_dict(plan.to_dict(), "<ladder_for_model>")
