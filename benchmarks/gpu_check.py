"""The CUDA path on a GPU machine, in one report (``make gpu-check``).

1. the tests marked ``cuda`` (compressors on CUDA tensors against the CPU, state
   round trips, ``apply_plan`` with device and host placement: gloo carrying CUDA
   tensors on 1 and 2 ranks sharing one GPU, and bytecomp's own NCCL + gloo group on
   one rank per GPU; the profiler on one GPU; the fused Triton kernels against the
   PyTorch path, tests/test_kernels.py);
2. ``benchmarks/compressors.py --device cuda`` at 1M, 16M and 64M elements: encode
   and decode GB/s against a device copy of the same tensor, the fused kernels and the
   PyTorch path side by side, and the 50%-of-copy target (its markdown table, columns
   whole);
3. ``benchmarks/executor_overhead.py --device cuda``: the executor's hooks, gain
   metering and an adaptive plan's controller against PyTorch's hooks, per
   iteration on one NCCL rank;
4. a one-GPU ``bytecomp profile`` -> ``plan --no-verify`` -> ``simulate`` of the
   transformer.

Every step has a timeout; together they fit in about 8 minutes, half a lent GPU's
15, so the whole check can run again. Writes ``benchmarks/results/gpu-check-<date>.md``
(or ``--out``) with each step's output; exits non-zero if a step failed. Without a
GPU it says so and exits 2.

``--cpu`` runs the same steps on the CPU, small (the kernels under Triton's
interpreter, the cuda tests skipped, the compressors at 1M elements, a one-layer
transformer): a check that
the script still runs against the code, never a GPU figure (its report says so).

    python benchmarks/gpu_check.py [--out report.md]
    python benchmarks/gpu_check.py --cpu --out /tmp/gpu-check-dry.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BYTECOMP = [sys.executable, "-m", "bytecomp"]
TRANSFORMER = "transformer:layers=2,width=128,heads=4,seq_len=64,vocab=256"
GPU_SIZES = [1 << 20, 1 << 24, 1 << 26]
CPU_SIZES = [1 << 20]
DEVICE = "cuda"
CPU_MODEL = "transformer:layers=1,width=32,heads=2,seq_len=16,vocab=64"  # --cpu: small


SLACK = {"cuda": 1.0, "cpu": 4.0}  # --cpu: a 2-core CPU is slow, and only the script counts


def step(title: str, command: list[str], report: list[str], timeout: float,
         env: dict | None = None) -> bool:
    timeout *= SLACK[DEVICE]
    print(f"== {title} (at most {timeout:.0f} s): {' '.join(command)}", flush=True)
    environment = {**os.environ, "COLUMNS": "200", **(env or {})}  # rich tables whole
    try:
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                timeout=timeout, env=environment)
        output, ok = result.stdout + result.stderr, result.returncode == 0
    except subprocess.TimeoutExpired as error:
        partial = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout
        output, ok = f"timed out after {timeout:.0f} s\n{partial or ''}", False
    print(output[-4000:], flush=True)
    report += [f"## {title}", "", f"`{' '.join(command)}`: {'passed' if ok else 'FAILED'}", "",
               "```", output.strip()[-12000:], "```", ""]
    return ok


def ranks_line(device: str) -> str:
    """Which collectives carried apply_plan's CUDA tensors in the cuda tests."""
    if device != "cuda":
        return "dry run on the CPU: no CUDA tensors, no NCCL (not a GPU measurement)"
    gpus = torch.cuda.device_count()
    return (f"apply_plan in the cuda tests: gloo carrying CUDA tensors on 1 and 2 ranks "
            f"sharing GPU 0; NCCL (bytecomp's cpu:gloo,cuda:nccl group) on 1 rank; "
            f"{gpus} GPU(s) here" + (", so NCCL across ranks was not run" if gpus < 2 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    today = datetime.date.today().isoformat()
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                             f"gpu-check-{today}.md"))
    parser.add_argument("--cpu", action="store_true",
                        help="the same steps on the CPU, small: the script against the code")
    args = parser.parse_args()
    global DEVICE
    device = DEVICE = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (--cpu runs the steps on the CPU)",
              file=sys.stderr)
        raise SystemExit(2)
    from bytecomp.compress import kernels

    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run)"
    report = [f"# gpu-check {today}", "",
              f"{where}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
              f"compressor kernels: {kernels.describe(torch.device(device, 0))}", "",
              ranks_line(device), ""]
    tests = ["tests/test_cuda.py", "tests/test_kernels.py"]
    results = [step("tests marked cuda", [sys.executable, "-m", "pytest", "-q", "-m", "cuda",
                                          *tests], report, timeout=240)
               if device == "cuda" else
               step("the kernels under Triton's interpreter (cuda tests skip)",
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                    report, timeout=240)]
    with tempfile.TemporaryDirectory() as work:
        table = Path(work) / "compressors.md"
        sizes = GPU_SIZES if device == "cuda" else CPU_SIZES
        results.append(step(f"compressor throughput on the {device}",
                            [sys.executable, "benchmarks/compressors.py", "--device", device,
                             "--sizes", *map(str, sizes), "--markdown", str(table)],
                            report, timeout=150))
        if table.exists():
            report += ["### the table, columns whole", "", table.read_text().strip(), ""]
        results.append(step(f"executor overhead on the {device}",
                            [sys.executable, "benchmarks/executor_overhead.py", "--device",
                             device, "--nproc", "1", "--model", TRANSFORMER, "--trials", "3",
                             "--rounds", "60" if device == "cuda" else "10"],
                            report, timeout=90))
        profile, plan = Path(work) / "profile", Path(work) / "plan.yaml"
        model = "transformer" if device == "cuda" else CPU_MODEL
        results.append(step(f"profile the transformer on one {device}",
                            [*BYTECOMP, "profile", "--model", model, "--nproc", "1",
                             "--device", device, "--quick", "--out", str(profile)],
                            report, timeout=150))
        if results[-1]:
            results.append(step("plan it for an 8 x 8 V100 cluster (--no-verify)",
                                [*BYTECOMP, "plan", str(profile), "--cluster",
                                 "v100-nvlink-100g", "--no-verify", "--out", str(plan)],
                                report, timeout=30))
        if results[-1]:
            results.append(step("simulate the plan",
                                [*BYTECOMP, "simulate", str(profile), str(plan), "--cluster",
                                 "v100-nvlink-100g"], report, timeout=20))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report) + "\n")
    print(f"wrote {out}")
    if not all(results):
        raise SystemExit(f"gpu-check: {results.count(False)} step(s) failed; see {out}")


if __name__ == "__main__":
    main()
