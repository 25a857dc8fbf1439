"""The measuring phase of :func:`bytecomp.autotune`: what the job's own steps show, and
what they do not, measured within a share of each step.

Free, from the job's own traffic (fp32 DDP, or the fp16 hook, runs meanwhile):

* when each tensor's gradient is ready (a post-accumulate-grad hook per parameter, ms
  after the forward pass ended) and which bucket DDP put it in;
* what each bucket's allreduce costs on the job's network (from its launch, or the end
  of the one before it on the same group, to its completion);
* the forward pass and the whole step.

Within the share (:class:`Recorder`'s ``share``, default 5%):

* each compressor's encode and decode on each tensor's real gradient (a copy taken in
  the hook), and what it keeps of it (the gain, on one step's gradient), one task at a
  time, smallest tensors first; a task runs when the time spent so far plus its
  estimate stays within half the share of the steps measured so far. These are local: each
  rank runs what its budget allows, and the agreement averages what the ranks measured;
* the collectives the cost model needs that the job's traffic does not give
  (allgather, reduce-scatter, all-to-all, broadcast, and small allreduces), at sizes up
  to the share of the step's gradient bytes, within the other half of the share: after
  each probe step the ranks agree on what probing cost so far (one small allreduce), so
  every rank computes the same next probe step and issues the same collectives.

:meth:`Recorder.agree` reduces every rank's figures in one allreduce (sums and counts),
so every rank then holds the same numbers and takes the same decisions.
"""

from __future__ import annotations

import math
import statistics
import time
import zlib

import torch
import torch.distributed as dist

from bytecomp.comm.compat import collective_call
from bytecomp.compress import from_spec
from bytecomp.compress.local import decode, encode, gain

PROBED = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast")
SMALLEST_PROBE = 1 << 10
PROBE_GROWTH = 16  # sizes 1 KiB, 16 KiB, 256 KiB... up to the share's bytes
PROBE_REPEATS = 2
CHEAP_PROBE = 64 << 10  # at most this many bytes: two probes in one step
SKIPPED_STEPS = 2  # DDP rebuilds its buckets after the first step; caches warm up
FIRST_PROBE = 10  # steps measured before the first probe: the share they leave pays for it
SHARE_STEPS = 3  # gradient norms (each tensor's share of the step's) over the first steps


class Timer:
    """Wall-clock ms of device work: a synchronize on CUDA before each reading."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def probe_schedule(gradient_bytes: int, share: float) -> list[list[tuple[str, int]]]:
    """The probes, step by step: every collective of :data:`PROBED` at each size from
    :data:`SMALLEST_PROBE` up to ``share`` x the step's gradient bytes (so a probe moves
    at most that share of what the step's own allreduces move), :data:`PROBE_REPEATS`
    times; the smallest and the largest size of every collective first (what the cost
    model's fit needs most, should the phase end early), cheap ones two a step."""
    largest = max(SMALLEST_PROBE, int(share * gradient_bytes))
    sizes = []
    size = SMALLEST_PROBE
    while size < largest:
        sizes.append(size)
        size *= PROBE_GROWTH
    sizes.append(largest)
    order = list(dict.fromkeys([sizes[0], sizes[-1], *sizes[1:-1]]))
    probes = [(name, nbytes) for _ in range(PROBE_REPEATS) for nbytes in order
              for name in PROBED]
    steps: list[list[tuple[str, int]]] = []
    for probe in probes:  # the cheap ones in pairs
        if steps and len(steps[-1]) == 1 and probe[1] <= CHEAP_PROBE and \
                steps[-1][0][1] <= CHEAP_PROBE:
            steps[-1].append(probe)
        else:
            steps.append([probe])
    return steps


class Recorder:
    """One rank's measurements during the measuring phase (see the module docstring).

    The tuner calls :meth:`begin_step` at each step's first bucket, :meth:`exchange` for
    every bucket, and :meth:`agree` on every rank at the end."""

    def __init__(self, params: dict[str, torch.nn.Parameter], specs: list[str], share: float,
                 probe_group, control_group, device: torch.device) -> None:
        self.params = params
        self.specs = specs
        self.share = share
        self.device = device
        self.timer = Timer(device)
        self.probe_group = probe_group
        self.control_group = control_group  # gloo: the probes' cost agreed on the CPU
        self.probes_done = 0
        self.next_probe_step = SKIPPED_STEPS + FIRST_PROBE  # a few steps' share first
        self.probe_s = 0.0  # the probes' cost so far, agreed
        self.name_of = {id(p): n for n, p in params.items()}
        self.world = dist.get_world_size()
        gradient_bytes = sum(p.numel() * p.element_size() for p in params.values())
        self.schedule = probe_schedule(gradient_bytes, share)
        by_size = sorted(params, key=lambda n: (params[n].numel(), n))
        self.tasks = [(spec, name) for spec in specs for name in by_size]
        self.step = 0  # steps begun
        self.step_ms: list[float] = []
        self.forward_ms: list[float] = []
        self.ready_ms: dict[str, list[float]] = {name: [] for name in params}
        self.bucket_of: dict[str, int] = {}
        self.allreduce_ms: dict[int, list[float]] = {}
        self.bucket_bytes: dict[int, int] = {}
        self.probe_ms: dict[tuple[str, int], list[float]] = {}
        self.coded: dict[tuple[str, str], tuple[float, float, int, float]] = {}
        self.shares: dict[str, list[float]] = {name: [] for name in params}
        self.spent_s = 0.0  # the share's work so far
        self.measured_s = 0.0  # the steps it is a share of
        self._copies: dict[str, torch.Tensor] = {}
        self._started: float | None = None
        self._forward_end: float | None = None
        self._forward_start: float | None = None
        self._bucket = 0
        self._last_done = 0.0
        self._step_done: float | None = None
        self.after_ms: list[float] = []
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready_hook(n))
                       for n, p in params.items()]

    # -- per step ----------------------------------------------------------------------------
    def forward_started(self) -> None:
        self._forward_start = time.perf_counter()
        if self._step_done is not None and self.step > SKIPPED_STEPS:
            # the optimizer, zero_grad and the next batch: from the end of backward
            self.after_ms.append(1000 * (self._forward_start - self._step_done))
        self._step_done = None

    def forward_ended(self) -> None:
        self._forward_end = time.perf_counter()
        if self._forward_start is not None and self.step >= SKIPPED_STEPS:
            self.forward_ms.append(1000 * (self._forward_end - self._forward_start))

    def _ready_hook(self, name: str):
        def ready(_parameter) -> None:
            if self._forward_end is not None and self.step >= SKIPPED_STEPS:
                self.ready_ms[name].append(1000 * (time.perf_counter() - self._forward_end))
        return ready

    def begin_step(self) -> float:
        """A step's first bucket: the step before it timed, then this step's share of work
        (the probes due at it, then compressor tasks within the budget). Returns the
        seconds that work took."""
        now = time.perf_counter()
        if self._started is not None and self.step > SKIPPED_STEPS:
            # the step from its first bucket to this one, less the work done in it
            self.step_ms.append(1000 * (now - self._started) - self._work_ms)
            self.measured_s += self.step_ms[-1] / 1000
        self.step += 1
        self._bucket = 0
        start = time.perf_counter()
        if self.step > SKIPPED_STEPS and self.step >= self.next_probe_step and \
                self.probes_done < len(self.schedule):
            self._run_probes()
        self._run_tasks()
        self._work_ms = 1000 * (time.perf_counter() - start)
        self._started = time.perf_counter()
        return self._work_ms / 1000

    def _run_probes(self) -> None:
        """The next step of the probe schedule, then one small allreduce of what probing
        cost and of the steps measured, so that every rank computes the same step for
        the next probes: as many steps later as keep probing within half the share."""
        start = time.perf_counter()
        for name, nbytes in self.schedule[self.probes_done]:
            dist.barrier(group=self.probe_group)  # aligned: no rank's lag in the timing
            self._probe(name, nbytes)
        self.probes_done += 1
        cost = torch.tensor([time.perf_counter() - start, self.probe_s, self.measured_s,
                             len(self.step_ms)], dtype=torch.float64)
        dist.all_reduce(cost, group=self.control_group)
        cost /= self.world
        self.probe_s = float(cost[1]) + float(cost[0])
        if float(cost[3]) < 1 or float(cost[2]) <= 0:  # no step timed yet: the next one
            self.next_probe_step = self.step + 1
            return
        allowance = 0.5 * self.share * float(cost[2]) / float(cost[3])  # a step's, for probes
        # the next probe step once the half share covers what probing cost so far and
        # what the next step of probes is expected to cost (this one's)
        debt = self.probe_s + float(cost[0]) - 0.5 * self.share * float(cost[2])
        self.next_probe_step = self.step + max(1, math.ceil(debt / allowance))

    @property
    def complete(self) -> bool:
        """Whether every probe and every task ran on this rank."""
        return self.probes_done >= len(self.schedule) and len(self.coded) == len(self.tasks)

    _work_ms = 0.0

    def exchange(self, bucket, hook) -> torch.futures.Future:
        """One bucket through ``hook`` (PyTorch's fp32 or fp16 hook), timed; the gradients
        the next tasks need copied first, and the norms of the first steps taken."""
        index = self._bucket
        self._bucket += 1
        names = [self.name_of[id(p)] for p in bucket.parameters()]
        gradients = bucket.gradients()
        wanted = {name for _, name in self._next_tasks()}
        for name, grad in zip(names, gradients):
            self.bucket_of[name] = index
            if name in wanted and name not in self._copies:
                self._copies[name] = grad.detach().clone()
        if SKIPPED_STEPS <= self.step < SKIPPED_STEPS + SHARE_STEPS:
            for name, grad in zip(names, gradients):
                self.shares[name].append(float(grad.detach().double().pow(2).sum()))
        self.bucket_bytes[index] = bucket.buffer().numel() * bucket.buffer().element_size()
        launched = time.perf_counter()
        future = hook(None, bucket)
        if self.step < SKIPPED_STEPS:
            return future
        if index == 0:
            self._last_done = launched

        last = bucket.is_last()

        def done(finished):
            now = time.perf_counter()
            began = max(launched, self._last_done)
            self._last_done = now
            if last:
                self._step_done = now
            self.allreduce_ms.setdefault(index, []).append(1000 * (now - began))
            return finished.value()
        return future.then(done)

    # -- the share's work ----------------------------------------------------------------------
    def _next_tasks(self) -> list[tuple[str, str]]:
        done = self.coded
        return [task for task in self.tasks if task not in done][:4]

    def _estimate_s(self, spec: str, numel: int) -> float:
        """A task's cost: the least of ``spec``'s tasks so far, each scaled up by elements
        (0 for its first: tasks go smallest first)."""
        return min((2 * (e + d) / 1000 * max(1.0, numel / max(self.params[name].numel(), 1))
                    for (s, name), (e, d, _, _) in self.coded.items() if s == spec),
                   default=0.0)  # x2: the warm-start encode before the timed one

    def _run_tasks(self) -> None:
        for spec, name in self._next_tasks():
            copy = self._copies.get(name)
            if copy is None:
                continue
            allowance = 0.5 * self.share * self.measured_s - self.spent_s  # the tasks' half
            if self._estimate_s(spec, copy.numel()) > allowance or allowance <= 0:
                return
            started = time.perf_counter()
            self.coded[(spec, name)] = self._code(spec, name, copy)
            self.spent_s += time.perf_counter() - started  # the tasks' own: probes apart
            if not any(task[1] == name for task in self._next_tasks()):
                self._copies.pop(name, None)

    def _code(self, spec: str, name: str, gradient: torch.Tensor):
        """Encode and decode ``gradient`` with ``spec`` as a second step (the state a first
        step on a copy left), timed: (encode ms, decode ms, bytes sent, gain)."""
        compressor = from_spec(spec)
        flat = gradient.reshape(-1)
        state = {"salt": zlib.crc32(name.encode()), "shapes": [tuple(gradient.shape)]}
        encode(compressor, flat.clone(), state)  # a first step: warm-started state
        state.pop("residual", None)  # gain on the gradient itself, as the profile's first
        start = self.timer.now()
        encoded = encode(compressor, flat, state)
        middle = self.timer.now()
        approx = decode(compressor, encoded)
        end = self.timer.now()
        return (1000 * (middle - start), 1000 * (end - middle), encoded.bytes_sent,
                gain(flat, approx))

    def _probe(self, name: str, nbytes: int) -> None:
        call = collective_call(name, nbytes, torch.float32, self.probe_group, self.world,
                               self.device)
        start = self.timer.now()
        call()
        self.probe_ms.setdefault((name, nbytes), []).append(
            1000 * (self.timer.now() - start))

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._copies.clear()

    # -- agreement -----------------------------------------------------------------------------
    def keys(self) -> list[tuple]:
        """Every figure's key, in an order every rank shares (the model's names, DDP's
        buckets and the probe schedule are the same on every rank)."""
        keys: list[tuple] = [("step",), ("step_mean",), ("forward",), ("after",)]
        keys += [("ready", name) for name in self.params]
        keys += [("bucket", name) for name in self.params]
        keys += [("allreduce", index) for index in range(len(self.bucket_bytes))]
        keys += [("probe", name, nbytes) for name, nbytes in
                 dict.fromkeys(p for step in self.schedule for p in step)]
        for task in self.tasks:
            keys += [("encode", *task), ("decode", *task), ("sent", *task), ("gain", *task)]
        keys += [("share", name) for name in self.params]
        return keys

    def local(self, key: tuple) -> float | None:
        """This rank's figure for ``key`` (a median), or None where it measured none."""
        kind = key[0]
        series = {"step": lambda: self.step_ms, "forward": lambda: self.forward_ms,
                  "after": lambda: self.after_ms,
                  "ready": lambda: self.ready_ms[key[1]],
                  "allreduce": lambda: self.allreduce_ms.get(key[1], []),
                  "probe": lambda: self.probe_ms.get(key[1:], [])}
        if kind in series:
            values = series[kind]()
            return statistics.median(values) if values else None
        if kind == "step_mean":
            return statistics.fmean(self.step_ms) if self.step_ms else None
        if kind == "bucket":
            return self.bucket_of.get(key[1])
        if kind == "share":
            steps = [sum(self.shares[n][i] for n in self.params)
                     for i in range(min(len(v) for v in self.shares.values()))]
            values = [self.shares[key[1]][i] / total for i, total in enumerate(steps) if total]
            return statistics.median(values) if values else None
        coded = self.coded.get(key[1:])
        if coded is None:
            return None
        return float(coded[("encode", "decode", "sent", "gain").index(kind)])

    def agree(self, group) -> dict[tuple, float]:
        """Every rank's figures, gathered in one collective on ``group`` (a gloo group), and
        reduced the same way on every rank: a collective's time is the least over the
        ranks (the rank that arrived last waited least for the others: the wire's time),
        the rest the mean over the ranks that measured it."""
        keys = self.keys()
        local = torch.full((len(keys),), math.nan, dtype=torch.float64)
        for i, key in enumerate(keys):
            value = self.local(key)
            if value is not None and math.isfinite(value):
                local[i] = value
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local, group=group)
        every = torch.stack(gathered)
        agreed = {}
        for i, key in enumerate(keys):
            values = [float(v) for v in every[:, i] if not math.isnan(float(v))]
            if values:
                agreed[key] = min(values) if key[0] in ("allreduce", "probe") else \
                    sum(values) / len(values)
        return agreed

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.step, "step_ms": self.step_ms, "forward_ms": self.forward_ms,
                "after_ms": self.after_ms,
                "ready_ms": self.ready_ms, "bucket_of": self.bucket_of,
                "allreduce_ms": {str(k): v for k, v in self.allreduce_ms.items()},
                "bucket_bytes": {str(k): v for k, v in self.bucket_bytes.items()},
                "probe_ms": [[name, nbytes, v] for (name, nbytes), v in self.probe_ms.items()],
                "coded": [[spec, name, *v] for (spec, name), v in self.coded.items()],
                "shares": self.shares, "spent_s": self.spent_s,
                "measured_s": self.measured_s, "probes_done": self.probes_done,
                "next_probe_step": self.next_probe_step, "probe_s": self.probe_s}

    def load_state_dict(self, saved: dict) -> None:
        self.step = int(saved["step"])
        self.step_ms = [float(v) for v in saved["step_ms"]]
        self.forward_ms = [float(v) for v in saved["forward_ms"]]
        self.after_ms = [float(v) for v in saved["after_ms"]]
        self.ready_ms = {n: [float(v) for v in saved["ready_ms"][n]] for n in self.params}
        self.bucket_of = {n: int(saved["bucket_of"][n]) for n in saved["bucket_of"]
                          if n in self.params}
        self.allreduce_ms = {int(k): [float(x) for x in v]
                             for k, v in saved["allreduce_ms"].items()}
        self.bucket_bytes = {int(k): int(v) for k, v in saved["bucket_bytes"].items()}
        self.probe_ms = {(str(n), int(b)): [float(x) for x in v]
                         for n, b, v in saved["probe_ms"]}
        self.coded = {(str(s), str(n)): (float(e), float(d), int(b), float(g))
                      for s, n, e, d, b, g in saved["coded"]}
        self.shares = {n: [float(v) for v in saved["shares"][n]] for n in self.params}
        self.spent_s, self.measured_s = float(saved["spent_s"]), float(saved["measured_s"])
        self.probes_done, self.probe_s = int(saved["probes_done"]), float(saved["probe_s"])
        self.next_probe_step = int(saved["next_probe_step"])
        self._started = None  # the step the checkpoint cut is not timed

    # -- what the planner reads ----------------------------------------------------------------
    def measurements(self, agreed: dict[tuple, float], job: dict) -> dict:
        """The agreed figures as :mod:`bytecomp.search.in_job` reads them (``job``: the
        model, the world, the device and the planning settings). A compressor some tensor's
        task never ran for, on any rank, is left out (and named in ``left_out``)."""
        forward = float(agreed.get(("forward",), 0.0))
        step = float(agreed.get(("step",), 0.0))
        tensors: list[dict] = [{"name": name, "shape": list(p.shape),
                                "dtype": str(p.dtype).split(".")[-1],
                    "element_size": p.element_size(),
                    "ready_ms": round(agreed.get(("ready", name), 0.0), 6),
                    "bucket": int(agreed.get(("bucket", name), 0))}
                   for name, p in self.params.items()]
        backward = max((float(t["ready_ms"]) for t in tensors), default=0.0)
        rows: dict[tuple[str, int], list[float]] = {}
        for index, nbytes in sorted(self.bucket_bytes.items()):
            if ("allreduce", index) in agreed:
                rows.setdefault(("allreduce", nbytes), []).append(agreed[("allreduce", index)])
        for key, value in agreed.items():
            if key[0] == "probe":
                rows.setdefault((key[1], key[2]), []).append(value)
        collectives = [{"collective": name, "bytes": nbytes,
                        **dict.fromkeys(("time_ms", "p10_ms", "p90_ms"),
                                        round(statistics.median(values), 6))}
                       for (name, nbytes), values in sorted(rows.items())]
        complete = [spec for spec in self.specs if all(
            ("gain", spec, name) in agreed for name in self.params)]
        coded: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        fidelity = []
        for spec in complete:
            compresses = from_spec(spec).compresses
            for name, p in self.params.items():
                coded.setdefault((spec, p.numel()), []).append(
                    (agreed[("encode", spec, name)], agreed[("decode", spec, name)],
                     agreed[("sent", spec, name)]))
                if compresses:
                    fidelity.append({"tensor": name, "spec": spec,
                                     "gain": round(min(1.0, agreed[("gain", spec, name)]), 6),
                                     "norm_share": round(agreed.get(("share", name), 0.0), 8)})
        compressors = [{"spec": spec, "numel": numel,
                        "encode_ms": round(statistics.median(v[0] for v in values), 6),
                        "decode_ms": round(statistics.median(v[1] for v in values), 6),
                        "payload_bytes": int(statistics.median(v[2] for v in values))}
                       for (spec, numel), values in sorted(coded.items())]
        return {"format": 1, **job, "steps": len(self.step_ms), "specs": complete,
                "step_mean_ms": round(agreed.get(("step_mean",), step), 6),
                "left_out": [spec for spec in self.specs if spec not in complete],
                "times": {"forward": round(forward, 6), "backward": round(backward, 6),
                          "backward_compute": round(backward, 6),
                          "optimizer": round(agreed.get(("after",), 0.0), 6),
                          "iteration": round(step, 6)},
                "tensors": tensors, "collectives": collectives, "compressors": compressors,
                "fidelity": fidelity}
