"""The tuner behind :func:`bytecomp.autotune`: one DDP communication hook that measures,
plans and chooses while the job trains, from step 0.

Phases, each announced on rank 0 in one line (and kept in :attr:`AutoTuner.log`):

``measure``
    The first steps run PyTorch's fp32 allreduce hook (or its fp16 hook, ``start="fp16"``)
    while :class:`~bytecomp.autotuner.measure.Recorder` measures them. At the end the ranks
    agree on the figures in one allreduce.
``plan``
    Rank 0 writes them to a private directory and starts ``python -m
    bytecomp.search.in_job`` beside the job (niced); training goes on at the measuring
    phase's exchange. Each step's first bucket asks rank 0 (one one-number broadcast on
    the tuner's own gloo group) whether the plan is ready; all ranks switch at the same
    step.
``trial``
    The plan's candidates (fp32 DDP, the searched plan, the best hand-picked and
    one-compressor plans) run as the levels of an adaptive plan through bytecomp's
    :class:`~bytecomp.runtime.executor.Executor`: the runtime trial times them in turn and
    keeps one, and the gain controller then watches it (``watch``).
``fp32``
    Where no candidate was predicted to gain, the job keeps fp32 DDP, and says why.

The plan is saved (``plan_out``) once it arrives, and again as the kept level alone once
the trial decides: ``apply_plan`` runs it next time without measuring.
"""

from __future__ import annotations

import json
import math
import sys
import time
import weakref
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from bytecomp.autotuner.measure import Recorder
from bytecomp.autotuner.planner_child import FAILED, PlannerChild
from bytecomp.comm.topology import new_group
from bytecomp.errors import BytecompError
from bytecomp.plan_file import plan_from_dict
from bytecomp.plan_types import Plan
from bytecomp.runtime.apply import prepare
from bytecomp.runtime.executor import Executor, device_of
from bytecomp.runtime.state import Stats

MEASURE, PLAN, TRIAL, WATCH, FP32 = "measure", "plan", "trial", "watch", "fp32"
PHASES = (MEASURE, PLAN, TRIAL, WATCH, FP32)
STARTS = {"fp32": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook}
FORMAT = 1  # of state_dict()
# The measuring phase goes on past measure_steps until every rank measured every probe and
# compressor task within its share, checked every CHECK_EVERY steps, for at most
# MEASURE_CAP_S seconds or LONGEST times measure_steps (then what was not measured is
# left out: short steps leave the share little time a step, not little time in all).
CHECK_EVERY = 10
LONGEST = 50
MEASURE_CAP_S = 120.0
POLL_S = 0.25  # how often the ranks ask rank 0 whether the plan is ready
class AutoTuner:
    """The hook state of :func:`bytecomp.autotune`: ``phase`` (``measure``, ``plan``,
    ``trial``, ``watch`` or ``fp32``), ``log`` (the line rank 0 printed at each phase),
    ``plan`` (once it arrived) and ``executor`` (once it runs). It answers as the
    executor does: ``stats``, ``step``, ``level``, ``report_step_ms``,
    ``state_dict()``, ``close()``, and as a context manager."""

    def __init__(self, params: dict[str, torch.nn.Parameter], specs: list[str],
                 measure_steps: int, share: float, start: str, plan_out: str | None,
                 host_workers: int | None, min_fidelity: float, evaluations: int,
                 margin: float, model_name: str, bucket_cap_mb: float, fingerprint_of: str) -> None:
        self.params = params
        self.specs = specs
        self.measure_steps = measure_steps
        self.share = share
        self.start = start
        self.plan_out = plan_out
        self.host_workers = host_workers
        self.device = device_of(params)
        self.job = {"model": {"name": model_name, "fingerprint": fingerprint_of},
                    "device": self.device.type,
                    "device_name": torch.cuda.get_device_name(self.device)
                    if self.device.type == "cuda" else "cpu",
                    "backend": dist.get_backend(), "world_size": dist.get_world_size(),
                    "nodes": 1, "ranks_per_node": dist.get_world_size(),
                    "bucket_cap_mb": bucket_cap_mb,
                    "settings": {"min_fidelity": min_fidelity, "evaluations": evaluations,
                                 "margin": margin}}
        self.rank = dist.get_rank()
        world = list(range(dist.get_world_size()))  # the job's timeout on both groups
        self.control = new_group(world, backend="gloo")  # flags, agreement, the plan
        self.probes = self.control if dist.get_backend() == "gloo" else new_group(world)
        for group in dict.fromkeys((self.control, self.probes)):  # connect them now, not
            dist.barrier(group=group)  # inside the first measured probe
        self.phase = MEASURE
        self.step = 0  # steps begun
        self.log: list[str] = []
        self.recorder: Recorder | None = Recorder(params, specs, share, self.probes,
                                                  self.control, self.device)
        self.agreed: dict | None = None
        self.plan: Plan | None = None
        self.executor: Executor | None = None
        self._own_stats = Stats()
        self._child: PlannerChild | None = None  # rank 0's, while it plans
        self._plan_steps: list[float] = []  # when each planning step began
        self._poll_every, self._plan_step = 1, 0
        self._measuring_since = time.monotonic()
        self._ddp: weakref.ref | None = None
        self._forward_hooks: list = []
        self._first_bucket = True
        self._fp32_bytes = sum(p.numel() * p.element_size() for p in params.values())
        self.closed = False

    # -- registration --------------------------------------------------------------------------
    def attach(self, ddp) -> None:
        """Time ``ddp``'s forward passes (the measuring phase's forward time and the origin
        of its gradients' ready times); no reference to ``ddp`` but a weak one."""
        self._ddp = weakref.ref(ddp)
        recorder = weakref.ref(self)

        def before(_module, _inputs):
            tuner = recorder()
            if tuner is not None and tuner.recorder is not None and torch.is_grad_enabled():
                tuner.recorder.forward_started()

        def after(_module, _inputs, _output):
            tuner = recorder()
            if tuner is not None and tuner.recorder is not None and torch.is_grad_enabled():
                tuner.recorder.forward_ended()

        self._forward_hooks = [ddp.register_forward_pre_hook(before),
                               ddp.register_forward_hook(after)]

    @staticmethod
    def hook(self: AutoTuner, bucket):  # no annotations: DDP rejects postponed ones
        """The communication hook (``self`` is DDP's hook state)."""
        if self.closed:
            raise BytecompError("this autotune hook is closed: call bytecomp.autotune again "
                                "to train on")
        if self._first_bucket:
            self._first_bucket = False
            self._boundary()
        if bucket.is_last():
            self._first_bucket = True
        if self.executor is not None:
            return Executor.hook(self.executor, bucket)
        if bucket.is_last():
            self._own_stats.add(steps=1, fp32_bytes=self._fp32_bytes,
                                sent_bytes=self._fp32_bytes // (2 if self.start == "fp16"
                                                                else 1))
        if self.recorder is not None:
            return self.recorder.exchange(bucket, STARTS[self.start])
        return STARTS[self.start](None, bucket)  # type: ignore[arg-type]  # the default group

    # -- phases --------------------------------------------------------------------------------
    def _boundary(self) -> None:
        """A step's first bucket, the same step on every rank: the phase's work, and the
        move to the next phase where it is due."""
        step = self.step
        self.step += 1
        if self.phase == MEASURE:
            assert self.recorder is not None
            if step < self.measure_steps or not self._measured_enough(step):
                self.recorder.begin_step()
                return
            self._end_measuring(step)
        elif self.phase == PLAN:
            self._plan_steps.append(time.perf_counter())
            if self._child is not None and len(self._plan_steps) > 1:
                self._child.step(self._plan_steps[-1] - self._plan_steps[-2])
            if (step - self._plan_step) % self._poll_every == 0:
                self._poll(step)
        elif self.phase == TRIAL:
            self._watch_trial(step)

    def _measured_enough(self, step: int) -> bool:
        """From ``measure_steps`` on, every :data:`CHECK_EVERY` steps: whether every rank
        measured all it set out to, or the phase has run :data:`MEASURE_CAP_S` seconds on
        some rank (one small allreduce: every rank ends at the same step), or
        :data:`LONGEST` x ``measure_steps`` steps."""
        if step >= LONGEST * self.measure_steps:
            return True
        if (step - self.measure_steps) % CHECK_EVERY:
            return False
        assert self.recorder is not None
        state = torch.tensor([0.0 if self.recorder.complete else 1.0,
                              time.monotonic() - self._measuring_since], dtype=torch.float64)
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=self.control)
        return float(state[0]) == 0.0 or float(state[1]) >= MEASURE_CAP_S

    def _say(self, line: str) -> None:
        self.log.append(line)
        if self.rank == 0:
            print(f"bytecomp autotune: {line}", file=sys.stderr, flush=True)

    def _end_measuring(self, step: int) -> None:
        recorder = self.recorder
        assert recorder is not None
        recorder.begin_step()  # the last step's time
        agreed = recorder.agree(self.control)
        measured = recorder.measurements(agreed, self.job)
        shares = [100 * s / recorder.measured_s if recorder.measured_s else 0.0
                  for s in (recorder.spent_s, recorder.probe_s)]
        recorder.close()
        self.recorder = None
        self.agreed = measured
        left = f"; left out (not measured within the share): {', '.join(measured['left_out'])}" \
            if measured["left_out"] else ""
        self._say(f"step {step}: measured {measured['steps']} steps of {self.start} DDP "
                  f"(step {measured['times']['iteration']:.1f} ms, "
                  f"{len(measured['collectives'])} collective sizes, "
                  f"{len(measured['specs'])} compressors on {len(self.params)} tensors; "
                  f"measuring cost {sum(shares):.1f}% of this rank's steps: compressors "
                  f"{shares[0]:.1f}%, probes {shares[1]:.1f}%){left}")
        self._start_planning(step)

    def _start_planning(self, step: int) -> None:
        self.phase = PLAN
        # ask rank 0 about the plan every POLL_S of training: each ask is a broadcast that
        # holds the step's first bucket until every rank is there
        step_ms = (self.agreed or {}).get("times", {}).get("iteration") or 1.0
        self._poll_every = max(1, math.ceil(1000 * POLL_S / max(step_ms, 1e-3)))
        self._plan_step = step
        if self.rank == 0:
            self._child = PlannerChild(self.agreed or {}, self.share,
                                       (self.agreed or {}).get("step_mean_ms", step_ms))
        self._plan_steps = []
        self._say(f"step {step}: planning beside the job (rank 0's child process, niced); "
                  f"training goes on at {self.start} DDP meanwhile")

    def _poll(self, step: int) -> None:
        """Rank 0 says whether the plan is ready (0 not yet, 1 ready, 2 failed); on 1 every
        rank receives it, on 2 the reason."""
        flag = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            flag[0] = self._child.state() if self._child is not None else FAILED
        dist.broadcast(flag, src=0, group=self.control)
        if int(flag[0]) == 0:
            return
        message: list[str | None] = [None]
        if self.rank == 0:
            message = [self._child.result(int(flag[0])) if self._child is not None
                       else "rank 0 has no planner"]
        dist.broadcast_object_list(message, src=0, group=self.control)
        took = self._planning_words()
        self._cleanup_child()
        if int(flag[0]) == FAILED:
            self.phase = FP32
            self._say(f"step {step}: planning failed ({message[0]}; {took}); keeps "
                      f"{self.start} DDP")
            return
        self._say(f"step {step}: planned ({took})")
        self._hand_over(plan_from_dict(json.loads(str(message[0])), "<autotune plan>"), step)

    def _planning_words(self) -> str:
        """How long planning took and what it cost the steps meanwhile (on a machine with
        few cores the child takes some of the ranks' CPU)."""
        marks = self._plan_steps
        steps = [1000 * (b - a) for a, b in zip(marks, marks[1:])]
        if not steps:
            return "within a step"
        median = sorted(steps)[len(steps) // 2]
        measured = (self.agreed or {}).get("times", {}).get("iteration")
        against = f", {100 * (median / measured - 1):+.1f}% against the measured step" \
            if measured else ""
        pauses = self._child.pauses if self._child is not None else 0
        paused = f", the planner paused {pauses} times to keep the share" if pauses else ""
        return (f"{(marks[-1] - marks[0]):.1f} s over {len(steps)} steps, their median "
                f"{median:.1f} ms{against}{paused}")

    def _cleanup_child(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def _hand_over(self, plan: Plan, step: int) -> None:
        """Run ``plan`` from this step: fp32 DDP kept where it compresses nothing, else
        bytecomp's executor (the trial first)."""
        self.plan = plan
        record = plan.search.get("autotune", {})
        self._save(plan)
        if not plan.levels:
            self.phase = FP32
            self._say(f"step {step}: {record.get('reason', 'keeps fp32 DDP')}"
                      + self._saved_words())
            return
        self.executor = self._executor(plan)
        self.phase = TRIAL
        steps = plan.adaptive.trial_steps if plan.adaptive is not None else 0
        self._say(f"step {step}: {record.get('reason', 'a trial')}; the runtime trial times "
                  f"them in turn for {steps} steps" + self._saved_words())

    def _executor(self, plan: Plan) -> Executor:
        ddp = self._ddp() if self._ddp is not None else None
        if ddp is None:
            raise BytecompError("bytecomp.autotune: the DistributedDataParallel model is gone")
        runner = prepare(ddp.module, plan, None, self.host_workers, False, False, ddp,
                         caller="autotune")
        assert isinstance(runner, Executor)
        return runner

    def _watch_trial(self, step: int) -> None:
        executor = self.executor
        assert executor is not None and executor.adaptation is not None
        trial = executor.adaptation.trial
        if trial is None or not trial.decided:
            return
        self.phase = WATCH
        assert self.plan is not None and self.plan.levels is not None
        assert trial.chosen is not None
        kept = self.plan.levels[trial.chosen]
        self._save(Plan(self.plan.model_fingerprint, self.plan.world_size, self.plan.nodes,
                        self.plan.ranks_per_node, self.plan.bucket_cap_mb, kept.entries,
                        {**self.plan.predicted_ms, "plan": kept.predicted_ms},
                        {**self.plan.search, "autotune": {
                            **self.plan.search.get("autotune", {}),
                            "kept": kept.setting, "verdict": trial.verdict}},
                        dict(self.plan.info), host_workers=self.plan.host_workers))
        self._say(f"step {step}: the trial keeps level {trial.chosen} ({kept.setting}): "
                  f"{trial.verdict}; the gain controller watches it" + self._saved_words())

    def _save(self, plan: Plan) -> None:
        if self.rank == 0 and self.plan_out is not None:
            plan.save(self.plan_out)

    def _saved_words(self) -> str:
        return f"; saved {self.plan_out}" if self.plan_out is not None else ""

    # -- what the executor answers -------------------------------------------------------------
    @property
    def stats(self) -> Stats:
        """The exchange's statistics: the executor's once the plan runs, before that the
        measuring phase's exchange's (bytes and steps)."""
        return self.executor.stats if self.executor is not None else self._own_stats

    @property
    def level(self) -> int:
        """The plan's current level (0 before the plan runs, and for fp32 DDP kept)."""
        return self.executor.level if self.executor is not None else 0

    def report_step_ms(self, ms: float) -> None:
        """Tell the trial and the controller the step's own duration (see
        :meth:`~bytecomp.runtime.executor.Executor.report_step_ms`); ignored before the
        plan runs."""
        if self.executor is not None:
            self.executor.report_step_ms(ms)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The tuner's phase and what it decided, to resume in the same phase with the same
        decisions. Collective: call it on every rank (the measuring phase's figures and the
        executor's residuals are gathered from every rank)."""
        saved: dict = {"autotune": FORMAT, "phase": self.phase, "step": self.step,
                       "log": list(self.log), "start": self.start, "agreed": self.agreed,
                       "plan": None if self.plan is None else self.plan.to_dict()}
        if self.recorder is not None:
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self.recorder.state_dict(), group=self.control)
            saved["measured"] = gathered
        if self.executor is not None:
            saved["executor"] = self.executor.state_dict()
        return saved

    def load_state_dict(self, saved: dict) -> None:
        """Restore :meth:`state_dict` on every rank, before the first step: the phase it was
        in continues (a planning phase plans the same measurements again)."""
        try:
            if saved.get("autotune") != FORMAT or saved["phase"] not in PHASES or \
                    saved["start"] != self.start:
                raise BytecompError("not this tuner's")
            phase, step = saved["phase"], int(saved["step"])
            log = [str(line) for line in saved["log"]]
        except (KeyError, TypeError, ValueError, AttributeError, BytecompError) as error:
            raise BytecompError(f"bytecomp.autotune: the saved state is not an autotune "
                                f"state of this job ({error})") from None
        if step < 0:
            raise BytecompError("bytecomp.autotune: the saved state's step is negative")
        self.step, self.log = step, log
        self.agreed = saved.get("agreed")
        if phase == MEASURE:
            assert self.recorder is not None
            try:
                self.recorder.load_state_dict(saved["measured"][self.rank])
            except (KeyError, TypeError, ValueError, IndexError) as error:
                raise BytecompError(f"bytecomp.autotune: the saved measurements are damaged "
                                    f"({error!r})") from None
            return
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self.phase = phase
        if phase == PLAN:
            self._start_planning(step)
            return
        self.plan = plan_from_dict(saved["plan"], "<autotune state>") \
            if saved.get("plan") is not None else None
        if phase in (TRIAL, WATCH) and self.plan is not None:
            self.executor = self._executor(self.plan)
            self.executor.load_state_dict(saved["executor"])

    # -- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the planner if it runs, close the executor, remove the hooks."""
        self._cleanup_child()
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        for handle in self._forward_hooks:
            handle.remove()
        self._forward_hooks = []
        if self.executor is not None:
            self.executor.close()
        self.closed = True

    def __enter__(self) -> AutoTuner:
        return self

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        if self.executor is not None:
            return self.executor.__exit__(kind, error, traceback)
        if error is None:
            self.close()
        else:
            self._cleanup_child()
        return False

