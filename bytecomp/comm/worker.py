"""A FIFO background thread that runs exchanges and hands back futures.

Collectives must be issued in the same order on every rank. A DDP comm hook
is called bucket by bucket in the same order on every rank, so submitting from
the hook to one FIFO thread keeps that order, while the autograd thread goes on
with the backward pass (the overlap DDP relies on). Multi-round schemes
(PowerSGD, two-shot, ExDyna) are plain sequential code on this thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

_STOP = object()


class CommWorker:
    """Run submitted callables one after another on a daemon thread.

    >>> worker = CommWorker()
    >>> future = worker.submit(schemes.exchange, grad, compressor, state, topology)
    >>> averaged = future.wait()
    """

    def __init__(self, name: str = "bytecomp-comm") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._streams: dict[torch.device, Any] = {}
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, device: torch.device | None = None,
               **kwargs: Any) -> torch.futures.Future:
        """Queue ``fn(*args, **kwargs)``; the future holds its result or its exception.

        With a CUDA ``device``, the job waits for the work queued so far on the
        caller's current stream and runs on a side stream of its own.
        """
        cuda = device is not None and device.type == "cuda"
        future: torch.futures.Future = torch.futures.Future(
            devices=[device] if device is not None and cuda else None)
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(device))
        self._jobs.put((fn, args, kwargs, future, device if cuda else None, ready))
        return future

    def _stream(self, device: torch.device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, kwargs, future, device, ready = job
            try:
                if device is None:
                    result = fn(*args, **kwargs)
                else:
                    stream = self._stream(device)
                    with torch.cuda.stream(stream):
                        stream.wait_event(ready)
                        result = fn(*args, **kwargs)
                future.set_result(result)
            except BaseException as error:  # the waiter re-raises it
                future.set_exception(error)

    def close(self, timeout: float | None = 10.0) -> None:
        """Finish the queued jobs and stop the thread."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join(timeout)
