"""The pipeline from Python: :func:`profile`, :func:`plan`, :func:`simulate` and
:func:`bench`, each the library call under its command, on ``bytecomp`` itself::

    import bytecomp

    result = bytecomp.plan("profiles/transformer", cluster="gbe1", verify=False)
    print(result.strategies.head())

Each takes its command's options as keyword arguments, with the same names (``--min-gain``
is ``min_gain``) and the same defaults, declared once in :mod:`bytecomp.options`; a
repeatable option takes a list. Every value is checked against its option's declared
type (a bool is no number, a string no flag; a path may be an ``os.PathLike``), and a
:class:`~bytecomp.errors.BytecompError` (one line, naming the option as the command
spells it) comes before any work, as for a bad file; so does one for a
:class:`~bytecomp.profile_store.Profile` given to :func:`plan`, which is checked as a
profile directory is when read. Progress goes to stderr, as the commands show it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bytecomp.errors import BytecompError
from bytecomp.mainguard import check_before_spawning
from bytecomp.option_fields import describe, path_argument
from bytecomp.options import (
    BenchOptions,
    PlanOptions,
    ProfileOptions,
    SimulateOptions,
)
from bytecomp.search.pipeline import PlanResult, load_cluster, run_plan

if TYPE_CHECKING:
    import pandas as pd

    from bytecomp.plan_types import Plan
    from bytecomp.profile_store import Profile


def profile(model: str | None = None, *, options: ProfileOptions | None = None,
            **values: Any) -> Profile | None:
    """Measure a real DDP job (``bytecomp profile``) and return the profile written.

    ``model``: a built-in workload (``"transformer:layers=2"``) or a
    ``"pkg.module:factory"`` of yours, imported and built (default ``"mlp"``); the other
    options are :class:`~bytecomp.options.ProfileOptions`' (``nproc=2``, ``quick=True``,
    ``out=...``, ``budget=120``, ...). Spawns ``nproc`` local ranks, or runs on the ranks
    of the torchrun job this process belongs to, where every rank calls it: rank 0
    returns the profile, the other ranks None.
    """
    from bytecomp.profile_store import load_profile
    from bytecomp.ui import Stage, warn

    with Stage("loading torch", after_s=0, lines=False):  # seconds: say so, as bench does
        from bytecomp.launch import check_nproc
        from bytecomp.profiler import ProfileConfig, run_profile

    if model is not None:
        values["model"] = model
    chosen = ProfileOptions.build(options, **values)
    check_before_spawning()
    for warning in check_nproc(chosen.nproc):
        warn(warning)
    out = run_profile(ProfileConfig.from_options(chosen), chosen.nproc)
    if os.environ.get("RANK", "0") != "0":
        return None
    if chosen.calibrate_only:  # a calibration's tables: read them with load_calibration
        return None
    return load_profile(out)


def plan(profile: str | os.PathLike | Profile, *, options: PlanOptions | None = None,
         announce=None, **values: Any) -> PlanResult:
    """Plan a profile (``bytecomp plan``): search, train the finalists, choose, write the
    plan file; return a :class:`~bytecomp.search.pipeline.PlanResult`.

    ``profile``: a profile directory, or a :class:`~bytecomp.profile_store.Profile` read
    already (to plan one profile for many clusters without reading it each time); the
    options are
    :class:`~bytecomp.options.PlanOptions`' (``cluster="gbe1"``, ``verify=False``,
    ``compressor=["topk:ratio=0.01"]``, ``out=None`` to write no file, ...).
    ``announce``: called with the opening line of each long stage (default: printed on
    stderr, as the command does).
    """
    from bytecomp.ui import announce as print_line

    chosen = PlanOptions.build(options, **values)
    if chosen.verify and chosen.adaptive is None:  # the finalists train on spawned ranks
        check_before_spawning()
    from bytecomp.profile_store import Profile, check_profile

    if announce is not None and not callable(announce):
        raise BytecompError(f"bytecomp.plan(): announce must be a function of the line, "
                            f"got {describe(announce)}")
    # a Profile edited in memory is checked as its directory would be when read
    given = check_profile(profile) if isinstance(profile, Profile) else \
        path_argument(profile, "plan", "the profile (a directory, or a Profile)")
    return run_plan(given, chosen, print_line if announce is None else announce)


@dataclass
class Simulation:
    """One simulated iteration of a plan (:func:`simulate`): the times in ms, the busy time
    of every resource, the files written, the command's :attr:`table` and, group by
    group, when each was encoded, on the wire and done (:attr:`groups`)."""

    plan: str
    level: int | None
    cluster: str
    iteration_ms: float
    compute_ms: float
    backward_end_ms: float
    comm_end_ms: float
    busy_ms: dict[str, float]
    written: list[str] = field(default_factory=list)
    timeline: Any = None  # the simulator's result (events, per-group times)
    group_tensors: list[list[str]] = field(default_factory=list)  # per simulated group

    @property
    def groups(self) -> pd.DataFrame:
        """Per simulated group, in launch order: its tensors, its strategy, and when (ms,
        on the simulation's clock) it began (its first event), was encoded, went on the
        wire, came off it and was decoded: what ``Executor.record_group_times`` measures
        on a real run."""
        import pandas as pd

        spans: dict[int, dict[str, list[float]]] = {}
        for event in self.timeline.events if self.timeline is not None else []:
            if event.group >= 0:
                ops = spans.setdefault(event.group, {})
                ops.setdefault(event.op, []).extend((event.start, event.end))
        rows = []
        for index, ops in sorted(spans.items()):
            begun = min(t for times in ops.values() for t in times)
            encoded = max(ops.get("encode", [begun]))
            sent = min(ops.get("collective", [encoded]))
            received = max(ops.get("collective", [sent]))
            rows.append({"group": index, "tensors": self.group_tensors[index]
                         if index < len(self.group_tensors) else [],
                         "strategy": self.timeline.groups[index].label,
                         "launched_ms": begun, "encoded_ms": encoded, "sent_ms": sent,
                         "received_ms": received,
                         "done_ms": max(ops.get("decode", [received]) + [received])})
        return pd.DataFrame(rows)

    @property
    def exposed_ms(self) -> float:
        """The iteration's time not overlapped with compute."""
        return self.iteration_ms - self.compute_ms

    @property
    def table(self) -> pd.DataFrame:
        """The command's table: quantity and ms."""
        import pandas as pd

        rows = [("iteration", self.iteration_ms),
                ("compute only (forward + backward + optimizer)", self.compute_ms),
                ("exposed (not overlapped) time", self.exposed_ms),
                ("backward ends (after forward)", self.backward_end_ms),
                ("last group done (after forward)", self.comm_end_ms)]
        rows += [(f"busy {key.replace(':', ' ')}", value) for key, value in
                 self.busy_ms.items()]
        return pd.DataFrame(rows, columns=["quantity", "ms"])

    def to_dict(self) -> dict:
        """``simulate --format json``."""
        return {"plan": self.plan, "level": self.level, "cluster": self.cluster,
                "iteration_ms": self.iteration_ms, "compute_ms": self.compute_ms,
                "exposed_ms": self.exposed_ms, "backward_end_ms": self.backward_end_ms,
                "comm_end_ms": self.comm_end_ms, "busy_ms": self.busy_ms,
                "written": self.written}


def simulate(profile: str | os.PathLike, plan: str | os.PathLike, *,
             options: SimulateOptions | None = None, **values: Any) -> Simulation:
    """Simulate one iteration of ``plan`` (a plan file) on ``profile``'s measurements
    (``bytecomp simulate``); ``trace=`` and ``png=`` write a Chrome trace and a Gantt
    chart, ``cluster=`` another cluster, ``level=`` an adaptive plan's level."""
    from bytecomp.files import atomic_files, check_output_file, check_outputs_spare_inputs
    from bytecomp.plan_file import load_plan
    from bytecomp.profile_store import load_profile
    from bytecomp.search import Planner, simulate_plan
    from bytecomp.search.pipeline import input_files
    from bytecomp.search.plans import check_plan_fits
    from bytecomp.timeline.render import draw_gantt, write_trace

    chosen = SimulateOptions.build(options, **values)
    profile = path_argument(profile, "simulate", "the profile directory")
    plan = path_argument(plan, "simulate", "the plan file")
    outputs: dict[str, str | None] = {"--trace": chosen.trace, "--png": chosen.png}
    for option_name, path in outputs.items():
        if path:
            check_output_file(path, option_name)
    check_outputs_spare_inputs(outputs, input_files(profile, plan, chosen.cluster))
    loaded = load_profile(profile)
    the_plan: Plan = load_plan(plan)
    cluster = load_cluster(chosen.cluster)
    check_plan_fits(the_plan, loaded, cluster)
    level = chosen.level
    if level is not None or the_plan.levels:
        count = len(the_plan.levels or [])
        if not 0 <= (level or 0) < count:
            raise BytecompError(f"{plan} has no level {level} (" + (
                f"levels 0 to {count - 1})" if count else "it is not an adaptive plan)"))
        level = level or 0
        the_plan = the_plan.level(level)
    planner = Planner(loaded, cluster, the_plan.compressors or None, strict=True)
    result = simulate_plan(planner, the_plan)
    times = loaded.meta["times"]
    compute = sum(times[k]["median_ms"] for k in ("forward", "backward_compute", "optimizer"))
    written = [path for path in (chosen.trace, chosen.png) if path]
    with atomic_files(written) as temporaries:  # both written, then both renamed
        staged = dict(zip(written, temporaries))
        if chosen.trace:
            with open(staged[chosen.trace], "w") as stream:
                write_trace(result, stream, plan, planner.problem.tensors)
        if chosen.png:
            draw_gantt(result, staged[chosen.png], plan)
    names = [tensor.name for tensor in planner.problem.tensors]
    return Simulation(plan, level, planner.cluster.name, result.iteration_ms, compute,
                      result.backward_end_ms, result.comm_end_ms,
                      dict(sorted(result.breakdown().items())), written, result,
                      [[names[i] for i in group.members] for group in result.groups])


@dataclass
class BenchResult:
    """What :func:`bench` measured: ``strategies`` (bench.csv: measured and predicted ms
    per strategy), ``convergence`` (convergence.csv, with ``train_steps``), ``summary``
    (compute drift, prediction errors) and the output folder ``out``."""

    out: Path
    strategies: pd.DataFrame
    convergence: pd.DataFrame | None
    summary: dict[str, float]

    @classmethod
    def read(cls, folder: Path) -> BenchResult:
        import pandas as pd

        from bytecomp.bencher.report import prediction_summary

        results = pd.read_csv(folder / "bench.csv")
        convergence = folder / "convergence.csv"
        return cls(folder, results, pd.read_csv(convergence) if convergence.exists() else None,
                   prediction_summary(results))

    @property
    def files(self) -> list[str]:
        return sorted(path.name for path in self.out.iterdir())

    def to_dict(self) -> dict:
        """``bench --format json``: the rows of bench.csv (and convergence.csv), the
        table's caption (compute drift, prediction errors) and the files written."""
        return {"out": str(self.out), "files": self.files,
                "strategies": self.strategies.to_dict(orient="records"),
                "summary": self.summary,
                "convergence": None if self.convergence is None else
                self.convergence.to_dict(orient="records")}


def bench(profile: str | os.PathLike, plans: str | os.PathLike | list, *,
          options: BenchOptions | None = None, **values: Any) -> BenchResult | None:
    """Measure ``plans`` (a plan file, or a list: the first is named "bytecomp plan", the
    others by their files) and the baselines for real, beside the predictions
    (``bytecomp bench``); ``train_steps=N`` also trains each to a target validation loss.
    Spawns ``nproc`` ranks or runs on the torchrun job's: rank 0 returns the result, the
    other ranks None."""
    from bytecomp.ui import Stage, warn

    chosen = BenchOptions.build(options, **values)
    check_before_spawning()
    profile = path_argument(profile, "bench", "the profile directory")
    files = [path_argument(p, "bench", "a plan file")
             for p in (plans if isinstance(plans, (list, tuple)) else [plans])]
    if not files:
        raise BytecompError("bench needs a plan to measure (--plan)")
    if chosen.cluster is not None:  # checked before any rank starts
        load_cluster(chosen.cluster)
    with Stage("loading torch", after_s=0, lines=False):
        from bytecomp.bencher import BenchConfig, run_bench
        from bytecomp.launch import check_nproc
    for warning in check_nproc(chosen.nproc):
        warn(warning)
    folder = run_bench(BenchConfig.from_options(profile, files, chosen), chosen.nproc)
    if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 wrote the files
        return None
    return BenchResult.read(folder)
