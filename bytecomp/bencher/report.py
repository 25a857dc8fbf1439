"""``bytecomp bench``'s results as tables and files: the bench table and its caption,
time to accuracy, and the training's curves, step times and plot."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
from rich.table import Table

from bytecomp.training.convergence import (
    ConvergenceConfig,
    Training,
    steps_to,
    target_loss,
    time_at,
)

COMPUTE_ONLY = "compute only (no communication)"


def time_to_accuracy(training: Training, settings: ConvergenceConfig,
                     fidelities: dict[str, float | None]) -> pd.DataFrame:
    """Per strategy: steps and wall-clock time to the target validation loss (its typical
    step times summed up to there, and its raw ones), its median step time, final
    loss, divergence, predicted fidelity."""
    target = target_loss(list(training.curves.values()), settings)
    rows = []
    for name, curve in training.curves.items():
        steps = steps_to(curve, target)
        step_ms = [t for t in training.step_ms[name] if t == t]
        rows.append({
            "strategy": name, "iteration_ms": statistics.median(step_ms) if step_ms
            else math.nan, "target_loss": target,
            "steps_to_target": math.nan if steps is None else steps,  # NaN: never reached
            "time_to_target_s": math.nan if steps is None
            else time_at(training.typical_ms(name), steps),
            "time_to_target_raw_s": math.nan if steps is None else time_at(step_ms, steps),
            "final_loss": curve[-1][1], "diverged": not math.isfinite(curve[-1][1]),
            "predicted_fidelity": fidelities.get(name),
        })
    table = pd.DataFrame(rows)
    table["time_vs_fp32"] = table.time_to_target_s.iloc[0] / table.time_to_target_s
    table["steps_vs_fp32"] = table.steps_to_target / table.steps_to_target.iloc[0]
    return table


def _strategies_table(title: str, columns: tuple[str, ...]) -> Table:
    """An empty table of strategies: the strategy's column left-aligned, the others (the
    numbers) right-aligned."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    return table


def convergence_table(table: pd.DataFrame, settings: ConvergenceConfig) -> Table:
    target = table.target_loss.iloc[0]
    out = _strategies_table(f"time to a validation loss of {target:.4f} ({settings.train_steps} "
                            f"steps, evaluated every {settings.eval_every})",
                            ("strategy", "iteration ms", "steps to target", "time to target s",
                             "vs fp32", "final loss", "predicted fidelity"))
    for row in table.itertuples():
        reached = row.steps_to_target == row.steps_to_target  # not NaN
        out.add_row(row.strategy, f"{row.iteration_ms:.1f}",
                    f"{row.steps_to_target:.0f}" if reached else "not reached",
                    f"{row.time_to_target_s:.1f}" if reached else "-",
                    f"{row.time_vs_fp32:.2f}x" if reached else "-",
                    "diverged" if row.diverged else f"{row.final_loss:.4f}",
                    "-" if row.predicted_fidelity is None or row.predicted_fidelity !=
                    row.predicted_fidelity else f"{row.predicted_fidelity:.3f}")
    return out


def results_table(results: pd.DataFrame, profile, shape, config) -> Table:
    table = _strategies_table(f"bytecomp bench: {profile.meta['model']['spec']} on {shape[0]} x "
                              f"{shape[1]} ranks, median of {config.iterations} interleaved "
                              f"iterations",
                              ("strategy", "measured ms (p10-p90)", "predicted ms", "error",
                               "recalibrated ms", "error ", "vs fp32"))
    for row in results.itertuples():
        table.add_row(row.strategy, f"{row.measured_ms:.1f} ({row.p10_ms:.1f}-{row.p90_ms:.1f})",
                      f"{row.predicted_ms:.1f}", f"{100 * row.error:+.1f}%",
                      f"{row.recalibrated_ms:.1f}", f"{100 * row.recalibrated_error:+.1f}%",
                      f"{row.speedup_vs_fp32:.2f}x")
    summary = prediction_summary(results)
    table.caption = (f"compute drift since the profile: x{summary['compute_drift']:.3f}; "
                     f"prediction error: median {100 * summary['error_median']:.1f}%, worst "
                     f"{100 * summary['error_worst']:.1f}%; recalibrated for the drift: median "
                     f"{100 * summary['recalibrated_error_median']:.1f}%, worst "
                     f"{100 * summary['recalibrated_error_worst']:.1f}%")
    return table


def prediction_summary(results: pd.DataFrame) -> dict[str, float]:
    """The bench table's caption: the compute drift since the profile and the predictions'
    absolute errors (median and worst over the strategies, compute-only left out), raw and
    recalibrated for the drift."""
    strategies = results[results.strategy != COMPUTE_ONLY]
    raw, recalibrated = strategies["error"].abs(), strategies["recalibrated_error"].abs()
    return {"compute_drift": float(results.compute_drift.iloc[0]),
            "error_median": float(raw.median()), "error_worst": float(raw.max()),
            "recalibrated_error_median": float(recalibrated.median()),
            "recalibrated_error_worst": float(recalibrated.max())}


def write_training(training: Training, folder: Path) -> None:
    """``curves.csv`` (strategy, step, validation loss), ``steps.csv`` (strategy, step,
    ms) and, for adaptive plans, ``levels.csv`` (strategy, step, level, gain)."""
    pd.DataFrame([{"strategy": name, "step": step, "validation_loss": loss}
                  for name, curve in training.curves.items() for step, loss in curve]
                 ).to_csv(folder / "curves.csv", index=False)
    pd.DataFrame([{"strategy": name, "step": step + 1, "ms": ms}
                  for name, row in training.step_ms.items() for step, ms in enumerate(row)]
                 ).to_csv(folder / "steps.csv", index=False)
    if training.levels:
        pd.DataFrame([{"strategy": name, "step": step, "level": level, "gain": gain}
                      for name, rows in training.levels.items() for step, level, gain in rows]
                     ).to_csv(folder / "levels.csv", index=False)


def plot_curves(training: Training, target: float, path) -> None:
    """Validation loss against wall-clock time (each strategy's measured step times,
    summed); beneath, an adaptive plan's level and gain against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if training.levels else 1
    figure, axes = plt.subplots(rows, 1, figsize=(9, 5.5 * rows), squeeze=False)
    loss_axes = axes[0][0]
    for name, curve in training.curves.items():
        finite = [(s, loss) for s, loss in curve if math.isfinite(loss)]
        if not finite:
            continue
        step_ms = training.typical_ms(name)
        seconds = [time_at(step_ms, s) for s, _ in finite]
        loss_axes.plot(seconds, [loss for _, loss in finite], label=name,
                       linewidth=2.5 if name.startswith("bytecomp plan") else 1.2)
    loss_axes.axhline(target, color="grey", linestyle=":", label="target")
    loss_axes.set_xlabel("wall-clock time (s): each level's median step time x steps")
    loss_axes.set_ylabel("validation loss")
    loss_axes.legend(fontsize=7)
    if training.levels:
        level_axes = axes[1][0]
        gain_axes = level_axes.twinx()
        for name, levels in training.levels.items():
            steps = [step for step, _, _ in levels]
            level_axes.step(steps, [level for _, level, _ in levels], where="post",
                            label=f"{name}: level")
            gain_axes.plot(steps, [gain for _, _, gain in levels], linestyle=":",
                           label=f"{name}: smoothed gain")
        level_axes.set_xlabel("step")
        level_axes.set_ylabel("level (0 mildest)")
        gain_axes.set_ylabel("smoothed gain")
        gain_axes.set_ylim(0, 1.05)
        level_axes.legend(loc="upper left", fontsize=7)
        gain_axes.legend(loc="upper right", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
