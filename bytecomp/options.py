"""The options of ``bytecomp profile``, ``plan``, ``simulate`` and ``bench``, declared once.

Each command has one frozen dataclass here. Its fields are the command's options, with
their defaults and help (each declared with :func:`bytecomp.option_fields.option`); the
command line (:mod:`bytecomp.cli`) builds its options from the fields, and the library
functions (:func:`bytecomp.profile`, :func:`bytecomp.plan`, :func:`bytecomp.simulate`,
:func:`bytecomp.bench`) take the same names as keyword arguments.

:meth:`~bytecomp.option_fields.Options.build` checks every value against its field's
declared type first (:mod:`bytecomp.option_fields`), then ``check()`` range-checks them
(the range checks are here); either way one :class:`~bytecomp.errors.BytecompError`
line, naming the option as the command line spells it, before any work. Checks that need
the profile or torch stay with the stage that owns them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from bytecomp.buckets import SEARCHED_CAPS_MB
from bytecomp.errors import BytecompError
from bytecomp.option_fields import Options, cli_name, default_of, option
from bytecomp.plan_types import MAX_VERIFY_STEPS, Adaptive  # plan --verify-steps

ALGORITHMS = ("auto", "greedy", "local", "exact")  # plan --algorithm
MAX_EVALUATIONS = 10**9  # plan --evaluations (the annealing's)
DEFAULT_VERIFY_BUDGET_S = 180.0  # plan --verify-budget


# plan --gain-threshold (GraVAC's), --window and --timing: an adaptive plan's, declared
# on bytecomp.plan_types.Adaptive
DEFAULT_GAIN_THRESHOLD = default_of(Adaptive, "threshold")
DEFAULT_WINDOW = default_of(Adaptive, "window")
DEFAULT_TIMING = default_of(Adaptive, "timing")


def refuse_unused(unused: bool, why: str, options: dict[str, Any]) -> None:
    """One line for options given where they have no effect (``unused``)."""
    given = [name for name, value in options.items() if value is not None]
    if unused and given:
        raise BytecompError(f"{' and '.join(given)} {'has' if len(given) == 1 else 'have'} "
                            f"no effect {why}; leave {'it' if len(given) == 1 else 'them'} out")


def check_cluster(cluster: str | None) -> None:
    """One line for an empty --cluster (None: the profiled cluster)."""
    if cluster is not None and not cluster.strip():
        raise BytecompError("--cluster is empty: name a shipped cluster or a config file "
                            "(leave it out for the profiled cluster)")


def require_positive(option_name: str, value: float) -> None:
    if not 0 < value < math.inf:
        raise BytecompError(f"{option_name} must be a positive number, got {value:g}")


def _percent(option_name: str, value: float | None) -> None:
    if value is not None and not 0 <= value < 100:
        raise BytecompError(f"{option_name} is a percentage in [0, 100), got {value:g}")


def check_verification(steps: int | None, budget_s: float) -> None:
    """The finalists' training settings range-checked (``bytecomp plan``'s options and
    :func:`bytecomp.search.verify.verify` alike); one line for the first out of range."""
    if steps is not None and not 1 <= steps <= MAX_VERIFY_STEPS:
        raise BytecompError(f"--verify-steps must be from 1 to {MAX_VERIFY_STEPS:,}, got "
                            f"{steps}")
    require_positive("--verify-budget", budget_s)


def check_search(name: Callable[[str], str], algorithm: str, budget: float | None,
                 evaluations: int | None, min_gain: float | None,
                 stop_gap: float | None) -> None:
    """The search's settings range-checked, for ``bytecomp plan``'s options and
    :class:`~bytecomp.search.settings.SearchOptions` alike (one declaration of each range;
    ``name``: how the message names a setting, by its field name in PlanOptions); one line
    for the first out of range. The margin and the stop gap are percentages."""
    if algorithm not in ALGORITHMS:
        raise BytecompError(f"{name('algorithm')} must be {', '.join(ALGORITHMS[:-1])} or "
                            f"{ALGORITHMS[-1]}, got {algorithm!r}")
    if budget is not None and not 0 <= budget < math.inf:
        raise BytecompError(f"{name('budget')} must be a non-negative number of seconds, "
                            f"got {budget:g}")
    if evaluations is not None and not 0 <= evaluations <= MAX_EVALUATIONS:
        raise BytecompError(f"{name('evaluations')} must be an integer from 0 to "
                            f"{MAX_EVALUATIONS:,}, got {evaluations}")
    _percent(name("min_gain"), min_gain)
    _percent(name("stop_gap"), stop_gap)


# --max-mb's least: the sweeps start at 1 KiB and need several sizes
MIN_SWEEP_MB = 0.01
# The profile's settings ranged by check_profile_ranges (ProfileOptions' names)
PROFILE_RANGED = ("budget", "batch_size", "iterations", "warmup", "fidelity_iterations",
                  "probe_steps", "bucket_cap_mb", "timeout", "max_mb")


def check_profile_ranges(values: Mapping[str, Any]) -> None:
    """``bytecomp profile``'s numbers range-checked, for ProfileOptions and the profile's
    configuration (:class:`bytecomp.profiler.ProfileConfig`) alike: ``values`` by
    ProfileOptions' field names (:data:`PROFILE_RANGED`; a budget of None: none). The
    counts' least values are their fields' ``min``. One line for the first out of range."""
    budget = values["budget"]
    if budget is not None and not 0 < budget < math.inf:
        raise BytecompError(f"--budget must be a positive number of seconds, got {budget:g}")
    declared = {item.name: item.metadata for item in fields(ProfileOptions)}
    for name in ("batch_size", "iterations", "warmup", "fidelity_iterations", "probe_steps"):
        count, least = values[name], declared[name]["min"]
        if count is not None and (isinstance(count, bool) or count < least):
            raise BytecompError(f"{cli_name(ProfileOptions, name)} must be at least {least}, "
                                f"got {count}")
    for name in ("bucket_cap_mb", "timeout"):
        if not 0 < values[name] < math.inf:
            raise BytecompError(f"{cli_name(ProfileOptions, name)} must be a positive number, "
                                f"got {values[name]:g}")
    if not MIN_SWEEP_MB <= values["max_mb"] < math.inf:
        raise BytecompError(f"--max-mb must be at least {MIN_SWEEP_MB:g} (the sweeps start at "
                            f"1 KiB and need several sizes), got {values['max_mb']:g}")


@dataclass(frozen=True)
class ProfileOptions(Options):
    """``bytecomp profile``'s options, for :func:`bytecomp.profile`: each field is the option
    of that name with its default (``--min-gain`` is ``min_gain``; the help of every one:
    ``bytecomp profile --help`` and docs/commands/profile.md)."""

    command = "profile"

    model: str | None = option(None, "Built-in workload (mlp, cnn, transformer[:layers=4,"
                               "width=256,seq_len=128], lstm, digits, bow[:vocab=20000], resnet18, "
                               "resnet50, vgg16) or "
                               "pkg.module:factory [default: mlp].")
    nproc: int | None = option(None, "Local ranks to spawn (default 1; leave out under "
                               "torchrun, which sets the ranks).")
    out: str | None = option(None, "Profile directory (default profiles/<model>).", path=True)
    batch_size: int | None = option(None, "Batch per rank (default: the workload's).", min=1)
    bucket_cap_mb: float = option(25.0, "DDP bucket cap used while profiling.")
    iterations: int = option(20, "Timed iterations per phase.", min=1)
    warmup: int = option(3, "Untimed iterations before each phase.", min=0)
    compressor: tuple[str, ...] = option((), "Compressor spec to sweep (repeatable; default: "
                                         "every compressor at its defaults).")
    quick: bool = option(False, "A reduced sweep (seconds, not minutes).")
    force: bool = option(False, "Replace an existing profile directory.")
    device: str = option("auto", "auto, cpu or cuda.")
    timeout: float = option(300.0, "Seconds before a stuck collective fails.")
    max_mb: float = option(64.0, "Largest collective buffer in the sweeps (MiB).")
    machine: str = option("", "A description of the machine, kept in profile.yaml.")
    fidelity_iterations: int = option(10, "Training steps whose local gradients measure each "
                                      "compressor's gain (0: no fidelity table).", min=0)
    probe_steps: int | None = option(None, "Steps of the convergence probe: fp32 and every "
                                     "compressor on every tensor train this long from the same "
                                     "weights, for each compressor's measured steps factor (0: "
                                     "no probe; default: what is left of --budget, at most "
                                     "100; --quick 20).", min=0)
    budget: float = option(240.0, "Seconds on the clock the whole profile may take: each "
                           "stage before the probe has a share (the sweeps and executor costs "
                           "at most 40%), the convergence probe what they leave, stopping "
                           "sooner once its factors settle (--probe-steps forces a count "
                           "instead).")
    ladder: tuple[str, ...] = option((), "Also time every setting of this compressor "
                                     "family's adaptive ladder (repeatable: topk, randomk, "
                                     "dgc, exdyna, powersgd, acpsgd), for plan --adaptive.")
    optimizer: str | None = option(None, "The optimizer every training run of the profile uses "
                                   "(timing, gains, probe), replacing the workload's: "
                                   "sgd|adam|adamw[:lr=...,momentum=...,weight_decay=...,"
                                   "clip=...] (default: the workload recipe's; the built-ins: "
                                   "adam:lr=0.001).")
    scheduler: str | None = option(None, "The learning-rate schedule of the profile's "
                                   "training runs over many steps (the convergence probe; "
                                   "plan's finalists and bench --train-steps then train "
                                   "with it too), replacing the workload's: "
                                   "cosine[:steps=...,min_lr=...,warmup=...], "
                                   "step[:every=...,gamma=...,warmup=...] or "
                                   "warmup[:steps=...,start=...] (default: the recipe's; "
                                   "the built-ins: none).")
    calibration: str | None = option(None, "Reuse the cluster's tables of this calibration "
                                     "(--calibrate-only) or profile directory: collective, "
                                     "compressor, aggregation and copy sweeps, the executor's "
                                     "fixed costs. Refused in one line unless its world, "
                                     "backend, device and link match this job's.",
                                     path=True)
    calibrate_only: bool = option(False, "Measure the cluster's tables alone, no model: a "
                                  "calibration directory (--out, default "
                                  "profiles/calibration) for --calibration.",
                                  "--calibrate-only")
    cluster: tuple[str, ...] = option((), "A cluster the plans will be for (repeatable; a name "
                                      "or YAML file, as plan --cluster): the convergence "
                                      "probe trains only the compressors that could send "
                                      "some tensor sooner than fp32 there or on the "
                                      "profiled ranks (default: every compressor).",
                                      path=True)
    cache: bool = option(True, "Reuse the cluster's tables (sweeps, executor costs) that an "
                         "earlier profile on the same cluster measured, from the per-user "
                         "cache ($BYTECOMP_CACHE_DIR, else $XDG_CACHE_HOME/bytecomp or "
                         "~/.cache/bytecomp), and keep this profile's there; --no-cache "
                         "measures them afresh.")

    def check(self) -> None:
        check_profile_ranges({name: getattr(self, name) for name in PROFILE_RANGED})
        if self.device not in ("auto", "cpu", "cuda"):
            raise BytecompError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if self.calibrate_only and self.calibration is not None:
            raise BytecompError("--calibration and --calibrate-only do not go together: a "
                                "calibration measures the tables that --calibration reuses")
        refuse_unused(self.calibrate_only, "with --calibrate-only (no model is profiled)",
                      {"--model": self.model, "--batch-size": self.batch_size,
                       "--optimizer": self.optimizer, "--scheduler": self.scheduler})


@dataclass(frozen=True)
class PlanOptions(Options):
    """``bytecomp plan``'s options, for :func:`bytecomp.plan`: each field is the option
    of that name with its default (``--min-gain`` is ``min_gain``; the help of every one:
    ``bytecomp plan --help`` and docs/commands/plan.md)."""

    command = "plan"

    cluster: str | None = option(None, "Cluster config name or YAML file (default: the "
                                 "profiled cluster).", path=True)
    compressor: tuple[str, ...] = option((), "Allowed compressor spec (repeatable; default: "
                                         "every compressor in the profile).")
    out: str | None = option("plan.yaml", "Where to write the plan (from Python, None: "
                             "nowhere).", path=True)
    bucket_cap_mb: tuple[float, ...] = option(
        (), "Candidate DDP bucket cap (repeatable; 0: one bucket per tensor, no merging; "
        "default: the profiled cap, " + ", ".join(f"{c:g}" for c in SEARCHED_CAPS_MB) + ").")
    algorithm: str = option("auto", "auto, greedy, local (annealing over every option) or "
                            "exact (the default search, then branch and bound until the "
                            "optimum is proven or --budget is spent).")
    evaluations: int | None = option(None, "Evaluations of the model the annealing after the "
                                     "greedy spends, in full (default: 100,000 / tensors, from "
                                     "600 to 4,000). The search is deterministic: the same "
                                     "inputs and evaluations give the same plan.")
    budget: float | None = option(None, "Seconds: a wall-clock cap on the annealing (default: "
                                  "none), or with --algorithm exact on the whole search "
                                  "(default: 10). It only cuts a search short, and then the "
                                  "plan depends on the machine's speed.")
    stop_gap: float | None = option(None, "Percent: the search stops once its plan is "
                                    "predicted within this of the lower bound, so of the best "
                                    "plan there is (default 1 without --evaluations and "
                                    "--budget, or with --algorithm exact's --budget; else 0: "
                                    "what is asked is spent).")
    strict: bool = option(False, "Only the --compressor specs (by default the fp16 and "
                          "PowerSGD baselines' methods are candidates too).")
    min_gain: float | None = option(None, "Percent: unless the searched plan is predicted this "
                                    "much better (on the objective) than fp32 DDP, the plan is "
                                    "fp32 DDP (no other baseline: more compressors never give a "
                                    "worse plan; 0: always the searched plan; default 10 for "
                                    "effective time, 5 for time).")
    objective: str | None = option(None, "effective (iteration time / fidelity, the default "
                                   "where the profile measured fidelity) or time (iteration "
                                   "time alone, the default without).")
    min_fidelity: float | None = option(None, "With the effective objective: no plan whose "
                                        "fidelity is below this (default 0.75).")
    fidelity_weights: str = option("params", "How tensors' gains compose into a plan's "
                                   "fidelity: params (each tensor by its share of the "
                                   "parameters; Adam and the like) or norm (by its share of "
                                   "the gradient's squared norm; SGD).")
    probe: bool = option(True, "Calibrate the gains with the profile's convergence probe "
                         "(each compressor's measured steps factor), where it has one.")
    adaptive: str | None = option(None, "Plan a ladder of levels over this compressor family's "
                                  "settings in the profile (topk, randomk, dgc, exdyna, "
                                  "powersgd, acpsgd), for the executor to move along while "
                                  "training by the measured gain.")
    gain_threshold: float | None = option(None, "With --adaptive: the smoothed gain a level "
                                          "must keep (GraVAC's threshold), calibrated by the "
                                          "profile's convergence probe [default: "
                                          f"{DEFAULT_GAIN_THRESHOLD:g}].")
    window: int | None = option(None, "With --adaptive: steps of smoothing, and at a level "
                                f"before each decision [default: {DEFAULT_WINDOW}].")
    timing: str | None = option(None, "With --adaptive: score levels by step times the "
                                "executor measures, or by this plan's predictions (predicted: "
                                "the same decisions on every run) [default: "
                                f"{DEFAULT_TIMING}].")
    agree_every: int | None = option(None, "With --adaptive: steps whose measurements the "
                                     "ranks agree on in one allreduce [default: enough steps "
                                     "for about 100 ms of the start level's predicted "
                                     "iteration, at most --window].")
    verify: bool = option(True, "Train the finalists (the searched plan, the best plans with "
                          "other compressors, fp32 DDP and PyTorch's fp16 and PowerSGD hooks) "
                          "on the profiled ranks with the profile's recipe, and choose by "
                          "predicted time x measured steps; --no-verify plans from the "
                          "predictions alone.")
    verify_steps: int | None = option(None, "Steps each finalist trains, forced (default: what "
                                      "--verify-budget affords on the clock, at most 1,000, "
                                      "and fewer once fp32 DDP's validation loss has "
                                      "flattened).")
    verify_budget: float | None = option(None, "Seconds on the clock the finalists' training "
                                         "takes at most, the ranks' start-up included: the "
                                         "ranks time their first steps and fit the rest in; "
                                         "training stops sooner once fp32 DDP's validation "
                                         "loss has flattened "
                                         f"[default: {DEFAULT_VERIFY_BUDGET_S:g}].")
    nproc: int | None = option(None, "Ranks to spawn for the finalists (default: the "
                               "profile's; leave out under torchrun).")
    model: str | None = option(None, "The profile's model spec, where it is a "
                               "pkg.module:factory: the finalists train it only when you name "
                               "it here (a profile file never makes bytecomp run code).")
    static: bool = option(False, "Write the chosen plan alone: no runtime trial of the "
                          "finalists the prediction cannot separate, no controller.",
                          "--static")

    def check(self) -> None:
        from bytecomp.schema import MAX_BUCKET_CAP_MB

        check_search(lambda name: cli_name(PlanOptions, name), self.algorithm, self.budget,
                     self.evaluations, self.min_gain, self.stop_gap)
        for cap in self.bucket_cap_mb:
            if not 0 <= cap <= MAX_BUCKET_CAP_MB:  # also false for NaN
                raise BytecompError(f"--bucket-cap-mb must be a number of MB from 0 (one "
                                    f"bucket per tensor) to {MAX_BUCKET_CAP_MB:g}, got {cap:g}")
        self._check_verification()
        self._check_adaptive()
        refuse_unused(self.objective == "time", "with --objective time (fidelity is not "
                      "scored)", {"--min-fidelity": self.min_fidelity})
        check_cluster(self.cluster)

    def _check_verification(self) -> None:
        check_verification(self.verify_steps, self.verify_budget_s)
        refuse_unused(not self.verify, "with --no-verify (nothing is trained)",
                      {"--verify-steps": self.verify_steps,
                       "--verify-budget": self.verify_budget, "--model": self.model})
        refuse_unused(not self.verify, "with --no-verify (no finalists are trained or tried)",
                      {"--static": self.static or None, "--nproc": self.nproc})

    def _check_adaptive(self) -> None:
        from bytecomp.plan_types import Adaptive
        from bytecomp.schema import check_of

        adaptive = self.adaptive is not None
        refuse_unused(not adaptive, "without --adaptive (they set an adaptive plan's "
                      "controller)", {"--gain-threshold": self.gain_threshold,
                                      "--window": self.window, "--timing": self.timing,
                                      "--agree-every": self.agree_every})
        refuse_unused(adaptive, "with --adaptive (its levels are not trained)",
                      {"--model": self.model})
        refuse_unused(adaptive, "with --adaptive (an adaptive plan's levels are neither "
                      "trained nor tried at run time)",
                      {"--static": self.static or None, "--nproc": self.nproc,
                       "--verify-steps": self.verify_steps,
                       "--verify-budget": self.verify_budget})
        if not adaptive:
            return
        threshold = DEFAULT_GAIN_THRESHOLD if self.gain_threshold is None \
            else self.gain_threshold
        window = DEFAULT_WINDOW if self.window is None else self.window
        # the ranges Adaptive declares for the plan file, in the options' words
        gain, steps = check_of(Adaptive, "threshold"), check_of(Adaptive, "window")
        timings = check_of(Adaptive, "timing").choices
        if gain.problem(threshold):
            raise BytecompError(f"--gain-threshold must be between {gain.low:g} and "
                                f"{gain.high:g}, got {threshold:g}")
        if steps.problem(window):
            raise BytecompError(f"--window must be from {steps.least} to {steps.most:,} steps, "
                                f"got {window}")
        if (self.timing or DEFAULT_TIMING) not in timings:
            raise BytecompError(f"--timing must be {' or '.join(timings)}, got {self.timing!r}")
        agree = check_of(Adaptive, "agree_every")
        if self.agree_every is not None and agree.problem(self.agree_every):
            raise BytecompError(f"--agree-every must be from {agree.least} to {agree.most:,} "
                                f"steps, got {self.agree_every}")

    @property
    def verify_budget_s(self) -> float:
        """--verify-budget, or its default."""
        return DEFAULT_VERIFY_BUDGET_S if self.verify_budget is None else self.verify_budget


@dataclass(frozen=True)
class SimulateOptions(Options):
    """``bytecomp simulate``'s options, for :func:`bytecomp.simulate`: each field is the option
    of that name with its default (``--min-gain`` is ``min_gain``; the help of every one:
    ``bytecomp simulate --help`` and docs/commands/simulate.md)."""

    command = "simulate"

    cluster: str | None = option(None, "Cluster config (default: the profiled cluster).",
                                 path=True)
    trace: str | None = option(None, "Write a Chrome trace (open it in Perfetto).", path=True)
    png: str | None = option(None, "Write a Gantt chart PNG.", path=True)
    level: int | None = option(None, "An adaptive plan's level to simulate (default 0).")

    def check(self) -> None:
        check_cluster(self.cluster)


@dataclass(frozen=True)
class BenchOptions(Options):
    """``bytecomp bench``'s options, for :func:`bytecomp.bench`: each field is the option
    of that name with its default (``--min-gain`` is ``min_gain``; the help of every one:
    ``bytecomp bench --help`` and docs/commands/bench.md)."""

    command = "bench"

    out: str = option("bench", "Output directory (bench.csv, bench.md; with --train-steps "
                      "also curves.csv, convergence.csv, convergence.png).", path=True)
    compressor: tuple[str, ...] = option((), "Compressor for an 'on every tensor' baseline "
                                         "(repeatable; default: the plan's first, else "
                                         "topk:ratio=0.01 or the profile's first; with "
                                         "--train-steps every compressor in the profile).")
    cluster: str | None = option(None, "Cluster config of this job, for the predictions "
                                 "(default: the profiled cluster).", path=True)
    iterations: int = option(10, "Measured iterations per strategy.", min=1)
    warmup: int = option(3, "Iterations before measuring.", min=2)
    nproc: int | None = option(None, "Local ranks to spawn (leave out under torchrun or "
                               "bytecomp emulate).")
    force: bool = option(False, "Replace an existing output directory.")
    train_steps: int = option(0, "Also train every strategy this many steps from the same "
                              "weights and data, and report the time to a target validation "
                              "loss (0: timing only).", min=0)
    eval_every: int = option(25, "Steps between validation losses.", min=1)
    to_loss: float | None = option(None, "Target validation loss (default: fp32 DDP's loss "
                                   "at 60% of --train-steps).")
    lr: float | None = option(None, "With --train-steps: train with Adam at this rate instead "
                              "of the profile's recipe.")
    target_fraction: float = option(0.6, "With --train-steps and no --to-loss: the target is "
                                    "fp32 DDP's loss at this fraction of the steps.")
    every: bool = option(True, "Also one compressor on every tensor (every profiled "
                         "compressor with --train-steps); --no-every: only fp32 DDP, "
                         "PyTorch's hooks and the plans.")
    train_levels: bool = option(False, "With --train-steps: also train every level of an "
                                "adaptive plan as a static plan of its own.")
    reference_seed: int | None = option(None, "With --train-steps: also train fp32 DDP on a "
                                        "second data order, drawn with this seed (the "
                                        "run's own is 0), from the same weights: how far "
                                        "two equally good runs end apart, the loss's noise "
                                        "floor ('fp32 DDP, data seed S').", min=1)
    model: str | None = option(None, "The profile's model spec, where it is a "
                               "pkg.module:factory: bench builds it only when you name it here "
                               "(a profile file never makes bytecomp run code).")
    tables: bool = option(True, "Print the tables as bench runs (False: progress alone).",
                          cli=False)

    def check(self) -> None:
        if self.lr is not None:
            require_positive("--lr", self.lr)
        if not 0 < self.target_fraction <= 1:
            raise BytecompError(f"--target-fraction must be in (0, 1], got "
                                f"{self.target_fraction:g}")
        if self.to_loss is not None and not math.isfinite(self.to_loss):
            raise BytecompError(f"--to-loss must be a finite number, got {self.to_loss:g}")
        check_cluster(self.cluster)
        refuse_unused(not self.train_steps, "without --train-steps (nothing is trained)",
                      {"--reference-seed": self.reference_seed})
