"""The profiling job as a rank sees it: the device and the groups both rank entry points
start with (:func:`start_rank`), and what every file a rank writes records about the
job (:func:`profile_head` and :func:`calibration_head`: the keys profile.yaml and
calibration.yaml share)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

import bytecomp
from bytecomp.comm.topology import Topology
from bytecomp.launch import pick_device
from bytecomp.profile_meta import CalibrationMeta, ModelMeta, ProfileMeta
from bytecomp.profile_store import FORMAT_VERSION


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_description(config, device: torch.device) -> dict:
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return {
        "description": config.machine or "",
        "cpu": device_name(torch.device("cpu")),
        "logical_cores": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "threads_per_rank": torch.get_num_threads(),
    }


@dataclass
class RankJob:
    """This rank in the job: its rank, its device, the devices compressors are timed on
    (the device, and the CPU beside a GPU), and bytecomp's groups."""

    rank: int
    device: torch.device
    devices: list[torch.device]
    topology: Topology


def start_rank(config, nodes: int, ranks_per_node: int) -> RankJob:
    """On every rank, with the process group up: pick this rank's device (``config.device``)
    and build the job's groups (collective)."""
    rank = dist.get_rank()
    device = pick_device(config.device, rank % ranks_per_node)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    topology = Topology.build(nodes, ranks_per_node)
    devices = [device] + ([torch.device("cpu")] if device.type == "cuda" else [])
    return RankJob(rank, device, devices, topology)


def _made(config, device: torch.device, compress_kernels: str) -> ProfileMeta:
    """The versions, when and on what the file was measured."""
    return {
        "bytecomp_version": bytecomp.__version__,
        "torch_version": str(torch.__version__),
        # what the compressors with kernels ran when timed: "triton <version>" or "torch"
        "compress_kernels": compress_kernels,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_description(config, device),
    }


def _shape(topology: Topology, device: torch.device) -> ProfileMeta:
    """The job's device, backend and shape."""
    return {
        "device": {"type": device.type, "name": device_name(device)},
        "backend": dist.get_backend(),
        "world_size": topology.size,
        "nodes": topology.nodes,
        "ranks_per_node": topology.ranks_per_node,
    }


def _settings(config) -> ProfileMeta:
    """The measurement's settings."""
    return {"iterations": config.iterations, "warmup": config.warmup, "quick": config.quick}


def profile_head(config, topology: Topology, device: torch.device, compress_kernels: str,
                 model: ModelMeta, batch_size: int) -> ProfileMeta:
    """The head of profile.yaml: the format and versions, when and on what it was
    measured, the model, the job's shape, the batch and buckets, and the measurement's
    settings (the keys it shares with :func:`calibration_head` in the same order)."""
    return {
        "format_version": FORMAT_VERSION,
        **_made(config, device, compress_kernels),
        "model": model,
        **_shape(topology, device),
        "batch_size": batch_size,
        "bucket_cap_mb": config.bucket_cap_mb,
        **_settings(config),
    }


def calibration_head(config, topology: Topology, device: torch.device,
                     compress_kernels: str) -> CalibrationMeta:
    """The head of calibration.yaml: :func:`profile_head`'s without the model's keys,
    ``kind`` after the format."""
    return {
        "format_version": FORMAT_VERSION,
        "kind": "calibration",
        **_made(config, device, compress_kernels),
        **_shape(topology, device),
        **_settings(config),
    }
