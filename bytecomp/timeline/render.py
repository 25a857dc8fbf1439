"""Write a simulated iteration as a Chrome trace (Perfetto opens it) or a Gantt PNG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bytecomp.files import atomic_files, write_text_atomic
from bytecomp.timeline.simulator import SimResult

LANES = ("compute", "channel", "host", "copy")
COLORS = {"forward": "#9ecae1", "backward": "#3182bd", "optimizer": "#6baed6",
          "encode": "#e6550d", "decode": "#fd8d3c", "collective": "#31a354",
          "d2h": "#756bb1", "h2d": "#9e9ac8", "hook": "#bdbdbd"}
OTHER = "#999999"  # an op without a colour of its own


def trace_json(result: SimResult, title: str = "bytecomp",
               tensors: Sequence[Any] | None = None) -> str:
    """Trace Event Format JSON: one thread per resource, times in microseconds.

    An event of a group (encode, collective, decode, copies, hook) carries in its
    ``args`` the group's index and ``strategy``, the ``wire_bytes`` a rank sends for
    it and, given ``tensors`` (what the groups' members index: the problem's tensors,
    with ``name`` and ``bytes``), the ``tensors`` by name, their ``tensor_bytes`` and
    the group's gradient ``bytes`` in all (``members``, the positions, without)."""
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": title}}]
    for tid, lane in enumerate(LANES):
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                       "args": {"name": lane}})
    for event in result.events:
        events.append({"name": event.label or event.op, "cat": event.op, "ph": "X", "pid": 1,
                       "tid": LANES.index(event.resource), "ts": round(event.start * 1000, 3),
                       "dur": round(event.duration * 1000, 3),
                       "args": _event_args(result, event.op, event.group, tensors)})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


def _event_args(result: SimResult, op: str, group: int,
                tensors: Sequence[Any] | None) -> dict:
    args: dict = {"op": op}
    if not 0 <= group < len(result.groups):
        return args
    simulated = result.groups[group]
    args.update(group=group, strategy=simulated.label,
                wire_bytes=round(simulated.cost.wire_bytes))
    if tensors is None:
        args["members"] = list(simulated.members)
        return args
    members = [tensors[position] for position in simulated.members]
    args.update(tensors=[tensor.name for tensor in members],
                tensor_bytes=[tensor.bytes for tensor in members],
                bytes=sum(tensor.bytes for tensor in members))
    return args


def chrome_trace(result: SimResult, path, title: str = "bytecomp",
                 tensors: Sequence[Any] | None = None) -> Path:
    """Write :func:`trace_json` to ``path`` (atomically)."""
    write_text_atomic(path, trace_json(result, title, tensors))
    return Path(path)


def gantt_png(result: SimResult, path, title: str = "bytecomp timeline") -> Path:
    """Write :func:`draw_gantt` to ``path`` (atomically)."""
    with atomic_files([path]) as (temporary,):
        draw_gantt(result, temporary, title)
    return Path(path)


def draw_gantt(result: SimResult, path, title: str = "bytecomp timeline") -> None:
    """A Gantt chart of the compute, channel, host and copy lanes, saved as a PNG.

    It draws on a figure of its own (matplotlib's object API, no pyplot), so it
    leaves the caller's backend and figures alone (a notebook keeps plotting inline).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    used = [lane for lane in LANES if any(e.resource == lane for e in result.events)]
    figure = Figure(figsize=(12, 1.0 + 0.7 * len(used)))
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for row, lane in enumerate(reversed(used)):
        bars = [(e.start, e.duration) for e in result.events if e.resource == lane]
        colors = [COLORS.get(e.op, OTHER) for e in result.events if e.resource == lane]
        axes.broken_barh(bars, (row - 0.35, 0.7), facecolors=colors, edgecolor="white",
                         linewidth=0.3)
    axes.set_yticks(range(len(used)), list(reversed(used)))
    axes.set_xlabel("ms from the start of the iteration")
    axes.set_xlim(0, result.iteration_ms * 1.01)
    axes.set_title(f"{title}: {result.iteration_ms:.1f} ms per iteration")
    order = {op: index for index, op in enumerate(COLORS)}
    ops = sorted({e.op for e in result.events}, key=lambda op: (order.get(op, len(order)), op))
    axes.legend(handles=[Patch(color=COLORS.get(op, OTHER), label=op) for op in ops],
                loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(used) < 3 else -0.2),
                ncol=len(ops), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
