"""A time-to-accuracy cell with GPU compute: two ranks on one GPU over a shaped link.

The convergence matrix (``convergence_matrix.py``) runs every backward pass on two CPU
cores, where encoding competes with the backward for the same cores. Here the two
ranks share one CUDA GPU (each in its own network namespace of ``bytecomp emulate``,
2 nodes x 1 rank, the link between them shaped to ``--bandwidth``), so encoding
overlaps the backward as on a GPU cluster. NCCL refuses two ranks on one GPU, so the
ranks run gloo, which carries the CUDA tensors through the host
(``BYTECOMP_BACKEND=gloo``): the shaped link, not NVLink, is what they share.

The task is the matrix's charlm-adam scaled up so that a step is compute-meaningful on
a GPU (``--task`` sets another). For each link rate: ``bytecomp profile`` (on the GPU,
with the convergence probe), ``bytecomp plan`` (its finalists trained on the same two
ranks), then one ``bytecomp bench`` that times fp32 DDP, PyTorch's fp16 and PowerSGD
hooks and the plan and trains them from the same weights to fp32 DDP's final loss.
The summary has the matrix's table (steps and seconds to fp32's final loss) and each
strategy's step-time prediction error.

    sudo python benchmarks/gpu_cell.py --out benchmarks/results/gpu_cell
    sudo python benchmarks/gpu_cell.py --device cpu --smoke   # the driver, on the CPU

Needs root (network namespaces) and, without ``--device cpu``, a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from convergence import BYTECOMP, run  # noqa: E402
from convergence_matrix import markdown  # noqa: E402
from machine_load import load  # noqa: E402

GPU_TASK = "transformer:layers=6,width=512,heads=8,seq_len=256,vocab=256"
SMOKE_TASK = "transformer:layers=1,width=32,heads=2,seq_len=16,vocab=64"
COMPRESSORS = ["fp16", "int8", "topk:ratio=0.01", "powersgd:rank=4", "efsignsgd"]
BANDWIDTHS = ["1gbit", "10gbit"]
STRATEGIES = ["fp32 DDP", "fp16 hook", "PowerSGD hook", "bytecomp plan"]


def cell(bandwidth: str, out: Path, args) -> Path:
    """Profile, plan and bench one link rate; files in out/<cell>/."""
    folder = out / f"gpu-{args.device}-2x1-{bandwidth}"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "log.txt"
    emulate = [*BYTECOMP, "emulate", "--nodes", "2", "--bandwidth", bandwidth, "--"]
    profile = folder / "profile"
    steps = args.steps
    with open(log, "a") as stream:
        stream.write(f"# {load()}\n")
    run([*emulate, *BYTECOMP, "profile", "--model", args.task, "--device", args.device,
         "--batch-size", str(args.batch_size), "--out", str(profile), "--force",
         "--warmup", "2", "--iterations", "6" if not args.smoke else "2", "--max-mb", "16",
         *[flag for spec in COMPRESSORS for flag in ("--compressor", spec)],
         *(["--quick", "--probe-steps", "4"] if args.smoke else []),
         "--machine", f"emulated 2x1 at {bandwidth}, two ranks on one {args.device}"], log)
    plan = folder / "plan.yaml"
    run([*BYTECOMP, "plan", str(profile), "--out", str(plan),
         *(["--verify-steps", "4"] if args.smoke else [])], log)
    run([*emulate, *BYTECOMP, "bench", str(profile), "--plan", str(plan),
         "--out", str(folder / "bench"), "--force", "--iterations", "3" if args.smoke else "6",
         "--no-every", "--train-steps", str(int(steps * 1.5)), "--target-fraction",
         f"{1 / 1.5:.6f}", "--eval-every", str(max(1, steps // 8))], log)
    with open(log, "a") as stream:
        stream.write(f"# {load()}\n")
    return folder


def rows(folder: Path) -> pd.DataFrame:
    """The cell's strategies: steps and seconds to fp32's final loss, measured and
    predicted step, and the prediction's error."""
    training = pd.read_csv(folder / "bench" / "convergence.csv")
    training["strategy"] = ["PowerSGD hook" if name.startswith("PowerSGD hook") else name
                            for name in training.strategy]
    timing = pd.read_csv(folder / "bench" / "bench.csv")
    timing["strategy"] = ["PowerSGD hook" if name.startswith("PowerSGD hook") else name
                          for name in timing.strategy]
    table = training.set_index("strategy").join(
        timing.set_index("strategy")[["measured_ms", "predicted_ms"]], how="left")
    names = [name for name in STRATEGIES if name in table.index]
    cell = table.loc[names, ["steps_to_target", "time_to_target_s", "measured_ms",
                             "predicted_ms"]].copy()
    cell["prediction_error"] = (cell.predicted_ms - cell.measured_ms) / cell.measured_ms
    cell.insert(0, "cell", folder.name)
    return cell.reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_cell"))
    parser.add_argument("--bandwidth", action="append", choices=BANDWIDTHS)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--task", default=None, help=f"model spec (default {GPU_TASK})")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300, help="fp32 DDP's steps to its "
                        "final loss (everything trains 1.5x as many)")
    parser.add_argument("--smoke", action="store_true", help="tiny and short: the driver")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: bytecomp emulate makes network namespaces")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU here (--device cpu runs the driver on the CPU)")
    if args.smoke:
        args.task, args.steps, args.batch_size = args.task or SMOKE_TASK, 8, 4
    args.task = args.task or GPU_TASK
    os.environ["BYTECOMP_BACKEND"] = "gloo"  # two ranks on one GPU: NCCL refuses that
    args.out.mkdir(parents=True, exist_ok=True)
    folders = [cell(bandwidth, args.out, args) for bandwidth in args.bandwidth or BANDWIDTHS]
    table = pd.concat([rows(folder) for folder in folders], ignore_index=True)
    table.to_csv(args.out / "cell.csv", index=False)
    text = ["# Time to fp32 DDP's final loss with GPU compute", "",
            f"`python benchmarks/gpu_cell.py {' '.join(sys.argv[1:])}` "
            f"({time.strftime('%Y-%m-%d %H:%M')}; task {args.task}, batch {args.batch_size} "
            f"per rank, two ranks on one {args.device} over gloo)", "", *markdown(table), ""]
    (args.out / "summary.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
