"""The ``bytecomp`` command line: every command is a thin layer over the library.

Errors a user can cause end as one line on stderr and exit code 2. Results go to stdout
(``--format json``: one JSON document), notes and warnings to stderr.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bytecomp.buckets import SEARCHED_CAPS_MB, cap_label
from bytecomp.errors import BytecompError
from bytecomp.files import atomic_files, check_output_file, check_outputs_spare_inputs
from bytecomp.ui import Stage

app = typer.Typer(
    help="Gradient-compression strategy optimizer for PyTorch DDP: profile, plan, apply.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's help panels cut long option names ("--fidelity-iterati…")
    # at 80 columns or piped; click's never cuts a name and wraps the help beside it
    rich_markup_mode=None,
)
console = Console()
errors = Console(stderr=True)
FORMATS = ("table", "json")
FORMAT_HELP = ("table (for people) or json (one JSON document on stdout, for programs; "
               "notes, warnings and progress on stderr).")


def _check_format(value: str) -> bool:
    """Whether the output is JSON (``--format json``); one line for anything but the
    two formats."""
    if value not in FORMATS:
        raise BytecompError(f"--format must be table or json, got {value!r}")
    return value == "json"


def _plain(value):
    """``value`` as JSON holds it: NaN and infinities as null, tuples and paths as lists
    and strings, numpy scalars as numbers."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # a numpy or torch scalar
        return _plain(value.item())
    return str(value)


def _emit_json(document: dict) -> None:
    """``document`` on stdout: one JSON document, ``json.loads`` parses it."""
    sys.stdout.write(json.dumps(_plain(document), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def _show(table: Table, keep: tuple[int, ...] = (0,), stream: Console | None = None) -> None:
    """Print ``table`` with the words of its ``keep`` columns (names) whole at any width
    the words fit (:class:`bytecomp.ui.Fitted`)."""
    from bytecomp.ui import Fitted

    (stream or console).print(Fitted(table, keep))


def _notes(notes: list[str]) -> None:
    """Notes on stderr, one line each (results stay alone on stdout)."""
    for note in notes:
        errors.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from bytecomp import __version__

        console.print(f"bytecomp {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Gradient-compression strategy optimizer for PyTorch DDP: profile, plan, apply."""


@app.command()
def compressors(
    specs: list[str] = typer.Argument(None, help="Specs to show (default: every compressor)."),
    numel: int = typer.Option(1 << 20, min=1, help="Elements used for the payload column."),
    output_format: str = typer.Option("table", "--format", help=FORMAT_HELP),
):
    """List the compressors: parameters, capabilities and payload size."""
    from bytecomp.comm.schemes import SCHEMES, supported_schemes
    from bytecomp.compress import COMPRESSORS, from_spec, kernels
    from bytecomp.profile_store import MAX_INTEGER

    as_json = _check_format(output_format)
    if not 1 <= numel <= MAX_INTEGER:  # the most elements a profiled tensor may have
        raise BytecompError(f"--numel must be from 1 to {MAX_INTEGER:,} elements, got {numel:,}")
    chosen = [from_spec(spec) for spec in specs] if specs else \
        [from_spec(name) for name in COMPRESSORS]
    if as_json:
        _emit_json({"numel": numel, "element_size": 4,
                    "schemes": {scheme.name: scheme.label for scheme in SCHEMES.values()},
                    "compressors": [_compressor_json(c, numel) for c in chosen]})
        return
    missing = "" if kernels.triton_installed() else " (triton is not installed)"
    table = Table(title=f"bytecomp compressors: payload for {numel:,} float32 elements",
                  caption="schemes: " + ", ".join(f"{s.label} {s.name}"
                                                  for s in SCHEMES.values())
                  + f"; kernel: what encodes a CUDA tensor here, triton (fused kernels) or "
                    f"torch (PyTorch ops, as on the CPU){missing}")
    for column in ("name", "parameters", "EF", "sum", "kernel", "schemes", "payload bytes",
                   "ratio"):
        table.add_column(column, overflow="fold",
                         justify="right" if column in ("payload bytes", "ratio") else "left")
    dense = numel * 4
    for compressor in chosen:
        parameters = ", ".join(f"{key}={_shown(value)}" for key, value in
                               compressor.values.items())
        payload = compressor.payload_bytes(numel, 4)
        note = "" if compressor.fixed_size else f" ({compressor.payload_estimate})"
        table.add_row(compressor.name, parameters, "on" if compressor.error_feedback else "off",
                      "yes" if compressor.summable else "no", kernels.path(compressor),
                      " ".join(SCHEMES[s].label for s in supported_schemes(compressor)),
                      f"{payload:,}{note}", f"{dense / payload:.1f}x")
    _show(table, keep=(0, 1))


def _compressor_json(compressor, numel: int) -> dict:
    """A compressor as ``compressors --format json`` shows it: spec, parameters, the
    traits it declares (:attr:`bytecomp.compress.base.Compressor.TRAITS`), what encodes a
    CUDA tensor here (``cuda_path``: triton or torch), schemes and payload for ``numel``
    float32 elements."""
    from bytecomp.comm.schemes import supported_schemes
    from bytecomp.compress import kernels

    payload = compressor.payload_bytes(numel, 4)
    return {
        "name": compressor.name, "spec": compressor.spec, "summary": compressor.summary,
        "parameters": dict(compressor.values), "error_feedback": compressor.error_feedback,
        "params": {key: {"type": param.kind.__name__, "default": param.default,
                         "accepts": param.describe(), "help": param.help}
                   for key, param in compressor.params.items()},
        "traits": {trait: getattr(compressor, trait) for trait in compressor.TRAITS
                   if trait not in ("name", "summary", "params")},
        "cuda_path": kernels.path(compressor),
        "schemes": supported_schemes(compressor),
        "payload_bytes": payload, "ratio": numel * 4 / payload,
    }


@app.command()
def profile(
    model: str = typer.Option(None, help="Built-in workload (mlp, cnn, transformer[:layers=4,"
                              "width=256,seq_len=128], lstm, resnet18, resnet50, vgg16) or "
                              "pkg.module:factory [default: mlp]."),
    nproc: int = typer.Option(None, help="Local ranks to spawn (default 1; leave out under "
                              "torchrun, which sets the ranks)."),
    out: str = typer.Option(None, help="Profile directory (default profiles/<model>)."),
    batch_size: int = typer.Option(None, min=1, help="Batch per rank (default: the "
                                   "workload's)."),
    bucket_cap_mb: float = typer.Option(25.0, help="DDP bucket cap used while profiling."),
    iterations: int = typer.Option(20, min=1, help="Timed iterations per phase."),
    warmup: int = typer.Option(3, min=0, help="Untimed iterations before each phase."),
    compressor: list[str] = typer.Option(None, help="Compressor spec to sweep (repeatable; "
                                         "default: every compressor at its defaults)."),
    quick: bool = typer.Option(False, help="A reduced sweep (seconds, not minutes)."),
    force: bool = typer.Option(False, help="Replace an existing profile directory."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    timeout: float = typer.Option(300.0, help="Seconds before a stuck collective fails."),
    max_mb: float = typer.Option(64.0, help="Largest collective buffer in the sweeps (MiB)."),
    machine: str = typer.Option("", help="A description of the machine, kept in profile.yaml."),
    fidelity_iterations: int = typer.Option(10, min=0, help="Training steps whose local "
                                            "gradients measure each compressor's gain (0: "
                                            "no fidelity table)."),
    probe_steps: int = typer.Option(None, min=0, help="Steps of the convergence probe: fp32 "
                                    "and every compressor on every tensor train this long from "
                                    "the same weights, for each compressor's measured steps "
                                    "factor (0: no probe; default: what is left of --budget, at "
                                    "most 100; --quick 20)."),
    budget: float = typer.Option(240.0, help="Seconds on the clock the whole profile aims to "
                                 "take: the convergence probe trains for what the measurements "
                                 "before it leave (--probe-steps forces a count instead)."),
    ladder: list[str] = typer.Option(None, help="Also time every setting of this compressor "
                                     "family's adaptive ladder (repeatable: topk, randomk, dgc, "
                                     "exdyna, powersgd, acpsgd), for plan --adaptive."),
    optimizer: str = typer.Option(None, help="The optimizer every training run of the profile "
                                  "uses (timing, gains, probe), replacing the workload's: "
                                  "sgd|adam|adamw[:lr=...,momentum=...,weight_decay=...,"
                                  "clip=...] (default: the workload recipe's; the built-ins: "
                                  "adam:lr=0.001)."),
    calibration: str = typer.Option(None, help="Reuse the cluster's tables of this calibration "
                                    "(--calibrate-only) or profile directory: collective, "
                                    "compressor, aggregation and copy sweeps, the executor's "
                                    "fixed costs. Refused in one line unless its world, "
                                    "backend, device and link match this job's."),
    calibrate_only: bool = typer.Option(False, "--calibrate-only", help="Measure the cluster's "
                                        "tables alone, no model: a calibration directory "
                                        "(--out, default profiles/calibration) for "
                                        "--calibration."),
):
    """Measure a real DDP job: compute, ready times, buckets, collectives, compressors,
    and each compressor's gradient fidelity on every tensor."""
    with Stage("loading torch", after_s=0, lines=False):
        from bytecomp.profiler import ProfileConfig, run_profile
    from bytecomp.profiler.workloads import safe_name

    _check_nproc(nproc)
    if device not in ("auto", "cpu", "cuda"):
        raise BytecompError(f"--device must be auto, cpu or cuda, got {device!r}")
    if calibrate_only and calibration is not None:
        raise BytecompError("--calibration and --calibrate-only do not go together: a "
                            "calibration measures the tables that --calibration reuses")
    _refuse_unused(calibrate_only, "with --calibrate-only (no model is profiled)",
                   {"--model": model, "--batch-size": batch_size, "--optimizer": optimizer})
    model = model or "mlp"
    default_out = "profiles/calibration" if calibrate_only else f"profiles/{safe_name(model)}"
    config = ProfileConfig(model=model, out=out or default_out,
                           batch_size=batch_size, bucket_cap_mb=bucket_cap_mb,
                           iterations=iterations, warmup=warmup, specs=compressor or [],
                           quick=quick, force=force, device=device, timeout_s=timeout,
                           max_mb=max_mb, machine=machine,
                           fidelity_iterations=fidelity_iterations, ladders=ladder or [],
                           probe_steps=probe_steps, optimizer=optimizer,
                           budget_s=budget, calibration=calibration,
                           calibrate_only=calibrate_only)
    run_profile(config, nproc)


def _refuse_unused(unused: bool, why: str, options: dict) -> None:
    """One line for options given where they have no effect (``unused``)."""
    given = [name for name, value in options.items() if value is not None]
    if unused and given:
        raise BytecompError(f"{' and '.join(given)} {'has' if len(given) == 1 else 'have'} "
                            f"no effect {why}; leave {'it' if len(given) == 1 else 'them'} out")


def _check_nproc(nproc: int | None) -> None:
    if nproc is None:  # nothing to check: no need to import torch (bytecomp.launch) for it
        return
    from bytecomp.launch import check_nproc

    _warn(check_nproc(nproc))


def _require_positive(option: str, value: float) -> None:
    if not 0 < value < math.inf:
        raise BytecompError(f"{option} must be a positive number, got {value:g}")


def _inputs(profile: str, plan_file: str | None, cluster: str | None) -> list[Path]:
    """The files a command reads, which none of its outputs may overwrite."""
    from bytecomp.model.clusters import cluster_file
    from bytecomp.profile_store import profile_files

    files = profile_files(profile) + ([Path(plan_file)] if plan_file else [])
    config = cluster_file(cluster) if cluster else None
    return files + ([config] if config is not None else [])


def _load_cluster(cluster: str | None):
    from bytecomp.model.clusters import load_cluster

    if cluster is not None and not cluster.strip():
        raise BytecompError("--cluster is empty: name a shipped cluster or a config file "
                            "(leave it out for the profiled cluster)")
    return load_cluster(cluster) if cluster is not None else None


@app.command()
def plan(
    profile: str = typer.Argument(..., help="Profile directory (from bytecomp profile)."),
    cluster: str = typer.Option(None, help="Cluster config name or YAML file (default: the "
                                "profiled cluster)."),
    compressor: list[str] = typer.Option(None, help="Allowed compressor spec (repeatable; "
                                         "default: every compressor in the profile)."),
    out: str = typer.Option("plan.yaml", help="Where to write the plan."),
    bucket_cap_mb: list[float] = typer.Option(None, help="Candidate DDP bucket cap (repeatable; "
                                              "0: one bucket per tensor, no merging; default: "
                                              "the profiled cap, " + ", ".join(
                                                  f"{c:g}" for c in SEARCHED_CAPS_MB) + ")."),
    algorithm: str = typer.Option("auto", help="auto, greedy, local (annealing over every "
                                  "option) or exact (the default search, then branch and "
                                  "bound until the optimum is proven or --budget is spent)."),
    evaluations: int = typer.Option(None, help="Evaluations of the model the annealing after "
                                    "the greedy spends, in full (default: 100,000 / tensors, "
                                    "from 600 to 4,000). The search is deterministic: the "
                                    "same inputs and evaluations give the same plan."),
    budget: float = typer.Option(None, help="Seconds: a wall-clock cap on the annealing "
                                 "(default: none), or with --algorithm exact on the whole "
                                 "search (default: 10). It only cuts a search short, and then "
                                 "the plan depends on the machine's speed."),
    stop_gap: float = typer.Option(None, help="Percent: the search stops once its plan is "
                                   "predicted within this of the lower bound, so of the best "
                                   "plan there is (default 1 without --evaluations and "
                                   "--budget, or with --algorithm exact's --budget; else 0: "
                                   "what is asked is spent)."),
    strict: bool = typer.Option(False, help="Only the --compressor specs (by default the "
                                "fp16 and PowerSGD baselines' methods are candidates too)."),
    min_gain: float = typer.Option(None, help="Percent: unless the searched plan is predicted "
                                   "this much better (on the objective) than fp32 DDP, the plan "
                                   "is fp32 DDP (no other baseline: more compressors never give "
                                   "a worse plan; 0: always the searched plan; default 10 for "
                                   "effective time, 5 for time)."),
    objective: str = typer.Option(None, help="effective (iteration time / fidelity, the "
                                  "default where the profile measured fidelity) or time "
                                  "(iteration time alone, the default without)."),
    min_fidelity: float = typer.Option(None, help="With the effective objective: no plan whose "
                                       "fidelity is below this (default 0.75)."),
    fidelity_weights: str = typer.Option("params", help="How tensors' gains compose into a "
                                         "plan's fidelity: params (each tensor by its share "
                                         "of the parameters; Adam and the like) or norm (by "
                                         "its share of the gradient's squared norm; SGD)."),
    probe: bool = typer.Option(True, help="Calibrate the gains with the profile's convergence "
                               "probe (each compressor's measured steps factor), where it has "
                               "one."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show fit quality and pruning."),
    adaptive: str = typer.Option(None, help="Plan a ladder of levels over this compressor "
                                 "family's settings in the profile (topk, randomk, dgc, exdyna, "
                                 "powersgd, acpsgd), for the executor to move along while "
                                 "training by the measured gain."),
    gain_threshold: float = typer.Option(None, help="With --adaptive: the smoothed gain a "
                                         "level must keep (GraVAC's threshold), calibrated "
                                         "by the profile's convergence probe [default: "
                                         "0.75]."),
    window: int = typer.Option(None, help="With --adaptive: steps of smoothing, and at a level "
                               "before each decision [default: 10]."),
    timing: str = typer.Option(None, help="With --adaptive: score levels by step times "
                               "the executor measures, or by this plan's predictions "
                               "(predicted: the same decisions on every run) [default: "
                               "measured]."),
    agree_every: int = typer.Option(None, help="With --adaptive: steps whose measurements the "
                                    "ranks agree on in one allreduce [default: enough steps "
                                    "for about 100 ms of the start level's predicted "
                                    "iteration, at most --window]."),
    verify: bool = typer.Option(True, help="Train the finalists (the searched plan, the best "
                                "plans with other compressors, fp32 DDP and PyTorch's fp16 and "
                                "PowerSGD hooks) on the profiled ranks with the profile's "
                                "recipe, and choose by predicted time x measured steps; "
                                "--no-verify plans from the predictions alone."),
    verify_steps: int = typer.Option(None, help="Steps each finalist trains, forced "
                                     "(default: what --verify-budget affords on the clock, "
                                     "at most 200)."),
    verify_budget: float = typer.Option(None, help="Seconds on the clock the finalists' "
                                        "training takes at most, the ranks' start-up "
                                        "included: the ranks time their first steps and fit "
                                        "the rest in [default: 180]."),
    nproc: int = typer.Option(None, help="Ranks to spawn for the finalists (default: the "
                              "profile's; leave out under torchrun)."),
    model: str = typer.Option(None, help="The profile's model spec, where it is a "
                              "pkg.module:factory: the finalists train it only when you name "
                              "it here (a profile file never makes bytecomp run code)."),
    static: bool = typer.Option(False, "--static", help="Write the chosen plan alone: no "
                                "runtime trial of the finalists the prediction cannot "
                                "separate, no controller."),
    output_format: str = typer.Option("table", "--format", help=FORMAT_HELP),
):
    """Search the per-tensor strategy that trains soonest: shortest predicted iteration per
    unit of gradient fidelity (or iteration time alone); write plan.yaml."""
    from bytecomp.plan_file import MAX_BUCKET_CAP_MB
    from bytecomp.profile_store import load_profile
    from bytecomp.search import Planner, to_plan
    from bytecomp.search.evidence import evidence_paths
    from bytecomp.search.options import (
        ALGORITHMS,
        MAX_EVALUATIONS,
        SearchOptions,
        default_min_gain,
    )
    from bytecomp.search.verify import MAX_STEPS as MAX_VERIFY_STEPS

    as_json = _check_format(output_format)
    if algorithm not in ALGORITHMS:
        raise BytecompError(f"--algorithm must be {', '.join(ALGORITHMS[:-1])} or "
                            f"{ALGORITHMS[-1]}, got {algorithm!r}")
    for cap in bucket_cap_mb or []:
        if not 0 <= cap <= MAX_BUCKET_CAP_MB:  # also false for NaN
            raise BytecompError(f"--bucket-cap-mb must be a number of MB from 0 (one bucket "
                                f"per tensor) to {MAX_BUCKET_CAP_MB:g}, got {cap:g}")
    if budget is not None and not 0 <= budget < math.inf:
        raise BytecompError(f"--budget must be a non-negative number of seconds, got {budget:g}")
    if evaluations is not None and not 0 <= evaluations <= MAX_EVALUATIONS:
        raise BytecompError(f"--evaluations must be an integer from 0 to {MAX_EVALUATIONS:,}, "
                            f"got {evaluations}")
    if min_gain is not None and not 0 <= min_gain < 100:
        raise BytecompError(f"--min-gain is a percentage in [0, 100), got {min_gain:g}")
    if stop_gap is not None and not 0 <= stop_gap < 100:
        raise BytecompError(f"--stop-gap is a percentage in [0, 100), got {stop_gap:g}")
    if verify_steps is not None and not 1 <= verify_steps <= MAX_VERIFY_STEPS:
        raise BytecompError(f"--verify-steps must be from 1 to {MAX_VERIFY_STEPS:,}, got "
                            f"{verify_steps}")
    _refuse_unused(adaptive is None, "without --adaptive (they set an adaptive plan's "
                   "controller)", {"--gain-threshold": gain_threshold, "--window": window,
                                   "--timing": timing, "--agree-every": agree_every})
    _refuse_unused(not verify, "with --no-verify (nothing is trained)",
                   {"--verify-steps": verify_steps, "--verify-budget": verify_budget,
                    "--model": model})
    _refuse_unused(adaptive is not None, "with --adaptive (its levels are not trained)",
                   {"--model": model})
    _refuse_unused(objective == "time", "with --objective time (fidelity is not scored)",
                   {"--min-fidelity": min_fidelity})
    _refuse_unused(adaptive is not None, "with --adaptive (an adaptive plan's levels are "
                   "neither trained nor tried at run time)",
                   {"--static": static or None, "--nproc": nproc, "--verify-steps": verify_steps,
                    "--verify-budget": verify_budget})
    _refuse_unused(not verify, "with --no-verify (no finalists are trained or tried)",
                   {"--static": static or None, "--nproc": nproc})
    verify_budget = 180.0 if verify_budget is None else verify_budget
    _require_positive("--verify-budget", verify_budget)
    _check_nproc(nproc)
    options = SearchOptions(tuple(bucket_cap_mb) if bucket_cap_mb else None, algorithm, budget,
                            0.0 if min_gain is None else min_gain / 100, evaluations,
                            stop_gap=None if stop_gap is None else stop_gap / 100)
    settings = _adaptive_settings(adaptive, 0.75 if gain_threshold is None else gain_threshold,
                                  10 if window is None else window, timing or "measured",
                                  agree_every) if adaptive is not None else None
    check_output_file(out, "--out")
    evidence = [str(path) for path in evidence_paths(out)] if verify and settings is None else []
    for path in evidence:  # written beside the plan: checked before any work too
        check_output_file(path, "--out")
    check_outputs_spare_inputs({"--out": out, **{f"--out ({Path(e).name})": e
                                                 for e in evidence}},
                               _inputs(profile, None, cluster))
    with Stage(f"reading {profile}"):
        loaded = load_profile(profile)
    if verify and settings is None and not loaded.meta.get("synthetic"):
        from bytecomp.search.verify import allowed_spec

        allowed_spec(loaded, model)  # refused before any work
    if settings is not None:
        if min_gain is None:  # the levels are searched by time
            options = replace(options, min_gain=default_min_gain("time"))
        _plan_adaptive(loaded, _load_cluster(cluster), settings, agree_every, options, out,
                       as_json)
        return
    with Stage(f"fitting the cost model to {profile} and setting up the search"):
        planner = Planner(loaded, _load_cluster(cluster), compressor or None, strict, objective,
                          min_fidelity, fidelity_weights, probe)
    if min_gain is None:
        options = replace(options, min_gain=default_min_gain(planner.problem.objective.name))
    if verify:
        how = f"{verify_steps} steps each (--verify-steps)" if verify_steps else \
            f"at most {verify_budget:g} s (--verify-budget sets it)"
        _announce(f"planning {profile} for {planner.cluster.name}: search, then train the "
                  f"finalists for {how}; --no-verify plans from predictions alone")
    with Stage(f"searching {len(planner.problem.tensors)} tensors x "
               f"{len(planner.problem.options)} options ({algorithm}; --budget caps it)"):
        result = planner.search(options)
    verification = None
    if verify:
        from bytecomp.search.verify import chosen_result
        from bytecomp.search.verify import verify as verify_finalists

        verification = verify_finalists(planner, result, options, verify_steps, nproc,
                                        budget_s=verify_budget, model=model,
                                        announce=_announce)
        result = chosen_result(result, verification)
    else:
        result.warnings.append("--no-verify: the plan is chosen from predictions alone, "
                               "without training its finalists")
    plan_file = to_plan(result, loaded)
    if verification is not None:
        from bytecomp.search.verify import trial_plan

        plan_file.info["finalists"] = [
            f.to_meta(f is verification.choice.finalist) for f in verification.finalists]
        plan_file.info["verification"] = verification.to_meta()
        with_trial = None if static else trial_plan(planner, result, verification, plan_file)
        if with_trial is not None:
            plan_file = with_trial
            assert plan_file.adaptive is not None
            result.notes.append(
                f"the running job times {len(plan_file.adaptive.trial)} finalists the "
                f"prediction cannot separate (levels {list(plan_file.adaptive.trial)}) for "
                f"{plan_file.adaptive.trial_steps} steps after {plan_file.adaptive.trial_warmup}"
                f", then keeps the best; --static writes the chosen plan alone")
    if verification is not None and verification.curves:
        from bytecomp.search.evidence import write_evidence

        with Stage(f"writing the finalists' curves beside {out}"), \
                atomic_files(evidence) as staged:  # the curves the factors were read from
            write_evidence(verification, staged, f"finalists of {out}")
    written = plan_file.save(out)
    if verbose:  # asked for: on stdout, or beside a JSON document on stderr
        _print_fits(planner, errors if as_json else console)
    if as_json:
        _notes(result.notes)
        _warn(result.warnings)
        _emit_json(_plan_json(result, plan_file, written))
        return
    if verification is not None:
        _print_finalists(verification)
    _print_plan(result, written)


def _starting_entries(plan_file) -> list:
    """The entries training starts with: a static plan's, or its start level's."""
    if plan_file.levels and plan_file.adaptive is not None:
        return plan_file.levels[plan_file.adaptive.start].entries
    return plan_file.entries


def _plan_json(result, plan_file, written) -> dict:
    """``plan --format json``: the plan file's fields as written (predictions, baselines,
    fidelity, search, finalists, tensors or levels), where it was written, the per-tensor
    strategies training starts with, the table's rows, notes and warnings."""
    rows = [{"strategy": row["strategy"], "bucket_cap_mb": row["cap_mb"],
             "iteration_ms": row["time_ms"], "fidelity": row["fidelity"],
             "effective_ms": row["effective_ms"], "below_min_fidelity": row["below"],
             "vs_fp32": row["vs_fp32"]} for row in result.strategy_rows()]
    return {"written": str(written), **plan_file.to_dict(),
            "tensors": [entry.to_dict() for entry in _starting_entries(plan_file)],
            "strategies": rows, "composition": result.composition(),
            "evidence": result.evidence, "notes": result.notes, "warnings": result.warnings}


def _adaptive_settings(family: str, threshold: float, window: int, timing: str,
                       agree_every: int | None):
    """The controller's settings from --adaptive and its options, checked."""
    from bytecomp.plan_file import MAX_WINDOW, TIMINGS, Adaptive

    if not 0 <= threshold <= 1:
        raise BytecompError(f"--gain-threshold must be between 0 and 1, got {threshold:g}")
    if not 1 <= window <= MAX_WINDOW:
        raise BytecompError(f"--window must be from 1 to {MAX_WINDOW:,} steps, got {window}")
    if timing not in TIMINGS:
        raise BytecompError(f"--timing must be {' or '.join(TIMINGS)}, got {timing!r}")
    if agree_every is not None and not 1 <= agree_every <= MAX_WINDOW:
        raise BytecompError(f"--agree-every must be from 1 to {MAX_WINDOW:,} steps, got "
                            f"{agree_every}")
    return Adaptive(family, threshold, window, timing=timing)


def _plan_adaptive(profile, cluster, settings, agree_every: int | None, options,
                   out: str, as_json: bool = False) -> None:
    from bytecomp.search.ladder import level_rows, plan_ladder, to_ladder_plan
    from bytecomp.search.planner import effective_ms

    family, threshold = settings.family, settings.threshold
    result = plan_ladder(profile, cluster, settings, options, agree_every)
    plan_file = to_ladder_plan(result, profile)
    written = plan_file.save(out)
    level = result.levels[0]
    start = result.adaptive.start
    if as_json:
        _notes(result.notes)
        _emit_json({
            "written": str(written), **plan_file.to_dict(),
            "tensors": [entry.to_dict() for entry in _starting_entries(plan_file)],
            "ladder": [{"level": number, "setting": setting, "iteration_ms": time_ms,
                        "gain": gain, "fidelity": fidelity,
                        "effective_ms": effective_ms(time_ms, fidelity) if fidelity else None,
                        "vs_fp32": speedup}
                       for number, setting, time_ms, gain, fidelity, speedup in
                       level_rows(result)],
            "notes": result.notes})
        return
    table = Table(title=f"adaptive plan: {family} ladder on {level.cluster.name} "
                        f"({level.cluster.nodes} x {level.cluster.ranks_per_node} ranks), "
                        f"bucket cap {level.cap_mb:g} MB; training starts at level {start} (*) "
                        f"and the executor moves up while the calibrated gain stays "
                        f">= {threshold:g}; the ranks agree every "
                        f"{result.adaptive.agree_every} step(s)")
    for column in ("level", "setting", "iteration ms", "profiled gain", "fidelity",
                   "effective ms", "vs fp32 DDP"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for number, setting, time_ms, gain, fidelity, speedup in level_rows(result):
        table.add_row(f"{number}{'*' if number == start else ''}", setting,
                      f"{time_ms:.2f}", "-" if gain is None else f"{gain:.3f}",
                      "-" if fidelity is None else f"{fidelity:.3f}",
                      "-" if not fidelity else f"{effective_ms(time_ms, fidelity):.2f}",
                      f"{speedup:.2f}x")
    _show(table, keep=(1,))
    _notes(result.notes)
    console.print(f"wrote {written}")


def _print_fits(planner, stream: Console) -> None:
    from bytecomp.model.costs import fit_quality
    from bytecomp.search.tree import pruned_counts

    table = Table(title="fitted models: collectives and copies a + b * size (alpha-beta); "
                  "compressors monotone piecewise (a: time at the smallest size, b: slope "
                  "of the last segment)")
    for column in ("model", "key", "form", "a ms", "b ms/unit", "R²", "worst rel. error",
                   "points"):
        table.add_column(column, justify="left" if column in ("model", "key") else "right")
    quality = fit_quality(planner.comm.rows() + planner.compute.rows())
    for row in quality.itertuples():
        table.add_row(row.model, row.key, row.form, f"{row.a_ms:.4f}", f"{row.b_ms_per_unit:.3e}",
                      f"{row.r2:.4f}", f"{100 * row.worst_rel_error:.1f}%", str(row.points))
    _show(table, keep=(0, 1), stream=stream)
    for reason, count in pruned_counts(planner.tree).items():
        stream.print(f"pruned {count} options: {reason}")
    stream.print(f"{len(planner.problem.options)} options offered per tensor")


def _print_finalists(verification) -> None:
    trained = f"trained {verification.steps} steps from the same weights on the profiled " \
              f"ranks (losses on {verification.batches})" if verification.steps else \
              "none trained here"
    table = Table(title=f"finalists, {trained}; chosen (*) by predicted ms per step x "
                        f"measured steps factor")
    for column in ("finalist", "bucket cap MB", "predicted ms", "steps factor", "factor from",
                   "ms per fp32 step"):
        table.add_column(column, justify="left" if column in ("finalist", "factor from")
                         else "right")
    for finalist in verification.finalists:
        star = "*" if finalist is verification.choice.finalist else ""
        factor = finalist.steps_factor
        table.add_row(finalist.name + star, cap_label(finalist.cap_mb), f"{finalist.time_ms:.2f}",
                      "-" if factor is None else f"{factor:.2f}",
                      verification.factor_from.get(finalist.name, "-"),
                      f"{finalist.value:.2f}" if math.isfinite(finalist.value) else "inf")
    _show(table)


def _announce(text: str) -> None:
    """A stage's opening line on stderr: what it does, how long, how to skip it."""
    errors.print(escape(text), highlight=False, soft_wrap=True)


def _print_plan(result, written) -> None:
    known = result.fidelity is not None
    effective = result.objective.name == "effective"
    title = f"predicted on {result.cluster.name} ({result.cluster.nodes} x " \
            f"{result.cluster.ranks_per_node} ranks); objective: " + \
            (f"effective time, fidelity ({result.objective.weights}-weighted) >= "
             f"{result.objective.min_fidelity:g}" if effective
             else "iteration time")
    table = Table(title=title)
    columns = ["strategy", "bucket cap MB", "iteration ms"]
    columns += ["fidelity", "effective ms"] if known else []
    columns += ["vs fp32 DDP"]
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for number, row in enumerate(result.strategy_rows()):
        cells = [row["strategy"], cap_label(row["cap_mb"]), f"{row['time_ms']:.2f}"]
        if known:
            cells += [f"{row['fidelity']:.3f}" + (" (below)" if row["below"] else ""),
                      f"{row['effective_ms']:.2f}"]
        cells.append(f"{row['vs_fp32']:.2f}x")
        if number == 0:  # the plan
            cells = [f"[bold]{cell}[/]" for cell in cells]
        table.add_row(*cells)
    _show(table)
    # one line however narrow the terminal: CI logs grep it
    console.print("plan: " + result.composition(), soft_wrap=True)
    console.print(f"search: {result.algorithm}, {result.search_ms:.0f} ms, "
                  f"{result.evaluations} simulations; lower bound {result.lower_bound_ms:.2f} ms "
                  f"({result.gap_text()})")
    console.print(f"evidence: {result.evidence}")
    _notes(result.notes)
    _warn(result.warnings)
    console.print(f"wrote {written}")


@app.command()
def simulate(
    profile: str = typer.Argument(..., help="Profile directory."),
    plan_file: str = typer.Argument(..., metavar="PLAN", help="Plan file (plan.yaml)."),
    cluster: str = typer.Option(None, help="Cluster config (default: the profiled cluster)."),
    trace: str = typer.Option(None, help="Write a Chrome trace (open it in Perfetto)."),
    png: str = typer.Option(None, help="Write a Gantt chart PNG."),
    level: int = typer.Option(None, help="An adaptive plan's level to simulate (default 0)."),
    output_format: str = typer.Option("table", "--format", help=FORMAT_HELP),
):
    """Simulate one iteration of a plan: time breakdown, trace and Gantt chart."""
    from bytecomp.plan_file import load_plan
    from bytecomp.profile_store import load_profile
    from bytecomp.search import Planner, simulate_plan
    from bytecomp.search.planner import check_plan_fits
    from bytecomp.timeline.render import draw_gantt, write_trace

    as_json = _check_format(output_format)
    outputs: dict[str, str | None] = {"--trace": trace, "--png": png}
    for option, path in outputs.items():
        if path:
            check_output_file(path, option)
    check_outputs_spare_inputs(outputs, _inputs(profile, plan_file, cluster))
    loaded = load_profile(profile)
    the_plan = load_plan(plan_file)
    chosen = _load_cluster(cluster)
    check_plan_fits(the_plan, loaded, chosen)
    simulated_level = None
    if level is not None or the_plan.levels:
        count = len(the_plan.levels or [])
        if not 0 <= (level or 0) < count:
            raise BytecompError(f"{plan_file} has no level {level} (" + (
                f"levels 0 to {count - 1})" if count else "it is not an adaptive plan)"))
        simulated_level = level or 0
        the_plan = the_plan.level(simulated_level)
    planner = Planner(loaded, chosen, the_plan.compressors or None, strict=True)
    result = simulate_plan(planner, the_plan)
    breakdown = result.breakdown()
    times = loaded.meta["times"]
    compute = sum(times[k]["median_ms"] for k in ("forward", "backward_compute", "optimizer"))
    table = Table(title=f"simulated iteration of {plan_file}")
    table.add_column("quantity")
    table.add_column("ms", justify="right")
    rows = [("iteration", result.iteration_ms), ("compute only (forward + backward + optimizer)",
                                                 compute),
            ("exposed (not overlapped) time", result.iteration_ms - compute),
            ("backward ends (after forward)", result.backward_end_ms),
            ("last group done (after forward)", result.comm_end_ms)]
    rows += [(f"busy {key.replace(':', ' ')}", value) for key, value in sorted(breakdown.items())]
    for name, value in rows:
        table.add_row(name, f"{value:.2f}")
    if not as_json:
        _show(table)
    written = [path for path in (trace, png) if path]
    with atomic_files(written) as temporaries:  # both written, then both renamed
        staged = dict(zip(written, temporaries))
        if trace:
            with open(staged[trace], "w") as stream:
                write_trace(result, stream, str(plan_file), planner.problem.tensors)
        if png:
            draw_gantt(result, staged[png], str(plan_file))
    if as_json:
        _emit_json({"plan": plan_file, "level": simulated_level,
                    "cluster": planner.cluster.name, "iteration_ms": result.iteration_ms,
                    "compute_ms": compute, "exposed_ms": result.iteration_ms - compute,
                    "backward_end_ms": result.backward_end_ms,
                    "comm_end_ms": result.comm_end_ms, "busy_ms": dict(sorted(breakdown.items())),
                    "written": written})
        return
    for path in written:
        console.print(f"wrote {path}")


@app.command()
def bench(
    profile: str = typer.Argument(..., help="Profile directory the plan was made from."),
    plan_file: list[str] = typer.Option(..., "--plan", help="The plan to measure (repeatable: "
                                        "the first is 'bytecomp plan', the others are named "
                                        "by their files)."),
    out: str = typer.Option("bench", help="Output directory (bench.csv, bench.md; with "
                            "--train-steps also curves.csv, convergence.csv, convergence.png)."),
    compressor: list[str] = typer.Option(None, help="Compressor for an 'on every tensor' "
                                         "baseline (repeatable; default: the plan's first, "
                                         "else topk:ratio=0.01; with --train-steps every "
                                         "compressor in the profile)."),
    cluster: str = typer.Option(None, help="Cluster config of this job, for the predictions "
                                "(default: the profiled cluster)."),
    iterations: int = typer.Option(10, min=1, help="Measured iterations per strategy."),
    warmup: int = typer.Option(3, min=2, help="Iterations before measuring."),
    nproc: int = typer.Option(None, help="Local ranks to spawn (leave out under torchrun or "
                              "bytecomp emulate)."),
    force: bool = typer.Option(False, help="Replace an existing output directory."),
    train_steps: int = typer.Option(0, min=0, help="Also train every strategy this many steps "
                                    "from the same weights and data, and report the time to "
                                    "a target validation loss (0: timing only)."),
    eval_every: int = typer.Option(25, min=1, help="Steps between validation losses."),
    to_loss: float = typer.Option(None, help="Target validation loss (default: fp32 DDP's "
                                  "loss at 60% of --train-steps)."),
    lr: float = typer.Option(None, help="With --train-steps: train with Adam at this rate "
                             "instead of the profile's recipe."),
    target_fraction: float = typer.Option(0.6, help="With --train-steps and no --to-loss: the "
                                          "target is fp32 DDP's loss at this fraction of the "
                                          "steps."),
    every: bool = typer.Option(True, help="Also one compressor on every tensor (every "
                               "profiled compressor with --train-steps); --no-every: only "
                               "fp32 DDP, PyTorch's hooks and the plans."),
    train_levels: bool = typer.Option(False, help="With --train-steps: also train every level "
                                      "of an adaptive plan as a static plan of its own."),
    model: str = typer.Option(None, help="The profile's model spec, where it is a "
                              "pkg.module:factory: bench builds it only when you name it here "
                              "(a profile file never makes bytecomp run code)."),
    output_format: str = typer.Option("table", "--format", help=FORMAT_HELP),
):
    """Measure the plan and the baselines for real, beside the model's predictions; with
    --train-steps, also their time to a target validation loss."""
    import os

    with Stage("loading torch", after_s=0, lines=False):
        from bytecomp.bencher import BenchConfig, ConvergenceConfig, run_bench

    as_json = _check_format(output_format)
    if cluster is not None:  # checked before any rank starts
        _load_cluster(cluster)
    _check_nproc(nproc)
    if lr is not None:
        _require_positive("--lr", lr)
    if not 0 < target_fraction <= 1:
        raise BytecompError(f"--target-fraction must be in (0, 1], got {target_fraction:g}")
    if to_loss is not None and not math.isfinite(to_loss):
        raise BytecompError(f"--to-loss must be a finite number, got {to_loss:g}")
    convergence = ConvergenceConfig(train_steps, min(eval_every, train_steps), to_loss, lr,
                                    target_fraction=target_fraction) if train_steps else None
    folder = run_bench(BenchConfig(profile, plan_file[0], out, plan_file[1:], compressor or [],
                                   cluster, iterations, warmup, force, convergence, train_levels,
                                   every, tables=not as_json, model=model), nproc)
    if as_json and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0's, as the table
        _emit_json(_bench_json(folder))


def _bench_json(folder: Path) -> dict:
    """``bench --format json``: the rows of bench.csv (and convergence.csv), the table's
    caption (compute drift, prediction errors) and the files written."""
    import pandas as pd

    from bytecomp.bencher.runner import prediction_summary

    results = pd.read_csv(folder / "bench.csv")
    convergence = folder / "convergence.csv"
    return {"out": str(folder), "files": sorted(path.name for path in folder.iterdir()),
            "strategies": results.to_dict(orient="records"),
            "summary": prediction_summary(results),
            "convergence": pd.read_csv(convergence).to_dict(orient="records")
            if convergence.exists() else None}


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def emulate(
    ctx: typer.Context,
    nodes: int = typer.Option(2, help="Emulated nodes (one network namespace each)."),
    ranks_per_node: int = typer.Option(1, help="Ranks per node (they share its namespace)."),
    bandwidth: str = typer.Option("1gbit", help="Link rate of every node, both directions "
                                  "(tc syntax: 100mbit, 1gbit, 10gbit)."),
    latency: str = typer.Option("0", help="Added one-way latency (needs the netem qdisc)."),
    burst: str = typer.Option(None, help="Token-bucket depth of every link (tc syntax: 32kb; "
                              "default: one millisecond at the rate, at least 16kb). A deep "
                              "bucket lets small messages after a pause go for free."),
    check: bool = typer.Option(False, "--check", help="Measure a 2-node allreduce of 16 MiB "
                               "and compare the achieved bandwidth with the configured one."),
):
    """Run COMMAND's ranks in network namespaces over shaped links, like torchrun:
    bytecomp emulate --nodes 2 --ranks-per-node 2 --bandwidth 1gbit -- python train.py"""
    from bytecomp.emulate import check_bandwidth, run_emulated

    if check:
        result = check_bandwidth(bandwidth, burst=burst)
        table = Table(title="emulated 2-node allreduce of 16 MiB (gloo)")
        for column in ("configured Gbit/s", "achieved Gbit/s (bus)", "achieved share",
                       "time ms"):
            table.add_column(column, justify="right")
        table.add_row(f"{result['configured_gbps']:.3f}", f"{result['achieved_gbps']:.3f}",
                      f"{100 * result['share']:.1f}%", f"{result['time_ms']:.1f}")
        console.print(table)
        return
    code = run_emulated(list(ctx.args), nodes, ranks_per_node, bandwidth, latency, burst=burst)
    raise typer.Exit(code)


def _shown(value) -> str:
    from bytecomp.compress.base import format_value

    return format_value(value)


def _warn(warnings: list[str]) -> None:
    """Warnings on stderr, one line each."""
    for warning in warnings:
        errors.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False,
                     soft_wrap=True)


def _error(message: str, code: int) -> None:
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


@contextlib.contextmanager
def _stop_signals_interrupt():
    """SIGTERM and SIGHUP (a closed terminal) stop a command as Ctrl-C does: its ranks are
    stopped, its temporaries removed, and it says so; not a silent death mid-stage."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in previous.items():
        if handler is signal.SIG_DFL:  # not where a caller set its own
            signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: user errors become one line and exit 2.

    Typer runs outside its standalone mode so that a bad option value, a missing
    argument or an unknown option is one line too, not a boxed usage screen.
    ``argv`` (default: ``sys.argv[1:]``) lets tests run a command in-process; the
    program is then named ``bytecomp``, as the console script names it.
    """
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

    try:
        with _stop_signals_interrupt():
            code = app(args=argv, prog_name=None if argv is None else "bytecomp",
                       standalone_mode=False)
    except BytecompError as error:
        _error(str(error), getattr(error, "exit_code", 2))
    except NoArgsIsHelpError as error:
        typer.echo(error.ctx.get_help())  # click's plain help, as --help prints it
        sys.exit(2)
    except UsageError as error:
        hint = f" (see {error.ctx.command_path} --help)" if error.ctx else ""
        _error(error.format_message() + hint, error.exit_code)
    except ClickException as error:
        _error(error.format_message(), error.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    if code == 130:
        errors.print("[bold red]interrupted[/]")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
