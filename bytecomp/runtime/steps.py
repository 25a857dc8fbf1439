"""The step in progress: which gradients have arrived, and which buckets wait for
which groups."""

from __future__ import annotations

import threading

import torch


class WaitingBucket:
    """A bucket's future, completed when the last group holding one of its gradients
    has written its result back."""

    def __init__(self, future: torch.futures.Future, buffer: torch.Tensor, groups: int) -> None:
        self.future = future
        self.buffer = buffer
        self.remaining = groups


class Step:
    """Arrivals and waiting buckets of the step in progress."""

    def __init__(self) -> None:
        self.started = False  # its first bucket has come
        self.origin: float | None = None  # when (perf_counter), where group times are recorded
        self.arrived: dict[int, dict[str, torch.Tensor]] = {}
        self.waiting: dict[int, list[WaitingBucket]] = {}
        self.launched: set[int] = set()
        self.lock = threading.Lock()

    def group_done(self, group: int, error: BaseException | None = None) -> None:
        with self.lock:
            buckets = self.waiting.pop(group, [])
            ready = []
            for bucket in buckets:
                bucket.remaining -= 1
                if error is not None or bucket.remaining == 0:
                    ready.append(bucket)
        for bucket in ready:
            if bucket.future.done():
                continue
            if error is not None:
                bucket.future.set_exception(error)
            else:
                bucket.future.set_result(bucket.buffer)
