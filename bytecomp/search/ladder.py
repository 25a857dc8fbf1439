"""Adaptive plans: a ladder of per-tensor plans, one per setting of a compressor family.

``bytecomp plan --adaptive topk`` takes the settings of the family that the
profile timed (``bytecomp profile --ladder topk`` times GraVAC's ladder: ratio
0.1 halving down to 1e-4), from mild to aggressive. Level 0 is the mildest
plan without the family, and one of PyTorch's own hooks: fp16 allreduce of
every tensor (``fp16_compress_hook``) where that is predicted at least
``min_gain`` faster than fp32 DDP, fp32 DDP otherwise. The executor hands such
a level's buckets to that hook; a searched fp16 plan (gathered payloads, several
groups) would run through the executor's own exchange, which on small steps
costs more than the model charges (conv13: predicted 13% faster than fp32 DDP,
measured 8% slower). Each further level is the fastest plan
that compresses with that one setting (or not at all: Espresso's rule), searched
with the profile's timings at that setting. The iteration-time objective ranks
plans within a level: the gain is the controller's business while training,
measured on the real gradients of the day. Every level shares one bucket cap
(DDP's buckets are fixed when it is built): the cap the middle level's search
prefers. A level that plans the same as the one below is dropped.

Each level records its *gain* (the profile's gains composed, uncalibrated, at
the level of the gain the convergence probe measured while training: what the
executor will measure) and its *fidelity* (the same gains calibrated both
ways by the profile's convergence probe: a steps factor; see
:mod:`bytecomp.costs.gains`). The level with the best
predicted effective time (iteration time / fidelity) among those whose fidelity
keeps the threshold (level 0 if none does) is the plan's ``start``: training
starts there and adapts from the plan's best guess instead of paying for a
climb from the mildest level.

The ranks agree on their measurements every ``agree_every`` steps: unless
asked for a number, as many steps as make ``AGREE_MS`` of the start level's
predicted iteration, at most a window (one small allreduce costs 0.5-2 ms on
gloo here: on a 5 ms step, agreeing every step cost 15% of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bytecomp.compress import canonical, from_spec, ladder_place, ladder_specs
from bytecomp.compress.base import FP16_HOOK
from bytecomp.costs.clusters import Cluster
from bytecomp.costs.gains import FidelityModel, compose
from bytecomp.errors import BytecompError
from bytecomp.plan_types import NO_COMPRESSION, Adaptive, Level, Option, Plan
from bytecomp.profile_store import Profile
from bytecomp.search.baselines import hook_specs
from bytecomp.search.planner import Planner
from bytecomp.search.plans import to_plan
from bytecomp.search.result import SearchResult, fp32_ms
from bytecomp.search.settings import BaselineKind, SearchOptions, default_min_gain

AGREE_MS = 100.0  # agree at most about this often, in predicted iteration time


@dataclass
class LadderResult:
    """The levels' search results (level 0 first), their settings, and notes."""

    levels: list[SearchResult]
    settings: list[str]
    adaptive: Adaptive
    notes: list[str]
    gains: list[float | None]  # per level: uncalibrated (what the executor measures)
    fidelities: list[float | None]  # per level: calibrated by the probe, both ways


def profiled_settings(profile: Profile, family: str) -> tuple[list[str], list[str]]:
    """The family's settings the profile timed, mild to aggressive, and those of its
    default ladder it lacks."""
    ladder_specs(family)  # one line for a family without a ladder
    specs = {canonical(s) for s in profile.compressors["spec"]}
    places = {s: place for s in specs if (place := ladder_place(s)) and place[0] == family
              and from_spec(s).error_feedback}
    timed = sorted(places, key=lambda s: -places[s][1])
    missing = [s for s in ladder_specs(family) if s not in specs]
    return timed, missing


def plan_ladder(profile: Profile, cluster: Cluster | None, adaptive: Adaptive,
                options: SearchOptions | None = None,
                agree_every: int | None = None) -> LadderResult:
    """Search every level of ``adaptive.family``'s ladder (see the module docstring) with
    ``options`` (default: :data:`~bytecomp.search.settings.MIN_GAIN`'s margin for
    time): its caps are the middle level's candidates, its margin the fp16 level's over
    fp32 DDP, the rest as :meth:`Planner.search`'s for each search. ``agree_every``
    None: chosen from the start level's predicted time."""
    options = options or SearchOptions(min_gain=default_min_gain("time"))
    settings, missing = profiled_settings(profile, adaptive.family)
    if not settings:
        raise BytecompError(f"{profile.label}: the profile has no timings for any "
                            f"{adaptive.family} setting with error feedback; profile with "
                            f"--ladder {adaptive.family}")
    notes = []
    if missing:
        notes.append(f"no timings for {len(missing)} setting(s) of the default "
                     f"{adaptive.family} ladder ({', '.join(missing)}): those levels are "
                     f"left out (bytecomp profile --ladder {adaptive.family} times them)")

    def search(specs: list[str] | None, cap_choices: tuple[float, ...] | None) -> SearchResult:
        planner = Planner(profile, cluster, specs, strict=True, objective="time")
        return planner.search(replace(options, caps=cap_choices, min_gain=0.0))

    middle = settings[len(settings) // 2]
    cap = search([middle], options.caps).cap_mb
    fp16 = next(iter(hook_specs({canonical(s) for s in profile.compressors["spec"]},
                                FP16_HOOK)), None)
    first = Planner(profile, cluster, [fp16 or settings[0]], strict=True, objective="time")
    fp32 = _fp32_at(first, cap)
    results = [fp32]
    fp16_hook = Option(fp16, "device", "allreduce") if fp16 else None
    if fp16_hook in first.problem.options:
        candidate = _uniform_at(first, cap, fp16_hook, BaselineKind.FP16_HOOK.value)
        if candidate.time_ms < fp32.time_ms * (1 - options.margin):
            results = [candidate]
    kept = [_setting_of(results[0])]
    for setting in settings:
        result = search([setting], (cap,))
        if _assignment(result) == _assignment(results[-1]):
            notes.append(f"{setting} plans the same as {kept[-1]}: left out")
            continue
        results.append(result)
        kept.append(setting)
    if len(results) < 2:
        raise BytecompError(f"{profile.label}: no {adaptive.family} setting is predicted to "
                            f"pay for compressing any tensor on this cluster: a static plan "
                            f"(bytecomp plan without --adaptive) is the answer")
    gains, fidelities = level_fidelities(profile, results)
    start = best_start(results, fidelities, adaptive.threshold)
    if agree_every is None:
        agree_every = agreement_interval(results[start].time_ms, adaptive.window)
    return LadderResult(results, kept, replace(adaptive, start=start, agree_every=agree_every),
                        notes, gains, fidelities)


def agreement_interval(step_ms: float, window: int) -> int:
    """Steps per agreement: enough to make ``AGREE_MS`` of ``step_ms`` steps, from 1 to
    ``window`` (the steps at a level before each decision)."""
    if not step_ms > 0:
        return 1
    return max(1, min(window, math.ceil(AGREE_MS / step_ms)))


def level_fidelities(profile: Profile, results: list[SearchResult]) \
        -> tuple[list[float | None], list[float | None]]:
    """Each level's gain, as the executor will measure it while training, and its
    fidelity, calibrated both ways by the probe (None for both without a fidelity
    table). The gain is the profile's gains composed, scaled per setting to the gain
    the convergence probe measured over the steps its steps factor comes from, where
    it recorded one (the fidelity table's gains come from the first iterations)."""
    if not profile.has_fidelity:
        return [None] * len(results), [None] * len(results)
    raw = FidelityModel(profile, calibrate=False)
    calibrated = FidelityModel(profile, lower_only=False)
    names = list(profile.tensors["name"])
    scale = {}
    for spec, gain in profile.probe_gains.items():
        spec = canonical(spec)
        uniform = raw.uniform(spec, names)
        scale[spec] = gain / uniform if uniform > 0 else 1.0

    def composed(gain_of, result: SearchResult) -> float:
        tensors, options = result.problem.tensors, _assignment(result)
        return compose([raw.shares[t.name] for t in tensors],
                       [gain_of(t.name, o.spec) for t, o in zip(tensors, options)])

    def live(name: str, spec: str) -> float:
        return min(1.0, raw.gain(name, spec) * scale.get(spec, 1.0))

    return [composed(live, r) for r in results], \
        [composed(calibrated.gain, r) for r in results]


def best_start(results: list[SearchResult], fidelities: list[float | None],
               threshold: float) -> int:
    """The level with the best predicted effective time (iteration time / fidelity)
    among those whose fidelity is at least ``threshold``; level 0 if none is, or the
    fidelities are unknown."""
    best, best_ms = 0, math.inf
    for number, (result, fidelity) in enumerate(zip(results, fidelities)):
        if fidelity is None or fidelity <= 0 or (number and fidelity < threshold):
            continue
        effective = result.time_ms / fidelity
        if effective < best_ms:
            best, best_ms = number, effective
    return best


def _fp32_at(planner: Planner, cap: float) -> SearchResult:
    """fp32 DDP at bucket cap ``cap`` as a search result."""
    return _uniform_at(planner, cap, NO_COMPRESSION, BaselineKind.FP32_DDP.value)


def _uniform_at(planner: Planner, cap: float, option: Option, name: str) -> SearchResult:
    """``option`` on every tensor at bucket cap ``cap`` as a search result."""
    problem = planner.problem
    assignment = problem.uniform(problem.index_of(option))
    time_ms = problem.simulate(assignment, cap).iteration_ms
    return SearchResult(problem, planner.cluster, planner.specs, assignment, cap, time_ms,
                      planner.baselines(), name, 0.0, time_ms, True, 0, [],
                      problem.objective, problem.fidelity(assignment), time_ms)


def _assignment(result: SearchResult) -> list:
    return [result.problem.options[o] for o in result.assignment]


def _setting_of(result: SearchResult) -> str:
    specs = sorted({o.spec for o in _assignment(result) if o.compressed})
    return ", ".join(specs) or NO_COMPRESSION.spec


def to_ladder_plan(result: LadderResult, profile: Profile) -> Plan:
    """The plan file's content: level 0's plan with every level and the controller."""
    plans = [to_plan(level, profile) for level in result.levels]
    first = plans[0]
    levels = [Level(setting, plan.entries, round(level.time_ms, 4), _rounded(fidelity),
                    _rounded(gain))
              for setting, plan, level, fidelity, gain in
              zip(result.settings, plans, result.levels, result.fidelities, result.gains)]
    fp32 = fp32_ms(result.levels[0])
    predicted = {"plan": levels[0].predicted_ms,
                 "levels": [level.predicted_ms for level in levels],
                 "baselines": {BaselineKind.FP32_DDP.value: round(fp32, 4)}}
    search = {"algorithm": "ladder: " + first.search.get("algorithm", ""),
              "time_ms": round(sum(level.search_ms for level in result.levels), 2),
              "levels": len(levels)}
    info = dict(first.info)
    info["objective"] = {"name": "adaptive", "threshold": result.adaptive.threshold}
    info.pop("fidelity", None)
    return Plan(first.model_fingerprint, first.world_size, first.nodes, first.ranks_per_node,
                first.bucket_cap_mb, levels[0].entries, predicted, search, info,
                levels=levels, adaptive=result.adaptive, host_workers=first.host_workers)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def level_rows(result: LadderResult) \
        -> list[tuple[int, str, float, float | None, float | None, float]]:
    """(level, setting, iteration ms, gain, fidelity, speedup over fp32 DDP) per level."""
    fp32 = fp32_ms(result.levels[0])
    return [(number, setting, level.time_ms, gain, fidelity,
             fp32 / level.time_ms if level.time_ms > 0 else math.inf)
            for number, (setting, level, gain, fidelity) in
            enumerate(zip(result.settings, result.levels, result.gains, result.fidelities))]
