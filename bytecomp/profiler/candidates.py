"""Which compressors the convergence probe trains: only those a plan could use.

The probe trains fp32 DDP and each compressor on every tensor, and its cost grows
with every strategy it trains. A compressor can be in a finalist (a plan predicted
faster than fp32 DDP) only where it sends some tensor, or a merged group of them,
sooner than fp32 does: its encode, exchange, decode and copies priced by the
planner's models (:class:`~bytecomp.costs.strategy.StrategyCosts`) below fp32's
allreduce of the same array. One that does so for no tensor, no group of all of
them and on no cluster (the profiled ranks, and each ``profile --cluster`` the
plans are for) cannot make any plan faster, so it is not trained; the profile says
which and why, and profile.yaml records them (``probe.skipped``). Only a profile that
names the clusters its plans are for leaves any out: without them, a profile made on
a fast link might be planned for a slow one, and every compressor is trained.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from bytecomp.comm.schemes import native_scheme
from bytecomp.compress import from_spec
from bytecomp.plan_types import Option
from bytecomp.profile_meta import ProfileMeta
from bytecomp.profile_store import Profile

FP32 = Option("none", "device", "allreduce")


@dataclass
class Candidates:
    """The specs the probe trains, and those it leaves out."""

    trained: list[str]
    skipped: list[str] = field(default_factory=list)

    def line(self, clusters: list[str]) -> str | None:
        """The profile's line about what was left out and why (None: nothing)."""
        if not self.skipped:
            return None
        where = "the profiled ranks" + "".join(f" or {name}" for name in clusters)
        return (f"the convergence probe leaves out {len(self.skipped)} of "
                f"{len(self.skipped) + len(self.trained)} compressors "
                f"({', '.join(self.skipped)}): none sends any tensor sooner than fp32 on "
                f"{where}, so no plan there could use them (each --cluster NAME names "
                f"a cluster the plans are for)")


def _total(cost) -> float:
    return cost.encode_ms + cost.channel_ms + cost.decode_ms + cost.copy_in_ms + \
        cost.copy_out_ms


def could_help(profile: Profile, spec: str, clusters) -> bool:
    """Whether ``spec`` (on every tensor, its own scheme) sends some tensor of
    ``profile``, or all of them as one group, sooner than fp32 on any of ``clusters``."""
    from bytecomp.costs.fitted import CommModel, ComputeModel
    from bytecomp.costs.strategy import StrategyCosts

    option = Option(spec, "device", native_scheme(from_spec(spec)))
    numels = sorted({int(n) for n in profile.tensors["numel"]} |
                    {int(profile.tensors["numel"].sum())})
    for cluster in clusters:
        costs = StrategyCosts(CommModel(profile, cluster), ComputeModel(profile),
                              profile.device_type)
        if any(_total(costs.cost(option, n)) < _total(costs.cost(FP32, n)) for n in numels):
            return True
    return False


def probe_candidates(meta: ProfileMeta, tensors: pd.DataFrame, collectives: list[dict],
                     compressors: list[dict], specs: list[str],
                     cluster_names: list[str]) -> Candidates:
    """Split ``specs`` into those the probe trains and those no plan could use on the
    profiled ranks or ``cluster_names``, from the profile's tables so far (its
    ``meta``: world, nodes, ranks per node, device)."""
    from bytecomp.costs.clusters import load_cluster
    from bytecomp.costs.fitted import profiled_cluster

    profile = Profile(meta, tensors, pd.DataFrame(collectives), pd.DataFrame(compressors))
    clusters = [profiled_cluster(profile)] + [load_cluster(name) for name in cluster_names]
    trained: list[str] = []
    skipped: list[str] = []
    for spec in specs:
        (trained if could_help(profile, spec, clusters) else skipped).append(spec)
    return Candidates(trained, skipped)
