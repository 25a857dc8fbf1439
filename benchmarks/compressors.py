"""Encode and decode throughput of every compressor on the CPU or a CUDA GPU.

For each compressor at its default parameters and each size (1M and 16M
float32 elements), time the encode (all rounds, as one rank) and the decode,
and a plain copy of the same tensor on the same device in the same run (the
memory-bandwidth reference). For a compressor whose payloads are allgathered in one
round, also the mean of ``--peers`` payloads (what a rank decodes on the allgather
path: its own ``aggregate_into``). Throughput is GB/s of input; the ratio is
throughput / copy throughput. Medians of ``--repeats`` runs after one warm-up;
on CUDA every timing synchronizes the device before and after.

On a GPU, Espresso's premise is that compression is cheap; the target checked
there: casts (fp16, bf16), random-k, int8 and sign packing (signsgd, signum,
efsignsgd, onebit) encode and decode at no less than 50% of the device copy
bandwidth at 16M elements (top-k and the low-rank methods are measured and
reported). On CUDA, a compressor with fused kernels (its ``kernel`` trait:
docs/kernels.md) is timed on both paths side by side in the same run: ``triton``
(the kernels, what the executor runs where triton imports) and ``torch`` (its
PyTorch ops, ``BYTECOMP_KERNELS=off``); ``--paths`` picks one. On the CPU every
compressor runs its PyTorch ops (path ``torch``).

    python benchmarks/compressors.py [--device cuda] [--repeats 5] [--sizes 1048576 16777216]
        [--peers 2] [--paths triton torch] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from contextlib import contextmanager, nullcontext

import torch
from rich.console import Console
from rich.table import Table

from bytecomp.compress import default_specs, from_spec, kernels
from bytecomp.compress.local import decode, encode

TARGETS = ("fp16", "bf16", "randomk", "int8", "signsgd", "signum", "efsignsgd", "onebit")
PATHS = (kernels.TRITON, kernels.TORCH)


@contextmanager
def kernel_path(path: str):
    """Run the compressors on ``path``: ``torch`` sets ``BYTECOMP_KERNELS=off`` for the
    block (read at every call), ``triton`` leaves the kernels on where they run."""
    previous = os.environ.get(kernels.ENV)
    if path == kernels.TORCH:
        os.environ[kernels.ENV] = "off"
    else:
        os.environ.pop(kernels.ENV, None)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(kernels.ENV, None)
        else:
            os.environ[kernels.ENV] = previous


def paths_of(spec: str, device: torch.device, wanted: tuple[str, ...],
             interpret: bool = False) -> list[str]:
    """The paths to time ``spec`` on: both where it has kernels that run here."""
    compressor = from_spec(spec)
    runs = kernels.path(compressor, device.type) == kernels.TRITON or \
        (interpret and compressor.kernel == kernels.TRITON)
    chosen = [path for path in wanted if runs or path == kernels.TORCH]
    return chosen or [kernels.TORCH]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, repeats: int, setup=lambda: (), device=torch.device("cpu")) -> float:
    fn(*setup())
    times = []
    for _ in range(repeats):
        arguments = setup()
        _sync(device)
        start = time.perf_counter()
        fn(*arguments)
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(spec: str, numel: int, repeats: int, device=torch.device("cpu"),
            peers: int = 2, path: str = kernels.TORCH) -> dict:
    """Time a second step on ``path`` (:func:`kernel_path`)."""
    with kernel_path(path):
        launched = sum(kernels.LAUNCHES.values())
        row = _measure(spec, numel, repeats, device, peers)
        ran = kernels.TRITON if sum(kernels.LAUNCHES.values()) > launched else kernels.TORCH
    if ran != path:
        raise SystemExit(f"{spec}: asked for the {path} path, {ran} ran")
    return {**row, "path": path}


def _measure(spec: str, numel: int, repeats: int, device, peers: int) -> dict:
    """Time a second step: every timed encode starts from a copy of the state left by a
    first step on another tensor, so residuals and thresholds do not drift between runs."""
    x = torch.randn(numel, device=device)
    compressor = from_spec(spec)
    warm: dict = {}
    encode(compressor, torch.randn(numel, device=device), warm)
    copy_s = median_seconds(lambda: x.clone(), repeats, device=device)
    encode_s = median_seconds(lambda state: encode(compressor, x, state), repeats,
                              setup=lambda: (copy.deepcopy(warm),), device=device)
    encoded = encode(compressor, x, copy.deepcopy(warm))
    decode_s = median_seconds(lambda: decode(compressor, encoded), repeats, device=device)
    mean_s = math.nan
    if compressor.gatherable and compressor.rounds == 1:
        out = torch.empty(numel, device=device)
        mean_s = median_seconds(
            lambda: compressor.aggregate_into([encoded.payload] * peers, encoded.ctx, out),
            repeats, device=device)
    gigabytes = numel * 4 / 1e9
    return {
        "spec": spec, "numel": numel, "copy_gbps": gigabytes / copy_s,
        "encode_gbps": gigabytes / encode_s, "decode_gbps": gigabytes / decode_s,
        "encode_ratio": copy_s / encode_s, "decode_ratio": copy_s / decode_s,
        "mean_gbps": gigabytes / mean_s,
        "payload_bytes": encoded.bytes_sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 24])
    parser.add_argument("--specs", nargs="+", default=default_specs())
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--markdown", help="also write the table as markdown here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--peers", type=int, default=2,
                        help="payloads averaged in the allgather-path decode column")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                        help="on CUDA, the paths to time a compressor with kernels on "
                             "(default both, side by side)")
    parser.add_argument("--interpret", action="store_true",
                        help="on the CPU, run the kernels under Triton's interpreter: a check "
                             "of this script without a GPU (its timings mean nothing)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.interpret and device.type != "cpu":
        raise SystemExit("--interpret: the interpreter runs on the CPU (--device cpu)")
    with kernels.interpreted_on_cpu() if args.interpret else nullcontext():
        rows = [measure(spec, numel, args.repeats, device, args.peers, path)
                for numel in args.sizes for spec in args.specs
                for path in paths_of(spec, device, tuple(args.paths), args.interpret)]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {args.threads} threads"
    kernel_note = f", kernels: {kernels.describe(device)}" if device.type == "cuda" else ""
    table = Table(title=f"encode / decode throughput, {where}{kernel_note}, median of "
                        f"{args.repeats}")
    headers = ["compressor", "path", "elements", "copy GB/s", "encode GB/s", "encode / copy",
               "decode GB/s", "decode / copy", f"mean of {args.peers} GB/s", "payload bytes"]
    for header in headers:
        table.add_column(header, justify="left" if header == "compressor" else "right")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if row["spec"] == "none":  # the payload is the tensor itself: nothing to time
            speeds = ["no work"] * 5
        else:
            mean = "" if math.isnan(row["mean_gbps"]) else f"{row['mean_gbps']:.2f}"
            speeds = [f"{row['encode_gbps']:.2f}", f"{row['encode_ratio']:.3f}",
                      f"{row['decode_gbps']:.2f}", f"{row['decode_ratio']:.3f}", mean]
        cells = [row["spec"], row["path"], f"{row['numel']:,}", f"{row['copy_gbps']:.2f}",
                 *speeds, f"{row['payload_bytes']:,}"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    Console().print(table)
    if device.type == "cuda":
        largest = max(args.sizes)
        lines.append("")
        for row in rows:
            if row["numel"] == largest and from_spec(row["spec"]).name in TARGETS:
                verdicts = ", ".join(
                    f"{what} at {100 * row[f'{what}_ratio']:.0f}% of the device copy "
                    f"({'met' if row[f'{what}_ratio'] >= 0.5 else 'MISSED'})"
                    for what in ("encode", "decode"))
                line = f"- {row['spec']} ({row['path']}) at {largest:,}: {verdicts}; " \
                       f"target >= 50%"
                print(line)
                lines.append(line)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
