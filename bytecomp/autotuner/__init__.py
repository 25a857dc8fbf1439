"""``bytecomp.autotune``: measure, plan and choose inside the running job, from step 0.

One line in the training script replaces ``bytecomp profile`` and ``bytecomp plan``::

    ddp = DistributedDataParallel(model)
    tuner = bytecomp.autotune(ddp)
    ...train as before...

The first steps run fp32 DDP while they are measured (:mod:`bytecomp.autotuner.measure`),
a plan is searched beside the job, and its candidates are timed by the runtime trial
(:mod:`bytecomp.autotuner.tuner`). docs/autotune.md says when to use it and when the
offline profile and plan are better.
"""

from __future__ import annotations

import math

from bytecomp.errors import BytecompError

__all__ = ["autotune", "DEFAULT_SPECS", "DEFAULT_SHARE", "DEFAULT_MEASURE_STEPS"]

# The compressors measured by default: the fp16 hook's cast, a sparsifier with error
# feedback and the PowerSGD hook's low rank (what the baselines a user would pick by hand
# use, and the matrix's best plans), plus fp32 as it is.
DEFAULT_SPECS = ("none", "fp16", "topk:ratio=0.01", "powersgd:rank=4")
DEFAULT_SHARE = 0.05
DEFAULT_MEASURE_STEPS = 40
MAX_MEASURE_STEPS = 100_000
DEFAULT_EVALUATIONS = 2000
DEFAULT_MARGIN = 0.03


def autotune(ddp_model, compressors=None, measure_steps: int = DEFAULT_MEASURE_STEPS,
             share: float = DEFAULT_SHARE, start: str = "fp32",
             plan_out: str | None = "autotune-plan.yaml", host_workers: int | None = None,
             min_fidelity: float = 0.75, evaluations: int = DEFAULT_EVALUATIONS,
             margin: float = DEFAULT_MARGIN):
    """Register one communication hook on ``ddp_model`` (DDP, before the first backward
    pass, on every rank) that measures the job, plans it and runs the best plan found,
    while training goes on from step 0. Returns the tuner: the executor's ``stats``,
    ``state_dict``/``load_state_dict`` (collective) and ``close``, and a context manager.

    * ``compressors``: the compressor specs measured and planned with (default
      :data:`DEFAULT_SPECS`);
    * ``measure_steps``: steps of ``start`` DDP (``"fp32"`` or ``"fp16"``) measured
      before planning, at least (the phase goes on, up to 5x as long, until every
      probe and compressor has been measured within the share);
    * ``share``: the most the measuring may cost, as a share of the measured steps' time
      (0 < share <= 0.5): half for the compressors, half for the probes;
    * ``plan_out``: where rank 0 saves the plan (again as the kept level once the trial
      decides); None: nowhere;
    * ``min_fidelity``: no candidate keeps less of the gradient than this;
    * ``evaluations``: the search's evaluations (deterministic: a resumed run plans the
      same plan);
    * ``margin``: a candidate is timed where it is predicted at least this share sooner
      than fp32 DDP (iteration time / fidelity); negative, also those predicted up to
      that much later (where the prediction's error is wider than that: the trial
      measures them).

    Use :func:`bytecomp.comm_hook` ``(autotune={...})`` where a framework registers the
    hook itself.

    >>> tuner = bytecomp.autotune(ddp)
    >>> ...train...
    >>> torch.save({"model": ddp.state_dict(), "bytecomp": tuner.state_dict()}, path)
    """
    from bytecomp.autotuner.tuner import AutoTuner
    from bytecomp.runtime.apply import check_unhooked, claim, ddp_of

    settings = checked_settings(compressors=compressors, measure_steps=measure_steps,
                                share=share, start=start, plan_out=plan_out,
                                host_workers=host_workers, min_fidelity=min_fidelity,
                                evaluations=evaluations, margin=margin)
    ddp = ddp_of(ddp_model)
    check_unhooked(ddp, "autotune")
    tuner = build_tuner(ddp, settings)
    ddp.register_comm_hook(tuner, AutoTuner.hook)
    claim(ddp, "bytecomp.autotune")
    return tuner


SETTINGS = ("compressors", "measure_steps", "share", "start", "plan_out", "host_workers",
            "min_fidelity", "evaluations", "margin")


def checked_settings(**given) -> dict:
    """:func:`autotune`'s settings (any left out at their defaults), each checked by type
    and range; one line naming the first that is not."""
    from bytecomp.autotuner.tuner import STARTS
    from bytecomp.compress import from_spec
    from bytecomp.files import check_output_file
    from bytecomp.runtime.apply import check_settings

    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise BytecompError(f"bytecomp.autotune: no setting named {unknown[0]!r} (settings: "
                            f"{', '.join(SETTINGS)})"[:300])
    settings = {"compressors": None, "measure_steps": DEFAULT_MEASURE_STEPS,
                "share": DEFAULT_SHARE, "start": "fp32", "plan_out": "autotune-plan.yaml",
                "host_workers": None, "min_fidelity": 0.75,
                "evaluations": DEFAULT_EVALUATIONS, "margin": DEFAULT_MARGIN, **given}
    settings["compressors"] = _specs(settings["compressors"], from_spec)
    _check_number("measure_steps", settings["measure_steps"], 1, MAX_MEASURE_STEPS,
                  integer=True)
    _check_number("share", settings["share"], 0.0, 0.5, low_open=True)
    _check_number("min_fidelity", settings["min_fidelity"], 0.0, 1.0)
    _check_number("evaluations", settings["evaluations"], 1, 1_000_000, integer=True)
    _check_number("margin", settings["margin"], -1.0, 0.5)
    if settings["start"] not in STARTS:
        raise BytecompError(f"bytecomp.autotune: start must be one of {', '.join(STARTS)}, "
                            f"got {settings['start']!r}"[:300])
    plan_out = settings["plan_out"]
    if plan_out is not None:
        if not isinstance(plan_out, str):
            raise BytecompError(f"bytecomp.autotune: plan_out must be a path or None, got "
                                f"{type(plan_out).__name__}")
        check_output_file(plan_out, "plan_out")
    check_settings("autotune", None, settings["host_workers"], True)
    return settings


def build_tuner(ddp, settings: dict):
    """The :class:`~bytecomp.autotuner.tuner.AutoTuner` of ``ddp`` with checked
    ``settings``, timing its forward passes; not registered. Collective (it makes the
    tuner's process groups): every rank calls it."""
    import torch.distributed as dist

    from bytecomp.autotuner.tuner import AutoTuner
    from bytecomp.naming import normalize
    from bytecomp.plan_types import fingerprint

    if not dist.is_initialized():
        raise BytecompError("bytecomp needs torch.distributed initialized "
                            "(dist.init_process_group)")
    own = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
    params = dict(zip(normalize(n for n, _ in own).names, (p for _, p in own)))
    tuner = AutoTuner(params, settings["compressors"], settings["measure_steps"],
                      settings["share"], settings["start"], settings["plan_out"],
                      settings["host_workers"], settings["min_fidelity"],
                      settings["evaluations"], settings["margin"], type(ddp.module).__name__,
                      float(ddp.bucket_bytes_cap) / (1 << 20), fingerprint(ddp.module))
    tuner.attach(ddp)
    return tuner


def _specs(compressors, from_spec) -> list[str]:
    if compressors is None:
        return list(DEFAULT_SPECS)
    if isinstance(compressors, str) or not all(isinstance(c, str) for c in compressors):
        raise BytecompError("bytecomp.autotune: compressors must be a list of compressor "
                            "specs (strings), e.g. ['fp16', 'topk:ratio=0.01']")
    specs = [from_spec(c).spec for c in compressors]
    if all(from_spec(spec).compresses for spec in specs):  # fp32 as it is, always
        specs.insert(0, from_spec("none").spec)
    return list(dict.fromkeys(specs))


def _check_number(name: str, value, low: float, high: float, integer: bool = False,
                  low_open: bool = False) -> None:
    kind = "a whole number" if integer else "a number"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float)) \
        and math.isfinite(value) and (low < value if low_open else low <= value) \
        and value <= high
    if not ok:
        raise BytecompError(f"bytecomp.autotune: {name} must be {kind} "
                            f"{'above' if low_open else 'from'} {low:g} "
                            f"{'up to' if low_open else 'to'} {high:g}, got {value!r}"[:300])
