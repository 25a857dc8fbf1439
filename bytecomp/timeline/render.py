"""Write a simulated iteration as a Chrome trace (Perfetto opens it) or a Gantt PNG."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from bytecomp.files import atomic_files
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
    return "".join(_trace_chunks(result, title, tensors))


def write_trace(result: SimResult, stream: IO[str], title: str = "bytecomp",
                tensors: Sequence[Any] | None = None) -> None:
    """:func:`trace_json` written to ``stream`` a chunk at a time (a trace of 800,000
    events is 200 MB of JSON: never all of it in memory at once)."""
    for chunk in _trace_chunks(result, title, tensors):
        stream.write(chunk)


CHUNK_EVENTS = 4096  # trace events serialized at a time


def _trace_chunks(result: SimResult, title: str,
                  tensors: Sequence[Any] | None) -> Iterator[str]:
    """:func:`trace_json`'s text in pieces (together the same as one ``json.dumps`` of
    the whole trace); each group's arguments are serialized once for all its events."""
    head: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1,
                         "args": {"name": title}}]
    for tid, lane in enumerate(LANES):
        head.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                     "args": {"name": lane}})
    yield '{"traceEvents": [' + json.dumps(head)[1:-1]
    fragments: dict[int, str] = {}  # a group's arguments after "op", as JSON
    dumps, lanes = json.dumps, {lane: tid for tid, lane in enumerate(LANES)}
    for index in range(0, len(result.events), CHUNK_EVENTS):
        parts = []
        for event in result.events[index:index + CHUNK_EVENTS]:
            fragment = fragments.get(event.group)
            if fragment is None:
                if len(fragments) > 65536:
                    fragments.clear()
                fragment = fragments[event.group] = dumps(
                    _event_args(result, "", event.group, tensors))[len('{"op": ""'):-1]
            parts.append(f', {{"name": {dumps(event.label or event.op)}, '
                         f'"cat": {dumps(event.op)}, "ph": "X", "pid": 1, '
                         f'"tid": {lanes[event.resource]}, '
                         f'"ts": {dumps(round(event.start * 1000, 3))}, '
                         f'"dur": {dumps(round(event.duration * 1000, 3))}, '
                         f'"args": {{"op": {dumps(event.op)}{fragment}}}}}')
        yield "".join(parts)
    yield '], "displayTimeUnit": "ms"}'


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
    with atomic_files([path]) as (temporary,), open(temporary, "w") as stream:
        write_trace(result, stream, title, tensors)
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
    # a bar narrower than a tenth of a pixel is drawn merged with the next of its colour
    # it meets (800,000 bars took 11 s to draw, and 1,300 pixels show no more)
    joined = max(0.0, result.iteration_ms) / (12 * 110) / 10
    for row, lane in enumerate(reversed(used)):
        bars, colors = _bars([e for e in result.events if e.resource == lane], joined)
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


def _bars(events: list, joined: float) -> tuple[list[tuple[float, float]], list[str]]:
    """One lane's bars (start, width) and colours: events in start order, each run of
    same-coloured events that start within ``joined`` ms of the previous one's end drawn
    as one bar when every one of them is narrower than ``joined``."""
    bars: list[list[float]] = []
    colors: list[str] = []
    narrow = False
    for event in sorted(events, key=lambda e: e.start):
        color = COLORS.get(event.op, OTHER)
        thin = event.duration < joined
        if bars and narrow and thin and colors[-1] == color and \
                event.start - (bars[-1][0] + bars[-1][1]) <= joined:
            bars[-1][1] = max(bars[-1][1], event.end - bars[-1][0])
            continue
        bars.append([event.start, event.duration])
        colors.append(color)
        narrow = thin
    return [(start, width) for start, width in bars], colors
