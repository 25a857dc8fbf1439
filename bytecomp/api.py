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
from typing import TYPE_CHECKING, Any

from bytecomp.commands.plan import PlanResult, load_cluster, run_plan
from bytecomp.errors import BytecompError
from bytecomp.mainguard import check_before_spawning
from bytecomp.option_fields import describe, path_argument
from bytecomp.options import (
    BenchOptions,
    PlanOptions,
    ProfileOptions,
    SimulateOptions,
)

if TYPE_CHECKING:
    from bytecomp.commands.bench import BenchResult
    from bytecomp.commands.simulate import Simulation
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
        from bytecomp.commands.profile import run_profile
        from bytecomp.launch import check_nproc
        from bytecomp.profiler import ProfileConfig

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
    plan file; return a :class:`~bytecomp.commands.plan.PlanResult`.

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


def simulate(profile: str | os.PathLike, plan: str | os.PathLike, *,
             options: SimulateOptions | None = None, **values: Any) -> Simulation:
    """Simulate one iteration of ``plan`` (a plan file) on ``profile``'s measurements
    (``bytecomp simulate``); ``trace=`` and ``png=`` write a Chrome trace and a Gantt
    chart, ``cluster=`` another cluster, ``level=`` an adaptive plan's level."""
    from bytecomp.commands.simulate import run_simulate

    chosen = SimulateOptions.build(options, **values)
    return run_simulate(path_argument(profile, "simulate", "the profile directory"),
                        path_argument(plan, "simulate", "the plan file"), chosen)


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
        from bytecomp.bencher import BenchConfig
        from bytecomp.commands.bench import BenchResult, run_bench
        from bytecomp.launch import check_nproc
    for warning in check_nproc(chosen.nproc):
        warn(warning)
    folder = run_bench(BenchConfig.from_options(profile, files, chosen), chosen.nproc)
    if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 wrote the files
        return None
    return BenchResult.read(folder)
