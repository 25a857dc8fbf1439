"""Run-to-run stability of ``bytecomp profile``.

Profiles the same workload twice, one run after the other, and reports the
median relative difference between the runs of the per-tensor ready times,
the iteration time, and the world allreduce times (float32, every size).
Relative difference of a pair: |a - b| / mean(a, b). Target: within 10%.

Two more rows help read the result on a shared machine: the ready-time curve
divided by the backward time (its shape, which is what decides overlap), and
a machine reference, a fixed single-thread matrix-multiply loop timed for a
few seconds just before each profile: its run-to-run difference is the noise
floor of the machine itself, which no profiler can go below.

    python benchmarks/profile_stability.py --model cnn --nproc 2 [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from bytecomp.commands.profile import run_profile
from bytecomp.profiler import ProfileConfig, load_profile


def relative_differences(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return np.abs(a - b) / np.maximum((a + b) / 2, 1e-12)


def median_difference(a, b) -> float:
    """Median relative difference of two aligned series (NaN when they are empty)."""
    return float(np.median(relative_differences(a, b))) if len(a) else float("nan")


def machine_reference_ms(seconds: float = 5.0) -> float:
    """Median time of a 512x512 float32 matrix product on one thread."""
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        begin = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - begin)
    torch.set_num_threads(threads)
    return 1000 * float(np.median(times))


def compare(first, second) -> dict[str, float]:
    tensors = first.tensors.merge(second.tensors, on="name", suffixes=("_1", "_2"))
    allreduce = [p.collectives.query("collective == 'allreduce' and group == 'world' and "
                                     "dtype == 'float32'") for p in (first, second)]
    merged = pd.merge(*allreduce, on="bytes", suffixes=("_1", "_2"))
    small = merged[merged.bytes < (1 << 20)]
    large = merged[merged.bytes >= (1 << 20)]
    return {
        "per-tensor ready time": median_difference(tensors.ready_ms_1, tensors.ready_ms_2),
        "ready time / backward time": median_difference(
            tensors.ready_ms_1 / first.time_ms("backward_compute"),
            tensors.ready_ms_2 / second.time_ms("backward_compute")),
        "iteration time (DDP)": float(relative_differences(
            [first.time_ms("iteration")], [second.time_ms("iteration")])[0]),
        "backward compute time": float(relative_differences(
            [first.time_ms("backward_compute")], [second.time_ms("backward_compute")])[0]),
        "allreduce time (all sizes)": median_difference(merged.time_ms_1, merged.time_ms_2),
        "allreduce time (under 1 MiB)": median_difference(small.time_ms_1, small.time_ms_2),
        "allreduce time (1 MiB and up)": median_difference(large.time_ms_1, large.time_ms_2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--compressor", action="append", default=["fp16"],
                        help="specs to sweep (the compressor sweep is not compared)")
    parser.add_argument("--markdown", help="also write the table as markdown here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        profiles, reference = [], []
        for run in (1, 2):
            reference.append(machine_reference_ms())
            out = Path(scratch) / f"run{run}"
            run_profile(ProfileConfig(model=args.model, out=str(out), quick=args.quick,
                                      specs=args.compressor), args.nproc)
            profiles.append(load_profile(out))
    table = Table(title=f"profile stability: {args.model} on {args.nproc} ranks, two runs"
                        f"{' (quick)' if args.quick else ''}")
    table.add_column("quantity")
    table.add_column("median relative difference", justify="right")
    table.add_column("target", justify="right")
    results = compare(*profiles)
    results["machine reference (matmul loop)"] = float(relative_differences(*zip(reference))[0])
    lines = ["| quantity | median relative difference |", "|---|---|"]
    for name, value in results.items():
        table.add_row(name, f"{100 * value:.1f}%", "<= 10%" if "machine" not in name else "")
        lines.append(f"| {name} | {100 * value:.1f}% |")
    Console().print(table)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
