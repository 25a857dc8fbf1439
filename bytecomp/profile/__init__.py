"""``bytecomp profile``: measure a real DDP job on real ranks.

>>> from bytecomp.profile import ProfileConfig, run_profile, load_profile
>>> run_profile(ProfileConfig(model="cnn", out="profiles/cnn"), nproc=2)
>>> profile = load_profile("profiles/cnn")
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from bytecomp.errors import BytecompError
from bytecomp.files import check_new_directory
from bytecomp.launch import in_torchrun, init_from_env, spawn, torchrun_shape
from bytecomp.profile.runner import ProfileConfig, pick_device, run_rank
from bytecomp.profile.store import Profile, load_profile, save_profile
from bytecomp.profile.workloads import BUILTINS, load_workload


def _spawned_rank(config: ProfileConfig, nproc: int) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    run_rank(config, 1, nproc)


def _remove_partial_output(out: Path) -> None:
    for leftover in out.parent.glob(f".{out.name}.*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)


def run_profile(config: ProfileConfig, nproc: int | None = None) -> Path:
    """Profile ``config.model`` on ``nproc`` spawned local ranks, or on the ranks of
    the torchrun job this process belongs to. Returns the profile directory."""
    load_workload(config.model)  # an unknown model or a broken factory fails here, once
    out = check_new_directory(config.out, config.force)
    device = pick_device(config.device, 0)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise BytecompError("--device cuda but no CUDA device is available")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if in_torchrun():
        shape = torchrun_shape()
        if nproc is not None and nproc != shape.world_size:
            raise BytecompError(f"--nproc {nproc} differs from torchrun's WORLD_SIZE "
                                f"{shape.world_size}; leave --nproc out under torchrun")
        init_from_env(backend, config.timeout_s)
        try:
            run_rank(config, shape.nodes, shape.ranks_per_node)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        return out
    nproc = 1 if nproc is None else nproc
    spawn(_spawned_rank, (config, nproc), nproc, backend, config.timeout_s,
          on_stop=lambda: _remove_partial_output(out))
    return out


__all__ = ["BUILTINS", "Profile", "ProfileConfig", "load_profile", "run_profile", "save_profile"]
