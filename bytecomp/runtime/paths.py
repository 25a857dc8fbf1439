"""The two ways a group runs: encoded on the device or on the host.

Both call ``done(error=None)`` once the group's average is written back into
its bucket, from whichever thread finished the work.

* :class:`DevicePath`: encode on the hook's own thread (as a device-side encode
  delays the backward pass). An exchange that is one collective (an allreduce
  of a summable payload, an allgather of a fixed-size one) is then issued
  asynchronously right there, on a process group of its own, and decoded when
  it completes; any other (several rounds, sizes to exchange, two-shot,
  hierarchical) runs on the FIFO communication thread.
* :class:`HostPath`: copy out (pinned memory on CUDA), encode and decode on a
  pool of host worker threads, collectives on the same FIFO thread (a gloo
  group when the job runs NCCL), copy back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from bytecomp.comm.exchanges import Exchange, FlatExchange
from bytecomp.comm.schemes import make_exchange, scheme_of
from bytecomp.comm.topology import Topology, new_group, release_groups
from bytecomp.comm.worker import CommWorker
from bytecomp.compress import Peers
from bytecomp.runtime.groups import GroupSpec, flat_input, write_back
from bytecomp.runtime.state import Stats

Done = Callable[..., None]  # done(error=None)


def _deliver(staged: Exchange, views: list[torch.Tensor], x: torch.Tensor,
             in_bucket: bool) -> None:
    """Decode the group's average into the bucket: in place, or piece by piece."""
    if in_bucket:
        staged.decode(out=x)
    else:
        write_back(staged.decode().reshape(-1), views, non_blocking=True)


class DevicePath:
    """Runs device-placed groups (see the module docstring)."""

    def __init__(self, topology: Topology, worker: CommWorker, stats: Stats,
                 device: torch.device) -> None:
        self.topology = topology
        self.worker = worker
        self.stats = stats
        self.device = device
        # Single-collective exchanges are issued asynchronously from the hook's thread, in
        # hook order, on a group of their own (the FIFO thread's collectives use another).
        self.direct = new_group(list(range(dist.get_world_size())))
        self.direct_peers = Peers(dist.get_rank(self.direct), dist.get_world_size(self.direct))
        self.callbacks: list[torch.futures.Future] = []  # the completions not yet seen done

    def close(self) -> None:
        """Wait for the completion callbacks to return (they run on gloo's threads), then
        destroy the group of single-collective exchanges (after the last step)."""
        for callback in self.callbacks:
            with contextlib.suppress(Exception):  # _finish reports its errors to done()
                callback.wait()
        self.callbacks = []
        release_groups(self.direct)

    def launch(self, group: GroupSpec, views: list[torch.Tensor], state: dict,
               done: Done, times: dict[str, float] | None = None) -> None:
        """Encode ``group`` here and exchange it: one collective issued now, or staged on
        the FIFO thread. ``times`` (where group times are recorded) takes when it was
        encoded, sent and received."""
        times = {} if times is None else times
        try:
            started = time.perf_counter()
            x, in_bucket = flat_input(views)
            scheme = scheme_of(group.scheme)
            if x.numel() and scheme.one_collective(group.compressor):
                flat = FlatExchange(x, group.compressor, state, self.direct,
                                    scheme.flat_rounds(group.compressor), self.direct_peers)
                flat.encode()
                issued = times["encoded"] = times["sent"] = time.perf_counter()
                self.stats.add(encode_s=issued - started)
                self.callbacks = [c for c in self.callbacks if not c.done()]
                self.callbacks.append(flat.communicate_async().then(
                    lambda future: self._finish(future, flat, views, x, in_bucket, done, issued,
                                                times)))
                return
            staged = make_exchange(x, group.compressor, state, self.topology, group.scheme)
            staged.encode()
            times["encoded"] = time.perf_counter()
            self.stats.add(encode_s=times["encoded"] - started)
        except BaseException as error:
            done(error)
            return

        def communicate_and_decode() -> None:
            try:
                started = times["sent"] = time.perf_counter()
                staged.communicate()
                middle = times["received"] = time.perf_counter()
                _deliver(staged, views, x, in_bucket)
                self.stats.add(communicate_s=middle - started,
                               decode_s=time.perf_counter() - middle,
                               sent_bytes=staged.sent_bytes)
                done()
            except BaseException as error:
                done(error)

        self.worker.submit(communicate_and_decode, device=self.device)

    def _finish(self, future: torch.futures.Future, staged: Exchange, views: list[torch.Tensor],
                x: torch.Tensor, in_bucket: bool, done: Done, issued: float,
                times: dict[str, float]) -> None:
        """Completion of an asynchronous collective: decode, write back, release."""
        try:
            for inner in future.value():  # raises if the collective failed
                if isinstance(inner, torch.futures.Future):
                    inner.value()
            middle = times["received"] = time.perf_counter()
            _deliver(staged, views, x, in_bucket)
            self.stats.add(communicate_s=middle - issued, decode_s=time.perf_counter() - middle,
                           sent_bytes=staged.sent_bytes)
            done()
        except BaseException as error:
            done(error)


class HostPath:
    """Runs host-placed groups (see the module docstring)."""

    def __init__(self, topology: Topology, workers: int, worker: CommWorker, stats: Stats,
                 device: torch.device) -> None:
        self.topology = topology
        self.pool = ThreadPoolExecutor(workers, "bytecomp-host")
        self.worker = worker
        self.stats = stats
        self.device = device

    def launch(self, group: GroupSpec, views: list[torch.Tensor], state: dict,
               done: Done, times: dict[str, float] | None = None) -> None:
        """Encode ``group`` on a host worker, exchange it on the FIFO thread, decode it on a
        host worker; ``times`` as :meth:`DevicePath.launch`'s."""
        cuda = self.device.type == "cuda"
        times = {} if times is None else times

        def encode() -> Exchange:
            started = time.perf_counter()
            x, _ = flat_input(views)
            if cuda:
                host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
                host.copy_(x)
                x = host
            staged = make_exchange(x, group.compressor, state, self.topology, group.scheme)
            staged.encode()
            times["encoded"] = time.perf_counter()
            self.stats.add(encode_s=times["encoded"] - started)
            return staged

        encoded = self.pool.submit(encode)

        def decode(staged: Exchange) -> None:
            try:
                started = time.perf_counter()
                write_back(staged.decode().reshape(-1).to(self.device), views)
                if cuda:
                    torch.cuda.current_stream(self.device).synchronize()
                self.stats.add(decode_s=time.perf_counter() - started)
                done()
            except BaseException as error:
                done(error)

        def communicate() -> None:  # on the FIFO thread, in launch order
            try:
                staged = encoded.result()
                started = times["sent"] = time.perf_counter()
                staged.communicate()
                times["received"] = time.perf_counter()
                self.stats.add(communicate_s=times["received"] - started,
                               sent_bytes=staged.sent_bytes)
                self.pool.submit(decode, staged)
            except BaseException as error:
                done(error)

        self.worker.submit(communicate)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
