"""The search's baselines: PyTorch's DDP hooks as options and assignments (a compressor
on the scheme its own rounds end with, what ``powerSGD_hook`` compresses), and the
margin's choice of fp32 DDP over a search's plan."""

from __future__ import annotations

from bytecomp.comm.schemes import native_scheme
from bytecomp.compress import from_spec
from bytecomp.compress.base import FP16_HOOK, POWERSGD_HOOK
from bytecomp.compress.lowrank import powersgd_compresses
from bytecomp.plan_types import NO_COMPRESSION, Option
from bytecomp.search.problem import Problem
from bytecomp.search.result import Baseline
from bytecomp.search.settings import BaselineKind


def powersgd_hook_assignment(problem: Problem, spec: str) -> list[int] | None:
    """What PyTorch's ``powerSGD_hook`` does with PowerSGD ``spec`` (error feedback and
    warm start on, as the hook's), as an assignment: ``spec`` on the matrices its rule
    compresses, fp32 on the rest; None where ``spec`` is not that or an option is missing."""
    compressor = from_spec(spec)
    if compressor.runs_as_pytorch_hook() != POWERSGD_HOOK:
        return None
    try:
        compress = problem.index_of(native_option(spec))
        keep = problem.index_of(NO_COMPRESSION)
    except ValueError:
        return None
    rank = compressor.values["rank"]
    return [compress if powersgd_compresses(t.shape, rank) else keep for t in problem.tensors]


def hook_specs(specs, hook: str) -> list[str]:
    """The specs (sorted) whose compressor is what PyTorch's ``hook`` does."""
    return [s for s in sorted(specs) if from_spec(s).runs_as_pytorch_hook() == hook]


def native_option(spec: str) -> Option:
    """``spec`` on the device, on the one-stage scheme its own rounds end with."""
    return Option(spec, "device", native_scheme(from_spec(spec)))


def baseline_options(profile_specs: set[str]) -> tuple[str | None, str | None]:
    """The specs of the fp16 and PowerSGD hooks' baselines (PowerSGD at rank 4 where the
    profile has it), among the profiled ones."""
    fp16 = next(iter(hook_specs(profile_specs, FP16_HOOK)), None)
    powersgd = sorted(hook_specs(profile_specs, POWERSGD_HOOK),
                      key=lambda s: (from_spec(s).values["rank"] != 4, s))
    return fp16, (powersgd[0] if powersgd else None)


def baseline_to_keep(baselines: list[Baseline], searchable: set[int], value: float,
                      min_gain: float, fidelity: float | None = None) -> Baseline | None:
    """fp32 DDP, when the search beats it by less than ``min_gain`` (and, by effective
    time, it keeps at least the search's ``fidelity``: it always does): a gain smaller
    than the model's error is not worth compressing.

    Only fp32 DDP: it is a baseline under every choice of compressors, so the margin never
    makes more choice worse. Were another baseline kept (the fp16 hook, a compressor on
    every tensor), a search with more compressors, finding a better plan, could keep a
    baseline within the margin above it that a search with fewer does not have (ResNet-101
    with every compressor kept a uniform plan at 93.61 ms over the search's 90.20, where
    dgc alone planned 92.76). Plans within the margin of each other are the finalists'
    business: trained, or trialled in the running job, rather than picked by prediction."""
    if min_gain <= 0:
        return None
    fp32 = next((b for b in baselines if b.kind is BaselineKind.FP32_DDP
                 and set(b.assignment) <= searchable), None)
    if fp32 is None or value <= fp32.value * (1 - min_gain):
        return None
    if fidelity is not None and (fp32.fidelity or 0.0) < fidelity - 1e-9:
        return None
    return fp32
