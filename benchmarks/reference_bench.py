"""``bytecomp bench --train-steps --no-every`` with fp32 DDP trained a second time on
another data order, for the convergence matrix's noise floor of the loss.

The second run (``fp32 DDP, data seed S`` in convergence.csv) starts from the same
weights as every strategy and trains interleaved with them, on batches drawn under its
own seed (:attr:`bytecomp.profiler.convergence.ConvergenceConfig.reference_seed`): how
far it ends from fp32 DDP is how far apart two equally good runs end. ``bytecomp
bench`` has no option for it, so this builds the configuration the command builds
from the same flags and runs it on this job's ranks (under ``bytecomp emulate``)::

    bytecomp emulate --nodes 2 -- python benchmarks/reference_bench.py PROFILE \\
        --plan plan.yaml --plan plan-static.yaml --out bench --train-steps 900 \\
        --target-fraction 0.666667 --eval-every 25 --reference-seed 1
"""

from __future__ import annotations

import argparse

from bytecomp.bencher import BenchConfig, ConvergenceConfig, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--plan", action="append", required=True,
                        help="the first is 'bytecomp plan', the others named by their files")
    parser.add_argument("--model", default=None, help="the profile's pkg.module:factory")
    parser.add_argument("--out", required=True)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--train-steps", type=int, required=True)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--target-fraction", type=float, default=0.6)
    parser.add_argument("--reference-seed", type=int, default=1,
                        help="the second data order's seed (the run's own is 0)")
    args = parser.parse_args()
    if args.reference_seed == 0:
        raise SystemExit("--reference-seed 0 is the run's own data order: choose another")
    convergence = ConvergenceConfig(args.train_steps, min(args.eval_every, args.train_steps),
                                    target_fraction=args.target_fraction,
                                    reference_seed=args.reference_seed)
    run_bench(BenchConfig(args.profile, args.plan[0], args.out, args.plan[1:],
                          iterations=args.iterations, force=True, convergence=convergence,
                          every=False, model=args.model))


if __name__ == "__main__":
    main()
