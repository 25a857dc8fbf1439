"""`bytecomp simulate` on large plans: linear in the tensors (a plan's lookup by name
per tensor once made it quadratic: 20,000 tensors took 83 s), the trace written a
chunk at a time and the Gantt chart's thin bars merged."""

from __future__ import annotations

import json
import time

import pytest

from bytecomp.profile_store import save_profile
from bytecomp.search import Planner, simulate_plan, to_plan
from bytecomp.search.result import SearchResult
from bytecomp.testing.synthetic import mlp_shapes, synthetic_profile
from bytecomp.timeline.iteration import Event
from bytecomp.timeline.render import LANES, _bars, _event_args, trace_json, write_trace


def _many(count: int, tmp_path):
    """A profile of ``count`` small tensors and a plan that gives every tensor its own
    bucket and alternates three strategies (a group per tensor: the most events)."""
    shapes = [(f"layer{i}.weight", (64, 8 + i % 7)) for i in range(count)]
    profile = synthetic_profile(shapes, world_size=8, nodes=2, specs=["fp16"],
                                backward_ms=10 + 0.02 * count)
    save_profile(profile, tmp_path / "profile")
    planner = Planner(profile, None, ["fp16"])
    problem = planner.problem
    picks = [0, 3, len(planner.searchable) - 1]
    assignment = [picks[i % 3] for i in range(count)]
    time_ms = problem.simulate(assignment, 0.0).iteration_ms
    result = SearchResult(problem, planner.cluster, planner.specs, assignment, 0.0, time_ms,
                        planner.baselines(), "by hand", 0.0, time_ms / 2, False, 0)
    to_plan(result, profile).save(tmp_path / "plan.yaml")
    return tmp_path / "profile", tmp_path / "plan.yaml"


@pytest.mark.slow
def test_simulate_is_linear_in_the_tensors(cli, tmp_path):
    """2,500 and 10,000 tensors, a group each: the larger takes well under the 16 times
    a quadratic would (processor time, which a loaded machine does not inflate), and
    under 5 s of it (0.9 s on a quiet machine here)."""
    spent = {}
    for count in (2_500, 10_000):
        profile, plan = _many(count, tmp_path / str(count))
        started = time.process_time()
        done = cli("simulate", profile, plan, "--trace", tmp_path / f"{count}.json",
                   "--format", "json")
        spent[count] = time.process_time() - started
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["iteration_ms"] > 0
        events = json.loads((tmp_path / f"{count}.json").read_text())["traceEvents"]
        assert sum(event["ph"] == "X" for event in events) >= 3 * count
    assert spent[10_000] < 5.0
    assert spent[10_000] < 8 * spent[2_500]


def test_the_trace_is_written_in_chunks_as_one_document(tmp_path, monkeypatch):
    """Written a chunk at a time (chunks of 2 events here), the trace is the JSON that one
    ``json.dumps`` of every event makes."""
    import bytecomp.timeline.render as render

    monkeypatch.setattr(render, "CHUNK_EVENTS", 2)
    profile = synthetic_profile(mlp_shapes(3, 64), world_size=4, nodes=2, specs=["fp16"])
    planner = Planner(profile, None, ["fp16"])
    result = planner.search(algorithm="greedy")
    plan = to_plan(result, profile)
    simulated = simulate_plan(planner, plan)
    for tensors in (None, planner.problem.tensors):
        expected = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "t"}}]
        expected += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                      "args": {"name": lane}} for tid, lane in enumerate(LANES)]
        expected += [{"name": e.label or e.op, "cat": e.op, "ph": "X", "pid": 1,
                      "tid": LANES.index(e.resource), "ts": round(e.start * 1000, 3),
                      "dur": round(e.duration * 1000, 3),
                      "args": _event_args(simulated, e.op, e.group, tensors)}
                     for e in simulated.events]
        whole = json.dumps({"traceEvents": expected, "displayTimeUnit": "ms"})
        assert trace_json(simulated, "t", tensors) == whole
        with open(tmp_path / "trace.json", "w") as stream:
            write_trace(simulated, stream, "t", tensors)
        assert (tmp_path / "trace.json").read_text() == whole
    assert len(simulated.events) > 4


def test_the_gantt_chart_merges_thin_bars_of_one_colour_only():
    """Thin bars of one colour that follow each other closely are one bar; a wide bar, a
    bar of another colour or a gap stay apart."""
    events = [Event("channel", "collective", 0.0, 0.001), Event("channel", "collective",
                                                                  0.001, 0.002),
              Event("channel", "collective", 0.0025, 0.003),
              Event("channel", "decode", 0.003, 0.004),
              Event("channel", "collective", 0.004, 0.5),
              Event("channel", "collective", 0.5, 0.5005),
              Event("channel", "collective", 0.9, 0.9005)]
    bars, colors = _bars(events, 0.01)
    assert [round(start, 4) for start, _ in bars] == [0.0, 0.003, 0.004, 0.5, 0.9]
    assert bars[0] == (0.0, pytest.approx(0.003))
    assert len(colors) == len(bars) and colors[1] != colors[0]
