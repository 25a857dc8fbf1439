"""Which way round to multiply a matrix by a thin factor on this CPU: PowerSGD's
``P = M Q`` and ``Q = M^T P`` as written, or thin factor first (``(Q^T M^T)^T``),
side by side, at several ranks, for a transformer's gradient matrices and one large
matrix. ``bytecomp.compress.lowrank.thin_product`` takes the thin-first way below
``THIN_FIRST_BELOW``; the last column says whether that is the faster one here.

Medians of ``--rounds`` rounds of ``--repeats`` products each, one thread (as each
rank runs), with the load before and after.

    python benchmarks/lowrank_products.py [--ranks 2 4 8 16 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from machine_load import load  # noqa: E402

from bytecomp.compress.lowrank import THIN_FIRST_BELOW  # noqa: E402

# the matrices of the convergence bench's transformer (layers=2, width=128) that
# PyTorch's powerSGD_hook compresses at rank 8, and one large layer
SETS = {
    "transformer (11 matrices, 467k)": [(256, 128), (64, 128), (384, 128), (128, 128),
                                        (512, 128), (128, 512), (384, 128), (128, 128),
                                        (512, 128), (128, 512), (256, 128)],
    "one 4096 x 4096": [(4096, 4096)],
}


def timed(fn, repeats: int, rounds: int) -> float:
    """Median over rounds of the mean ms of one call."""
    fn()
    means = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        means.append(1000 * (time.perf_counter() - started) / repeats)
    return statistics.median(means)


def compare(shapes, rank: int, repeats: int, rounds: int) -> dict[str, tuple[float, float]]:
    """ms as written and thin first, for M Q and for M^T P over the set's matrices."""
    matrices = [torch.randn(*shape) for shape in shapes]
    qs = [torch.randn(m.shape[1], rank) for m in matrices]
    ps = [torch.randn(m.shape[0], rank) for m in matrices]
    return {
        "M Q": (timed(lambda: [m @ q for m, q in zip(matrices, qs)], repeats, rounds),
                timed(lambda: [(q.T @ m.T).T.contiguous() for m, q in zip(matrices, qs)],
                      repeats, rounds)),
        "M^T P": (timed(lambda: [m.T @ p for m, p in zip(matrices, ps)], repeats, rounds),
                  timed(lambda: [(p.T @ m).T.contiguous() for m, p in zip(matrices, ps)],
                        repeats, rounds)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=0,
                        help="products per round (default: about 0.1 s worth)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"before: {load()}; torch {torch.__version__}, one thread")
    print("| matrices | product | rank | as written ms | thin first ms | written / thin "
          "| thin_product's way is the faster |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, shapes in SETS.items():
        for rank in args.ranks:
            repeats = args.repeats or (200 if len(shapes) > 1 else 3)
            for product, (written, thin) in compare(shapes, rank, repeats,
                                                    args.rounds).items():
                takes_thin = rank < THIN_FIRST_BELOW
                faster = (thin <= written) == takes_thin
                print(f"| {name} | {product} | {rank} | {written:.3f} | {thin:.3f} | "
                      f"{written / thin:.2f} | {'yes' if faster else 'no'} |")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
