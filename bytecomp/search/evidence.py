"""What decided a verified plan, kept beside it where a user can look.

``bytecomp plan --out plan.yaml`` (with its finalists trained) also writes:

* ``plan.finalists.csv``: one row per finalist: its predicted step on the target
  cluster, its median step measured on the profiled ranks, its steps factor and where
  that came from (``trained`` here, ``probe``: the profile's convergence probe,
  ``fp32``: fp32 DDP's own steps, by definition), predicted time x factor, and which
  one was chosen;
* ``plan.curves.csv``: every trained finalist's validation loss at each evaluation,
  with the time the steps up to there would take on the target cluster (steps x the
  finalist's predicted step);
* ``plan.curves.png``: those curves against steps and against that predicted time.

The plan file holds the factors and the choice (``info.finalists``,
``info.verification``); these files hold the curves they were read from.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

FINALISTS_COLUMNS = ["finalist", "source", "bucket_cap_mb", "predicted_ms", "measured_ms",
                     "steps_factor", "factor_from", "value_ms", "chosen"]
CURVES_COLUMNS = ["finalist", "step", "validation_loss", "predicted_s"]


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
    for name, curve in verification.curves.items():
        for step, loss in curve:
            writer.writerow([name, step, loss, round(step * predicted[name] / 1000, 6)])
    return out.getvalue()


def draw_curves(verification, path: Path, title: str) -> None:
    """Validation loss against steps and against predicted time, one line per trained
    finalist (the chosen one thicker)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    predicted = {f.name: f.time_ms for f in verification.finalists}
    chosen = verification.choice.finalist.name
    figure = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(figure)
    by_steps, by_time = figure.subplots(1, 2)
    for name, curve in verification.curves.items():
        steps = [step for step, _ in curve]
        losses = [loss for _, loss in curve]
        width = 2.5 if name == chosen else 1.2
        label = f"{name} (chosen)" if name == chosen else name
        by_steps.plot(steps, losses, marker="o", markersize=3, linewidth=width, label=label)
        by_time.plot([s * predicted[name] / 1000 for s in steps], losses, marker="o",
                     markersize=3, linewidth=width, label=label)
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
