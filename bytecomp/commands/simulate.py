"""``bytecomp simulate`` from start to finish (what :func:`bytecomp.simulate` calls): one
iteration of a plan file on a profile's measurements, its times, every resource's busy
time, and the Chrome trace and Gantt chart asked for (:class:`Simulation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bytecomp.errors import BytecompError
from bytecomp.options import SimulateOptions

if TYPE_CHECKING:
    import pandas as pd

    from bytecomp.plan_types import Plan


@dataclass
class Simulation:
    """One simulated iteration of a plan (:func:`simulate`): the times in ms, the busy time
    of every resource, the files written, the command's :attr:`table` and, group by
    group, when each was encoded, on the wire and done (:attr:`groups`)."""

    plan: str
    level: int | None
    cluster: str
    iteration_ms: float
    compute_ms: float
    backward_end_ms: float
    comm_end_ms: float
    busy_ms: dict[str, float]
    written: list[str] = field(default_factory=list)
    timeline: Any = None  # the simulator's result (events, per-group times)
    group_tensors: list[list[str]] = field(default_factory=list)  # per simulated group

    @property
    def groups(self) -> pd.DataFrame:
        """Per simulated group, in launch order: its tensors, its strategy, and when (ms,
        on the simulation's clock) it began (its first event), was encoded, went on the
        wire, came off it and was decoded: what ``Executor.record_group_times`` measures
        on a real run."""
        import pandas as pd

        spans: dict[int, dict[str, list[float]]] = {}
        for event in self.timeline.events if self.timeline is not None else []:
            if event.group >= 0:
                ops = spans.setdefault(event.group, {})
                ops.setdefault(event.op, []).extend((event.start, event.end))
        rows = []
        for index, ops in sorted(spans.items()):
            begun = min(t for times in ops.values() for t in times)
            encoded = max(ops.get("encode", [begun]))
            sent = min(ops.get("collective", [encoded]))
            received = max(ops.get("collective", [sent]))
            rows.append({"group": index, "tensors": self.group_tensors[index]
                         if index < len(self.group_tensors) else [],
                         "strategy": self.timeline.groups[index].label,
                         "launched_ms": begun, "encoded_ms": encoded, "sent_ms": sent,
                         "received_ms": received,
                         "done_ms": max(ops.get("decode", [received]) + [received])})
        return pd.DataFrame(rows)

    @property
    def exposed_ms(self) -> float:
        """The iteration's time not overlapped with compute."""
        return self.iteration_ms - self.compute_ms

    @property
    def table(self) -> pd.DataFrame:
        """The command's table: quantity and ms."""
        import pandas as pd

        rows = [("iteration", self.iteration_ms),
                ("compute only (forward + backward + optimizer)", self.compute_ms),
                ("exposed (not overlapped) time", self.exposed_ms),
                ("backward ends (after forward)", self.backward_end_ms),
                ("last group done (after forward)", self.comm_end_ms)]
        rows += [(f"busy {key.replace(':', ' ')}", value) for key, value in
                 self.busy_ms.items()]
        return pd.DataFrame(rows, columns=["quantity", "ms"])

    def to_dict(self) -> dict:
        """``simulate --format json``."""
        return {"plan": self.plan, "level": self.level, "cluster": self.cluster,
                "iteration_ms": self.iteration_ms, "compute_ms": self.compute_ms,
                "exposed_ms": self.exposed_ms, "backward_end_ms": self.backward_end_ms,
                "comm_end_ms": self.comm_end_ms, "busy_ms": self.busy_ms,
                "written": self.written}


def run_simulate(profile: str, plan: str, chosen: SimulateOptions) -> Simulation:
    """Simulate one iteration of ``plan`` on ``profile`` with ``chosen``'s options
    (checked already: :meth:`SimulateOptions.build`)."""
    from bytecomp.commands.plan import input_files, load_cluster
    from bytecomp.files import atomic_files, check_output_file, check_outputs_spare_inputs
    from bytecomp.plan_file import load_plan
    from bytecomp.profile_store import load_profile
    from bytecomp.search import Planner, simulate_plan
    from bytecomp.search.plans import check_plan_fits
    from bytecomp.timeline.render import draw_gantt, write_trace

    outputs: dict[str, str | None] = {"--trace": chosen.trace, "--png": chosen.png}
    for option_name, path in outputs.items():
        if path:
            check_output_file(path, option_name)
    check_outputs_spare_inputs(outputs, input_files(profile, plan, chosen.cluster))
    loaded = load_profile(profile)
    the_plan: Plan = load_plan(plan)
    cluster = load_cluster(chosen.cluster)
    check_plan_fits(the_plan, loaded, cluster)
    level = chosen.level
    if level is not None or the_plan.levels:
        count = len(the_plan.levels or [])
        if not 0 <= (level or 0) < count:
            raise BytecompError(f"{plan} has no level {level} (" + (
                f"levels 0 to {count - 1})" if count else "it is not an adaptive plan)"))
        level = level or 0
        the_plan = the_plan.level(level)
    planner = Planner(loaded, cluster, the_plan.compressors or None, strict=True)
    result = simulate_plan(planner, the_plan)
    times = loaded.meta["times"]
    compute = sum(times[k]["median_ms"] for k in ("forward", "backward_compute", "optimizer"))
    written = [path for path in (chosen.trace, chosen.png) if path]
    with atomic_files(written) as temporaries:  # both written, then both renamed
        staged = dict(zip(written, temporaries))
        if chosen.trace:
            with open(staged[chosen.trace], "w") as stream:
                write_trace(result, stream, plan, planner.problem.tensors)
        if chosen.png:
            draw_gantt(result, staged[chosen.png], plan)
    names = [tensor.name for tensor in planner.problem.tensors]
    return Simulation(plan, level, planner.cluster.name, result.iteration_ms, compute,
                      result.backward_end_ms, result.comm_end_ms,
                      dict(sorted(result.breakdown().items())), written, result,
                      [[names[i] for i in group.members] for group in result.groups])


