"""What decided a verified plan, kept beside it where a user can look.

``bytecomp plan --out plan.yaml`` (with its finalists trained) also writes:

* ``plan.finalists.csv``: one row per finalist: its predicted step on the target
  cluster, its median step measured on the profiled ranks, its steps factor and where
  that came from (``trained`` here, ``probe``: the profile's convergence probe,
  ``fp32``: fp32 DDP's own steps, by definition), predicted time x factor, and which
  one was chosen;
* ``plan.curves.csv``: every finalist's validation loss at each evaluation, with the
  time the steps up to there would take on the target cluster (steps x the finalist's
  predicted step) and where the curve came from (``curve_from``: ``trained`` here, or
  fp32 DDP's trained curve stretched by the finalist's factor: ``probe`` or ``fp32``,
  :func:`finalist_curves`);
* ``plan.curves.png``: those curves against steps and against that predicted time,
  trained ones solid, the others dashed.

The plan file holds the factors and the choice (``info.finalists``,
``info.verification``); these files hold the curves they were read from.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

FINALISTS_COLUMNS = ["finalist", "source", "bucket_cap_mb", "predicted_ms", "measured_ms",
                     "steps_factor", "factor_from", "value_ms", "chosen"]
CURVES_COLUMNS = ["finalist", "step", "validation_loss", "predicted_s", "curve_from"]
REFERENCE = "fp32 DDP"  # bytecomp.search.verify.REFERENCE: the curve every factor reads


def finalist_curves(verification) -> dict[str, tuple[list, str]]:
    """Every finalist's validation curve and where it came from: ``trained`` (measured
    here), else fp32 DDP's trained curve with its steps stretched by the finalist's
    factor, the curve that factor stands for: ``probe`` (the profile's convergence probe
    measured the factor) or ``fp32`` (uncompressed: fp32 DDP's steps by definition). A
    finalist without a finite factor, or a run without fp32 DDP's curve, has none."""
    reference = verification.curves.get(REFERENCE)
    curves: dict[str, tuple[list, str]] = {}
    for finalist in verification.finalists:
        name, factor = finalist.name, finalist.steps_factor
        if name in verification.curves:
            curves[name] = (verification.curves[name], "trained")
        elif reference and factor is not None and factor == factor and factor < float("inf"):
            curves[name] = ([[round(step * factor, 3), loss] for step, loss in reference],
                            verification.factor_from.get(name, "probe"))
    return curves


def evidence_paths(out: str | Path) -> list[Path]:
    """The files written beside the plan ``out``: finalists CSV, curves CSV, curves PNG."""
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".yaml", ".yml") else out
    return [Path(f"{stem}.finalists.csv"), Path(f"{stem}.curves.csv"),
            Path(f"{stem}.curves.png")]


def finalists_csv(verification) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FINALISTS_COLUMNS)
    for finalist in verification.finalists:
        measured = verification.step_ms.get(finalist.name)
        writer.writerow([finalist.name, finalist.source, finalist.cap_mb,
                         round(finalist.time_ms, 4),
                         "" if measured is None else round(measured, 4),
                         "" if finalist.steps_factor is None else round(finalist.steps_factor, 4),
                         verification.factor_from.get(finalist.name, "untrained"),
                         round(finalist.value, 4),
                         finalist is verification.choice.finalist])
    return out.getvalue()


def curves_csv(verification) -> str:
    predicted = {f.name: f.time_ms for f in verification.finalists}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CURVES_COLUMNS)
    for name, (curve, origin) in finalist_curves(verification).items():
        for step, loss in curve:
            writer.writerow([name, step, loss, round(step * predicted[name] / 1000, 6),
                             origin])
    return out.getvalue()


def draw_curves(verification, path: Path, title: str) -> None:
    """Validation loss against steps and against predicted time, one line per finalist
    (the chosen one thicker): solid with markers where trained, dashed where the curve
    is fp32 DDP's stretched by a factor the probe measured (or fp32's own steps)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    predicted = {f.name: f.time_ms for f in verification.finalists}
    chosen = verification.choice.finalist.name
    figure = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(figure)
    by_steps, by_time = figure.subplots(1, 2)
    for name, (curve, origin) in finalist_curves(verification).items():
        steps = [step for step, _ in curve]
        losses = [loss for _, loss in curve]
        width = 2.5 if name == chosen else 1.2
        how = {"trained": "trained", "probe": "probe's factor x fp32 DDP's curve",
               "fp32": "fp32 DDP's steps"}.get(origin, origin)
        label = f"{name} ({how}{', chosen' if name == chosen else ''})"
        style = {"marker": "o", "markersize": 3} if origin == "trained" else \
            {"linestyle": "--"}
        by_steps.plot(steps, losses, linewidth=width, label=label, **style)
        by_time.plot([s * predicted[name] / 1000 for s in steps], losses, linewidth=width,
                     label=label, **style)
    by_steps.set_xlabel("steps")
    by_time.set_xlabel("predicted time on the target cluster (s)")
    for axes in (by_steps, by_time):
        axes.set_ylabel(f"validation loss ({verification.batches})")
        axes.grid(alpha=0.3)
    by_time.legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def write_evidence(verification, staged: list[Path], title: str) -> None:
    """Write the three files (see the module docstring) to ``staged`` (temporaries the
    caller renames into :func:`evidence_paths`' places with the plan)."""
    staged[0].write_text(finalists_csv(verification))
    staged[1].write_text(curves_csv(verification))
    draw_curves(verification, staged[2], title)
