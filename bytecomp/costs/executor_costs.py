"""The executor's fixed costs: what running a group or a bucket through bytecomp's
hook costs beyond its compression and its collectives.

``bytecomp profile`` measures them with the real executor on the job's process
groups (:mod:`bytecomp.profiler.overheads`) and stores them in profile.yaml
under ``executor``. A group runs on one of three paths
(:mod:`bytecomp.runtime.paths`):

* ``direct``: encoded on the hook's thread, its one collective issued from
  there asynchronously, decoded when it completes;
* ``fifo``: encoded on the hook's thread, exchanged and decoded on the FIFO
  communication thread (several rounds, sizes to exchange, two-shot,
  hierarchical);
* ``host``: handed to the host workers and the FIFO thread.

Per path, a group costs ``hook_ms`` on the hook's thread (the compute stream:
it delays the backward pass) and ``tail_ms`` on the channel after its
collectives (completion, write-back, handing over between threads); every
bucket costs ``bucket_ms`` on the hook's thread. On the CPU, where the
executor's threads share the cores with the backward pass, ``hook_ms`` is at
least what a group costs the backward pass while it computes (measured so by
the profile), however much of it the model would otherwise hide on the
channel. A plan that is fp32
allreduce on every tensor runs as DDP's own allreduce, without the hook, and
pays none of them. Profiles made before these were measured charge nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from bytecomp.comm.schemes import scheme_of
from bytecomp.compress import from_spec
from bytecomp.plan_types import Option
from bytecomp.profile_meta import EXECUTOR_PATHS as PATHS


def _zeros() -> dict[str, float]:
    return dict.fromkeys(PATHS, 0.0)


@dataclass(frozen=True)
class ExecutorCosts:
    """Fixed costs in milliseconds (see the module docstring)."""

    bucket_ms: float = 0.0
    hook_ms: dict[str, float] = field(default_factory=_zeros)
    tail_ms: dict[str, float] = field(default_factory=_zeros)

    @classmethod
    def from_meta(cls, meta: dict | None) -> ExecutorCosts:
        """From profile.yaml's ``executor`` mapping (absent: no fixed costs)."""
        if not meta:
            return cls()
        paths = meta["paths"]
        return cls(float(meta["bucket_ms"]),
                   {p: float(paths[p]["hook_ms"]) for p in PATHS},
                   {p: float(paths[p]["tail_ms"]) for p in PATHS})

    def to_meta(self) -> dict:
        return {"bucket_ms": self.bucket_ms,
                "paths": {p: {"hook_ms": self.hook_ms[p], "tail_ms": self.tail_ms[p]}
                          for p in PATHS}}


@cache  # the cost model asks for every group it prices
def path_of(option: Option) -> str:
    """The executor path that runs a group with ``option``."""
    if option.place == "host":
        return "host"
    if scheme_of(option.scheme).one_collective(from_spec(option.spec)):
        return "direct"
    return "fifo"
