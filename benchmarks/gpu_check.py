"""The CUDA path on a GPU machine, in one report (``make gpu-check``).

1. the tests marked ``cuda`` (compressors on CUDA tensors against the CPU, state
   round trips, apply_plan with device and host placement, the profiler on one
   GPU; the fused Triton kernels against the PyTorch path, tests/test_kernels.py);
2. ``benchmarks/compressors.py --device cuda``: encode and decode GB/s against a
   device copy of the same tensor, the fused kernels and the PyTorch path side by
   side, and the 50%-of-copy target;
3. ``benchmarks/executor_overhead.py --device cuda``: the executor's hooks, gain
   metering and an adaptive plan's controller against PyTorch's hooks, per
   iteration on one NCCL rank;
4. a one-GPU profile -> plan -> simulate of the transformer.

Writes ``benchmarks/results/gpu-check-<date>.md`` (or ``--out``) with each
step's output; exits non-zero if a step failed. Without a GPU it says so and
exits 2.

    python benchmarks/gpu_check.py [--out report.md]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BYTECOMP = [sys.executable, "-m", "bytecomp"]
TRANSFORMER = "transformer:layers=2,width=128,heads=4,seq_len=64,vocab=256"


def step(title: str, command: list[str], report: list[str], timeout: float = 1800) -> bool:
    print(f"== {title}: {' '.join(command)}", flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                timeout=timeout)
        output, ok = result.stdout + result.stderr, result.returncode == 0
    except subprocess.TimeoutExpired as error:
        output, ok = f"timed out after {timeout:.0f} s\n{error.stdout or ''}", False
    print(output[-4000:], flush=True)
    report += [f"## {title}", "", f"`{' '.join(command)}`: {'passed' if ok else 'FAILED'}", "",
               "```", output.strip()[-12000:], "```", ""]
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    today = datetime.date.today().isoformat()
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                             f"gpu-check-{today}.md"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine", file=sys.stderr)
        raise SystemExit(2)
    from bytecomp.compress import kernels

    device = torch.cuda.get_device_name(0)
    report = [f"# gpu-check {today}", "",
              f"{device}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
              f"{torch.cuda.device_count()} GPU(s); compressor kernels: "
              f"{kernels.describe(torch.device('cuda', 0))}", ""]
    results = [step("tests marked cuda", [sys.executable, "-m", "pytest", "-q", "-m", "cuda",
                                          "tests/test_cuda.py", "tests/test_kernels.py"],
                    report)]
    results.append(step("compressor throughput on the GPU",
                        [sys.executable, "benchmarks/compressors.py", "--device", "cuda"],
                        report))
    results.append(step("executor overhead on the GPU",
                        [sys.executable, "benchmarks/executor_overhead.py", "--device", "cuda",
                         "--nproc", "1", "--model", TRANSFORMER, "--trials", "3",
                         "--rounds", "60"], report))
    with tempfile.TemporaryDirectory() as work:
        profile, plan = Path(work) / "profile", Path(work) / "plan.yaml"
        results.append(step("profile the transformer on one GPU",
                            [*BYTECOMP, "profile", "--model", "transformer", "--nproc", "1",
                             "--device", "cuda", "--quick", "--out", str(profile)], report))
        if results[-1]:
            results.append(step("plan it for an 8 x 8 V100 cluster",
                                [*BYTECOMP, "plan", str(profile), "--cluster",
                                 "v100-nvlink-100g", "--out", str(plan)], report))
        if results[-1]:
            results.append(step("simulate the plan",
                                [*BYTECOMP, "simulate", str(profile), str(plan), "--cluster",
                                 "v100-nvlink-100g"], report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report) + "\n")
    print(f"wrote {out}")
    if not all(results):
        raise SystemExit(f"gpu-check: {results.count(False)} step(s) failed; see {out}")


if __name__ == "__main__":
    main()
