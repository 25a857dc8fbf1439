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
(:mod:`bytecomp.comm.schemes`; :attr:`bytecomp.plan_types.Option.scheme` in Python). Files are read with a safe YAML loader only (no anchors or
aliases: :func:`bytecomp.safe_yaml.load_yaml`), and a
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

The plan in memory is :mod:`bytecomp.plan_types`; the record of how it was chosen
(objective, fidelity, finalists, verification) is checked by :mod:`bytecomp.plan_record`.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path

from bytecomp.comm.schemes import SCHEMES, supported_schemes, uncompressed_schemes
from bytecomp.compress import canonical, from_spec, ladder_families
from bytecomp.errors import BytecompError
from bytecomp.plan_record import (
    check_fidelity,
    check_finalists,
    check_numbers,
    check_objective,
    check_verification,
)
from bytecomp.plan_types import (
    EXCHANGES,
    FORMAT_VERSION,
    HOST_WORKERS,
    UNCOMPRESSED,
    Adaptive,
    Level,
    Option,
    Plan,
    PlanEntry,
    exchange_of,
    fingerprint,
)
from bytecomp.safe_yaml import read_yaml_file
from bytecomp.schema import (
    COUNT,
    MAX_BUCKET_CAP_MB,
    MAX_PREDICTED_MS,
    MAX_STEPS_FACTOR,
    Number,
    OneOf,
    Reader,
    check_of,
)

ACTIONS = ("none", "compress")
PLACES = ("device", "host")
MAX_HOST_WORKERS = 1024  # a rank's pool: a thread each
# An adaptive section's settings and their defaults, as Adaptive declares them (in its
# order; a tuple as the list the file holds)
ADAPTIVE_DEFAULTS = {item.name: list(item.default) if isinstance(item.default, tuple)
                     else item.default for item in fields(Adaptive) if item.name != "family"}
# a level's numbers, each null where not predicted or measured
LEVEL_NUMBERS = {"predicted_ms": Number(0.0, MAX_PREDICTED_MS, optional=True),
                 "fidelity": Number(0.0, 1.0, optional=True),
                 "gain": Number(0.0, 1.0, optional=True),
                 "steps_factor": Number(0.0, MAX_STEPS_FACTOR, optional=True)}
FINALISTS = "finalists"  # the family of a verified plan's levels (bytecomp.search.verify)


def _entry(reader: Reader, index: int, data, within: str = "tensors") -> PlanEntry:
    where = f"{within}[{index}]."
    if not isinstance(data, dict):
        reader.fail(f"{within}[{index}]", "must be a mapping")
    name = reader.field(data, "name", str, where)
    reader.printable(f"{where}name", name)
    action = reader.declared(data, "action", str, OneOf(ACTIONS), where)
    compressor = reader.field(data, "compressor", (str, type(None)), where)
    place = reader.declared(data, "place", str, OneOf(PLACES), where)
    collective = reader.declared(data, "collective", str, OneOf(tuple(SCHEMES)), where)
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
    reader = Reader(path)
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
        reader.check(key, value, COUNT)
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
        chosen = check_finalists(reader, info["finalists"])
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
        check_verification(reader, info.get("verification"), chosen)
    elif "verification" in info:
        reader.fail("verification", "records the finalists' training, but the plan has no "
                                    "finalists")
    check_objective(reader, info.get("objective"))
    check_fidelity(reader, info.get("fidelity"))
    predicted = data.get("predicted_ms", {})
    search = data.get("search", {})
    for key, value in (("predicted_ms", predicted), ("search", search)):
        if not isinstance(value, dict):
            reader.fail(key, "must be a mapping")
    check_numbers(reader, predicted, "predicted_ms", MAX_PREDICTED_MS)
    for key, kinds in (("plan", (int, float, type(None))), ("baselines", dict),
                       ("levels", list)):
        if key in predicted:
            reader.field(predicted, key, kinds, "predicted_ms.")
    for name, value in predicted.get("baselines", {}).items():
        reader.check(f"predicted_ms.baselines.{name}", value,
                     Number(0.0, MAX_PREDICTED_MS, optional=True))
    return Plan(model_fingerprint, world, nodes, per_node, float(cap), entries, predicted, search,
                info, levels=levels, adaptive=adaptive, host_workers=workers)


def _check_per_tensor(reader: Reader, entries: list[PlanEntry], where: str) -> None:
    """One bucket per tensor (bucket_cap_mb 0) merges no tensors: a group each."""
    first: dict[int, int] = {}
    for index, entry in enumerate(entries):
        if entry.group in first:
            reader.fail(f"{where}[{index}].group", f"group {entry.group} also holds "
                        f"{where}[{first[entry.group]}], but bucket_cap_mb 0 (one bucket per "
                        f"tensor) merges no tensors")
        first[entry.group] = index


def _entries(reader: Reader, raw_entries: list, where: str) -> list[PlanEntry]:
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


def _adaptive(reader: Reader, data) -> Adaptive:
    if not isinstance(data, dict):
        reader.fail("adaptive", "must be a mapping")
    family = reader.field(data, "family", str, "adaptive.")
    families = (*ladder_families(), FINALISTS)
    if family not in families:
        reader.fail("adaptive.family", f"{family!r} is not one of {', '.join(families)}")
    values = {key: data.get(key, default) for key, default in ADAPTIVE_DEFAULTS.items()}
    trial = values["trial"]
    for item in fields(Adaptive):  # the ranges and choices Adaptive declares
        check = item.metadata.get("check")
        if check is None or item.name in ("trial_steps", "trial_warmup"):
            continue
        problem = check.problem(values[item.name])
        if problem:
            reader.fail(f"adaptive.{item.name}", problem)
    unknown = sorted(set(data) - {"family", *ADAPTIVE_DEFAULTS})
    if unknown:
        reader.fail(f"adaptive.{unknown[0]}", f"unknown setting; the settings are family, "
                                              f"{', '.join(ADAPTIVE_DEFAULTS)}")
    if isinstance(values["start"], bool) or not isinstance(values["start"], int) or \
            values["start"] < 0:
        reader.fail("adaptive.start", f"must be a level number (0 or more), got "
                                      f"{values['start']!r}")
    if not isinstance(trial, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                          for t in trial) or len(set(trial)) != len(trial) \
            or len(trial) == 1:
        reader.fail("adaptive.trial", f"must be a list of two or more distinct level numbers "
                                      f"(or empty), got {trial!r}")
    # a trial times each of its levels at least once
    for key, check in (("trial_steps", replace(check_of(Adaptive, "trial_steps"),
                                               least=len(trial))),
                       ("trial_warmup", check_of(Adaptive, "trial_warmup"))):
        problem = check.problem(values[key])
        if problem:
            reader.fail(f"adaptive.{key}", problem)
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


def _ladder(reader: Reader, data: dict) -> tuple[list[Level], Adaptive]:
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
        for key, check in LEVEL_NUMBERS.items():
            reader.check(f"{where}.{key}", raw.get(key), check)
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


def _check_setting(reader: Reader, where: str, setting: str, entries: list[PlanEntry]) -> None:
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
