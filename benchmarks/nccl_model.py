"""What the cluster configs' collectives cost under NCCL's model, beside the ring
formula with the configs' gloo latencies (what a CPU job gets) and the ring with
Espresso's 150 us per step (what the V100 configs said before).

For each shipped GPU config and allreduce size on the whole job: the time, NCCL's
algorithm and protocol, and the two ring figures. Nothing is measured: it prints the
model.

    python benchmarks/nccl_model.py [--markdown out.md]
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from bytecomp.costs.clusters import load_cluster
from bytecomp.costs.fitted import ring_ms
from bytecomp.costs.nccl import Span, choose

CONFIGS = ("v100-nvlink-100g", "v100-pcie-25g", "a100-ib200")
SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)
ESPRESSO_ALPHA_MS = 0.150


def rows():
    for name in CONFIGS:
        cluster = load_cluster(name)
        intra, inter = cluster.intra, cluster.inter
        span = Span(cluster.world_size, cluster.nodes, intra, inter,
                    nvlink=intra.type == "nvlink")
        for nbytes in SIZES:
            choice = choose("allreduce", span, nbytes)
            gloo = ring_ms("allreduce", cluster.world_size, nbytes, inter.alpha_ms,
                           inter.beta_ms_per_byte)
            espresso = ring_ms("allreduce", cluster.world_size, nbytes, ESPRESSO_ALPHA_MS,
                               inter.beta_ms_per_byte)
            yield [name, f"{cluster.nodes} x {cluster.ranks_per_node}", _size(nbytes),
                   f"{choice.time_us / 1000:.3f}", f"{choice.algorithm} {choice.protocol}",
                   f"{gloo:.3f}", f"{espresso:.3f}"]


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="also write the table as markdown here")
    args = parser.parse_args()
    headers = ["config", "shape", "allreduce", "NCCL model ms", "algorithm, protocol",
               "ring, gloo latency ms", "ring, 150 us a step ms"]
    table = Table(title="allreduce over the whole job")
    for header in headers:
        table.add_column(header)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for cells in rows():
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    Console(width=160).print(table)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
