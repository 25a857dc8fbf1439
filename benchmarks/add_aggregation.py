"""Add the aggregation sweep to a profile taken before bytecomp measured it.

``aggregation.csv`` (the executor's decode of a gathered exchange: every rank's
payload decompressed, summed in float32, averaged and written out) is compute
only, so it can be measured after the fact without redoing the rest of the
profile (the convergence probe alone takes minutes). Run it the way the profile
was taken, so that ranks share the machine as they did:

    sudo bytecomp emulate --nodes 2 --bandwidth 100mbit -- \\
        python benchmarks/add_aggregation.py PROFILE
    python benchmarks/add_aggregation.py PROFILE --nproc 2

It uses the profile's own sweep sizes (``sweep.numels`` in profile.yaml), its
compressor specs and devices, and ``bytecomp profile``'s repeats and budget
(those of ``--quick`` for a quick profile), and replaces PROFILE/aggregation.csv atomically.
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.files import write_text_atomic
from bytecomp.launch import run_job
from bytecomp.profile_tables import TABLES
from bytecomp.profiler import load_profile
from bytecomp.profiler.runner import ProfileConfig
from bytecomp.profiler.sweeps import sweep_aggregation


def _rank(profile_dir: str, nodes: int, ranks_per_node: int) -> None:
    profile = load_profile(profile_dir)
    if nodes * ranks_per_node != profile.world_size:
        raise BytecompError(f"the profile was taken on {profile.world_size} ranks, this job has "
                         f"{nodes * ranks_per_node}")
    settings = replace(ProfileConfig(quick=bool(profile.meta.get("quick"))).sweep_settings(),
                       numels=tuple(profile.meta["sweep"]["numels"]))
    devices = [torch.device(d, dist.get_rank() % torch.cuda.device_count()) if d == "cuda"
               else torch.device(d) for d in sorted(set(profile.compressors["device"]))]
    rows = sweep_aggregation(list(profile.meta["compressor_specs"]), devices, settings)
    if dist.get_rank() == 0:
        text = io.StringIO()
        pd.DataFrame(rows, columns=list(TABLES["aggregation"])).to_csv(text, index=False)
        write_text_atomic(Path(profile_dir) / "aggregation.csv", text.getvalue())
        print(f"{profile_dir}/aggregation.csv: {len(rows)} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--nproc", type=int, help="local ranks (leave out under torchrun or "
                                                  "bytecomp emulate)")
    args = parser.parse_args()
    try:
        load_profile(args.profile)  # a broken profile fails here, before any rank starts
        run_job(_rank, (args.profile,), args.nproc, "gloo", 600)
    except BytecompError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
