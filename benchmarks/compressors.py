"""Encode and decode throughput of every compressor on the CPU.

For each compressor at its default parameters and each size (1M and 16M
float32 elements), time the encode (all rounds, as one rank) and the decode,
and a plain copy of the same tensor in the same run (the memory-bandwidth
reference). Throughput is GB/s of input; the ratio is throughput / copy
throughput. Medians of ``--repeats`` runs after one warm-up.

    python benchmarks/compressors.py [--repeats 5] [--sizes 1048576 16777216] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from bytecomp.compress import default_specs, from_spec
from bytecomp.compress.local import decode, encode


def median_seconds(fn, repeats: int, setup=lambda: ()) -> float:
    fn(*setup())
    times = []
    for _ in range(repeats):
        arguments = setup()
        start = time.perf_counter()
        fn(*arguments)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(spec: str, numel: int, repeats: int) -> dict:
    """Time a second step: every timed encode starts from a copy of the state left by a
    first step on another tensor, so residuals and thresholds do not drift between runs."""
    x = torch.randn(numel)
    compressor = from_spec(spec)
    warm: dict = {}
    encode(compressor, torch.randn(numel), warm)
    copy_s = median_seconds(lambda: x.clone(), repeats)
    encode_s = median_seconds(lambda state: encode(compressor, x, state), repeats,
                              setup=lambda: (copy.deepcopy(warm),))
    encoded = encode(compressor, x, copy.deepcopy(warm))
    decode_s = median_seconds(lambda: decode(compressor, encoded), repeats)
    gigabytes = numel * 4 / 1e9
    return {
        "spec": spec, "numel": numel, "copy_gbps": gigabytes / copy_s,
        "encode_gbps": gigabytes / encode_s, "decode_gbps": gigabytes / decode_s,
        "encode_ratio": copy_s / encode_s, "decode_ratio": copy_s / decode_s,
        "payload_bytes": encoded.bytes_sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 24])
    parser.add_argument("--specs", nargs="+", default=default_specs())
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--markdown", help="also write the table as markdown here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(spec, numel, args.repeats) for numel in args.sizes for spec in args.specs]

    table = Table(title=f"encode / decode throughput, CPU, {args.threads} threads, "
                        f"median of {args.repeats}")
    headers = ["compressor", "elements", "copy GB/s", "encode GB/s", "encode / copy",
               "decode GB/s", "decode / copy", "payload bytes"]
    for header in headers:
        table.add_column(header, justify="left" if header == "compressor" else "right")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if row["spec"] == "none":  # the payload is the tensor itself: nothing to time
            speeds = ["no work"] * 4
        else:
            speeds = [f"{row['encode_gbps']:.2f}", f"{row['encode_ratio']:.3f}",
                      f"{row['decode_gbps']:.2f}", f"{row['decode_ratio']:.3f}"]
        cells = [row["spec"], f"{row['numel']:,}", f"{row['copy_gbps']:.2f}", *speeds,
                 f"{row['payload_bytes']:,}"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    Console().print(table)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
