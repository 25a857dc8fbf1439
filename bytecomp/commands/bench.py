"""``bytecomp bench`` from start to finish (what :func:`bytecomp.bench` calls): check the
profile, the plans and the output before any rank starts, run the bench's ranks
(:mod:`bytecomp.bencher.runner`), and read back what rank 0 wrote (:class:`BenchResult`).

>>> from bytecomp.bencher import BenchConfig
>>> from bytecomp.commands.bench import run_bench
>>> run_bench(BenchConfig(profile="profiles/cnn", plan="plan.yaml", out="bench"), nproc=2)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bytecomp.errors import BytecompError

if TYPE_CHECKING:  # light to import (bytecomp.BenchResult): torch and pandas on first use
    import pandas as pd

    from bytecomp.bencher.runner import BenchConfig


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


def _rank(config: BenchConfig, nodes: int, ranks_per_node: int) -> None:
    from bytecomp.bencher.runner import bench_rank

    bench_rank(config)


def _check_other_plan(plan, profile, cluster) -> None:
    """A further ``--plan`` runs on this job as it is: for another model or world size it
    is an error; made for another shape of the same world size (an adaptive plan made
    for a slow 2 x 1 cluster, benched on one node), a named warning."""
    from bytecomp.search.plans import check_plan_fits

    shape = (cluster.nodes, cluster.ranks_per_node) if cluster else \
        (profile.nodes, profile.ranks_per_node)
    if plan.model_fingerprint != profile.fingerprint or plan.world_size != shape[0] * shape[1]:
        check_plan_fits(plan, profile, cluster)  # the one-line error
    if (plan.nodes, plan.ranks_per_node) != shape:
        warnings.warn(f"{plan.path} is for {plan.nodes} x {plan.ranks_per_node} ranks (nodes x "
                      f"ranks per node) but this job has {shape[0]} x {shape[1]}: it is "
                      f"measured, and its groups predicted, on this job's shape",
                      UserWarning, stacklevel=2)


def run_bench(config: BenchConfig, nproc: int | None = None, timeout_s: float = 600) -> Path:
    """Benchmark on ``nproc`` spawned ranks or on this torchrun (or emulate) job."""
    import torch

    from bytecomp.costs.clusters import cluster_file, load_cluster
    from bytecomp.files import check_new_directory, check_outputs_spare_inputs
    from bytecomp.launch import backend_for, run_job
    from bytecomp.model_spec import allowed_model
    from bytecomp.plan_file import load_plan
    from bytecomp.profile_store import load_profile, profile_files
    from bytecomp.search.plans import check_plan_fits

    profile = load_profile(config.profile)  # bad files fail here, once, before any rank starts
    allowed_model(profile.meta["model"].get("spec"), config.model, profile.label,
                  "bench a profile of a built-in model")  # before any rank imports it
    cluster = load_cluster(config.cluster) if config.cluster else None
    check_plan_fits(load_plan(config.plan), profile, cluster)  # its predictions are compared
    for path in config.other_plans:
        _check_other_plan(load_plan(path), profile, cluster)
    if "iteration_compute" not in profile.meta["times"]:
        raise BytecompError(f"{profile.label}: profile.yaml has no times.iteration_compute, "
                            f"which bench compares with; re-run bytecomp profile")
    inputs = profile_files(config.profile) + [Path(p) for p in [config.plan, *config.other_plans]]
    config_file = cluster_file(config.cluster) if config.cluster else None
    inputs += [config_file] if config_file is not None else []
    check_outputs_spare_inputs({"--out": config.out}, inputs)
    out = check_new_directory(config.out, config.force, inputs=inputs)
    backend = backend_for("cuda" if torch.cuda.is_available() else "cpu")
    run_job(_rank, (config,), nproc, backend, timeout_s)
    return out

