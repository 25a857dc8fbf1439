"""``bytecomp profile`` from start to finish (what :func:`bytecomp.profile` calls): check the
inputs and the output, build the model and check its recipe, look the cluster's tables up
in the cache, and run the profile's ranks (:mod:`bytecomp.profiler.runner`).

>>> from bytecomp.commands.profile import run_profile
>>> from bytecomp.profiler import ProfileConfig
>>> run_profile(ProfileConfig(model="cnn", out="profiles/cnn"), nproc=2)
"""

from __future__ import annotations

from pathlib import Path

import torch

from bytecomp.errors import BytecompError
from bytecomp.files import check_new_directory, remove_stale_temporaries
from bytecomp.launch import backend_for, in_torchrun, pick_device, run_job, torchrun_shape
from bytecomp.profiler.cache import ClusterKey, lookup
from bytecomp.profiler.calibration import check_before_ranks
from bytecomp.profiler.door import check_recipe
from bytecomp.profiler.runner import ProfileConfig, run_calibration_rank, run_rank
from bytecomp.training.workloads import load_workload
from bytecomp.ui import Stage


def _remove_partial_output(out: Path) -> None:
    remove_stale_temporaries(out)  # rank 0's temporary directory: rank 0 is gone


def _cluster_key(config: ProfileConfig, nproc: int | None, backend: str) -> ClusterKey:
    """This job's cache key, from the options or the torchrun environment."""
    from bytecomp.compress import kernels
    from bytecomp.profiler.calibration import local_job
    from bytecomp.profiler.job import device_name

    nodes, per_node, threads, device = local_job(config, nproc)
    return ClusterKey(nodes * per_node, nodes, per_node, backend, device.type,
                      device_name(device), kernels.describe(device),
                      threads if device.type == "cpu" else 0, config.quick)


def _use_cache(config: ProfileConfig, nproc: int | None, backend: str, workload) -> list[Path]:
    """Set ``config`` to write this job's cache entry and, where a valid one serves
    (:func:`bytecomp.profiler.cache.lookup`), to reuse it as its calibration. Returns the
    files it reads."""
    from bytecomp.profiler.runner import plan_bytes
    from bytecomp.ui import warn

    config.cache_key = _cluster_key(config, nproc, backend)
    needed = config.sweep_settings(plan_bytes(workload.model)).max_bytes
    entry = lookup(config.cache_key, config.specs, needed, warn)
    if entry is None:
        return []
    config.calibration, config.from_cache, named = str(entry), True, config.named_specs
    config.named_specs = True  # this profile's compressors, which the entry has timed
    try:
        inputs = check_before_ranks(config, nproc)
    except BytecompError as error:  # it was written for this key: only a damaged one
        warn(f"the cached cluster tables in {entry} do not serve ({error}); measuring them "
             f"afresh")
        config.calibration, config.from_cache = None, False
        return []
    finally:
        config.named_specs = named
    return inputs


def run_profile(config: ProfileConfig, nproc: int | None = None) -> Path:
    """Profile ``config.model`` on ``nproc`` spawned local ranks, or on the ranks of
    the torchrun job this process belongs to (``config.calibrate_only``: the cluster's
    tables alone, a calibration directory). Returns the directory written."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise BytecompError("--device cuda but no CUDA device is available")
    backend = backend_for(pick_device(config.device, 0).type)
    if config.calibrate_only:
        out = check_new_directory(config.out, config.force)
        if config.cache:
            config.cache_key = _cluster_key(config, nproc, backend)
        run_job(run_calibration_rank, (config,), nproc, backend, config.timeout_s,
                on_stop=lambda: _remove_partial_output(out))
        return out
    # a calibration that is not one, or made on another job, fails here
    inputs = check_before_ranks(config, nproc) if config.calibration else []
    # the output and the job, before any work
    check_new_directory(config.out, config.force, inputs=inputs)
    if in_torchrun():
        torchrun_shape()
    # an unknown model, a broken factory or a recipe that cannot train fails here
    with Stage(f"building {config.model} and checking its recipe (one training step, the "
               f"validation batches)"):
        workload = load_workload(config.model, optimizer=config.optimizer,
                                 scheduler=config.scheduler)
        check_recipe(workload, config.batch_size or workload.batch_size)
    if config.cache and not config.calibration:
        inputs += _use_cache(config, nproc, backend, workload)
    out = check_new_directory(config.out, config.force,
                              inputs=inputs + ([workload.source] if workload.source else []))
    run_job(run_rank, (config,), nproc, backend, config.timeout_s,
            on_stop=lambda: _remove_partial_output(out))
    return out

