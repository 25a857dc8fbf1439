"""Timing helpers: wall clock on the CPU, CUDA events on GPUs, robust statistics."""

from __future__ import annotations

import time

import numpy as np
import torch


def summarize(values_ms) -> dict:
    """Median, 10th and 90th percentile of a sequence of milliseconds."""
    values = np.asarray(list(values_ms), dtype=float)
    if values.size == 0:
        return {"median_ms": float("nan"), "p10_ms": float("nan"), "p90_ms": float("nan")}
    return {
        "median_ms": round(float(np.median(values)), 4),
        "p10_ms": round(float(np.percentile(values, 10)), 4),
        "p90_ms": round(float(np.percentile(values, 90)), 4),
    }


class Clock:
    """Marks points in time on a device and reads intervals in milliseconds.

    On the CPU a mark is ``time.perf_counter()``; on CUDA it is an event recorded
    on the current stream, read after a synchronize, so marks taken inside hooks
    do not stall the device.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def elapsed_ms(self, start, end) -> float:
        if self.cuda:
            return start.elapsed_time(end)
        return (end - start) * 1000.0


def time_call_ms(fn, clock: Clock, repeats: int, setup=lambda: ()) -> list[float]:
    """Run ``fn(*setup())`` ``repeats`` times (setup untimed); return each time in ms."""
    times = []
    for _ in range(repeats):
        arguments = setup()
        clock.sync()
        start = clock.mark()
        fn(*arguments)
        end = clock.mark()
        clock.sync()
        times.append(clock.elapsed_ms(start, end))
    return times
