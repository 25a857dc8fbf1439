"""A plan's record of how it was chosen: its ``objective``, measured ``fidelity``, the
``finalists`` a verified plan trained and its ``verification`` (see
:mod:`bytecomp.plan_file` for the schema). Informative, but shown and compared, so
checked as everything else.
"""

from __future__ import annotations

import math

from bytecomp.plan_types import MAX_VERIFY_STEPS
from bytecomp.schema import (
    MAX_BUCKET_CAP_MB,
    MAX_PREDICTED_MS,
    MAX_SECONDS,
    MAX_STEPS_FACTOR,
    PROBE_BATCHES,
    Integer,
    Number,
    OneOf,
    Reader,
    number_in,
)

OBJECTIVES = ("effective", "time")  # what a search minimizes (bytecomp.search.problem.Objective)
PLAN_OBJECTIVES = (*OBJECTIVES, "adaptive")  # objective.name in a plan file
# A verified plan's record of its finalists' training (bytecomp.search.verify): the
# finalists' sources and the batches their losses were measured on
FINALIST_SOURCES = ("search", "baseline", "mix")
VERIFY_BATCHES = (*PROBE_BATCHES, "none")  # "none": none trained
# why the finalists' training stopped: fp32 DDP's loss flattened, the clock, or the count
# (forced, or all the budget afforded)
STOPPED_FLAT, STOPPED_BUDGET, STOPPED_STEPS = "flattened", "budget", "steps"
VERIFY_STOPS = (STOPPED_FLAT, STOPPED_BUDGET, STOPPED_STEPS)
# the kinds of plan whose model error a verified plan records (bytecomp.search.verify.
# kind_of): the search's plans (bytecomp's executor) and the hand-picked baselines (DDP and
# PyTorch's hooks); the error, measured over predicted ms per step, up to MAX_MODEL_ERROR
MODEL_KINDS = ("searched", "hand-picked")
MAX_MODEL_ERROR = 1000.0
# a finalist's numbers: its bucket cap and prediction, and (null where untrained) its
# fidelity, steps factor and value (predicted_ms x steps_factor)
FINALIST_NUMBERS = {"bucket_cap_mb": Number(0.0, MAX_BUCKET_CAP_MB),
                    "predicted_ms": Number(0.0, MAX_PREDICTED_MS),
                    "fidelity": Number(0.0, 1.0, optional=True),
                    "steps_factor": Number(0.0, MAX_STEPS_FACTOR, optional=True),
                    "value": Number(0.0, MAX_PREDICTED_MS * MAX_STEPS_FACTOR, optional=True)}


def check_numbers(reader: Reader, value, where: str, high: float) -> None:
    """Every number under ``value`` (through mappings and lists) from 0 to ``high``, or null;
    nothing else but strings as keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_numbers(reader, item, f"{where}.{key}", high)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_numbers(reader, item, f"{where}[{index}]", high)
    elif value is not None and not (number_in(value, 0.0, high) and math.isfinite(value)):
        reader.fail(where, f"must be a finite number from 0 to {high:g} or null, got {value!r}")


def check_objective(reader: Reader, objective: dict | None) -> None:
    """``objective``: what the plan was searched for (informative, but shown and compared,
    so checked as everything else)."""
    if objective is None:
        return
    reader.declared(objective, "name", str, OneOf(tuple(PLAN_OBJECTIVES)), "objective.")
    for key in ("min_fidelity", "threshold"):
        value = objective.get(key)
        if value is not None:
            reader.check(f"objective.{key}", value, Number(0.0, 1.0))


def check_fidelity(reader: Reader, fidelity: dict | None) -> None:
    """``fidelity``: gains from 0 to 1 (the plan's and the baselines'), and effective times."""
    if fidelity is None:
        return
    for key in ("plan", "baselines"):
        check_numbers(reader, fidelity.get(key), f"fidelity.{key}", 1.0)
    # time / fidelity: unbounded above as the fidelity nears 0 (null where it is 0)
    check_numbers(reader, fidelity.get("effective_ms"), "fidelity.effective_ms", math.inf)


def check_finalists(reader: Reader, finalists) -> str:
    """The finalists a verified plan records (bytecomp.search.finalists): what they are,
    what was predicted and measured, and which was chosen (one, whose name is returned).
    Each name once; ``value`` is ``predicted_ms`` x ``steps_factor`` (1 where untrained),
    as rounded in the file."""
    if not isinstance(finalists, list) or not finalists:
        reader.fail("finalists", "must be a non-empty list")
    chosen: list[str] = []
    seen: dict[str, int] = {}
    for index, finalist in enumerate(finalists):
        where = f"finalists[{index}]."
        if not isinstance(finalist, dict):
            reader.fail(f"finalists[{index}]", "must be a mapping")
        name = reader.field(finalist, "name", str, where)
        reader.printable(f"{where}name", name)
        if name in seen:
            reader.fail(f"{where}name", f"{name!r} is also finalists[{seen[name]}]")
        seen[name] = index
        reader.declared(finalist, "source", str, OneOf(tuple(FINALIST_SOURCES)), where)
        for key, check in FINALIST_NUMBERS.items():
            reader.check(f"{where}{key}", finalist.get(key), check)
        value, predicted = finalist.get("value"), finalist["predicted_ms"]
        factor = finalist.get("steps_factor")
        _check_factor_range(reader, finalist, factor, where)
        expected = predicted * (1.0 if factor is None else factor)
        if value is not None and abs(value - expected) > 1e-3 * (1 + expected):
            reader.fail(f"{where}value", f"{value!r} is not predicted_ms x steps_factor "
                                         f"({expected:.4f})")
        if reader.field(finalist, "chosen", bool, where):
            chosen.append(name)
    if len(chosen) != 1:
        reader.fail("finalists", f"exactly one must be chosen, {len(chosen)} are")
    return chosen[0]


def _check_factor_range(reader: Reader, finalist: dict, factor, where: str) -> None:
    """A finalist's optional ``steps_factor_low`` and ``steps_factor_high``: its factor's
    range within fp32's loss noise floor (bytecomp.training.factors), both or neither,
    numbers from 0 to the cap around its ``steps_factor``."""
    low, high = finalist.get("steps_factor_low"), finalist.get("steps_factor_high")
    if low is None and high is None:
        return
    for key, bound in (("steps_factor_low", low), ("steps_factor_high", high)):
        if not number_in(bound, 0.0, MAX_STEPS_FACTOR):
            reader.fail(f"{where}{key}", f"must be a number from 0 to {MAX_STEPS_FACTOR:g}, "
                                         f"given with the other bound, got {bound!r}")
    # rounded to 4 places in the file, as the factor is
    assert low is not None and high is not None  # number_in held
    if factor is None or not low - 1e-4 <= factor <= high + 1e-4:
        reader.fail(f"{where}steps_factor_low", f"the range {low!r} to {high!r} must hold the "
                                                f"steps_factor ({factor!r})")


def check_verification(reader: Reader, verification: dict | None, chosen: str) -> None:
    """``verification``: the finalists' training (bytecomp.search.verify): its steps
    (0: nothing was trained), batches, seconds, fp32 DDP's improvement, why it stopped
    (optional), the chosen finalist's predicted fidelity where it is below the floor
    (optional), and the chosen finalist, which must be the one the finalists mark
    chosen."""
    if verification is None:
        return
    where = "verification."
    reader.declared(verification, "steps", int, Integer(0, MAX_VERIFY_STEPS), where)
    reader.declared(verification, "batches", str, OneOf(tuple(VERIFY_BATCHES)), where)
    for key, high in (("seconds", MAX_SECONDS), ("fp32_improvement", math.inf),
                      ("fp32_last_quarter", math.inf)):
        value = verification.get(key, 0.0)
        if not (number_in(value, 0.0, high) and math.isfinite(value)):
            reader.fail(f"{where}{key}", f"must be a finite number from 0 to {high:g}, got "
                                         f"{value!r}" if high < math.inf else
                        f"must be a finite number, at least 0, got {value!r}")
    floor = verification.get("loss_floor")  # optional: fp32's loss noise floor
    if floor is not None and not (number_in(floor, 0.0, math.inf) and math.isfinite(floor)):
        reader.fail(f"{where}loss_floor", f"must be a finite number, at least 0, or absent, "
                                          f"got {floor!r}")
    errors = verification.get("model_error")  # optional: measured / predicted, by kind
    if errors is not None and not (isinstance(errors, dict) and errors and all(
            kind in MODEL_KINDS and number_in(ratio, 0.0, MAX_MODEL_ERROR) and ratio > 0
            for kind, ratio in errors.items())):
        reader.fail(f"{where}model_error", f"must map kinds of plan ({', '.join(MODEL_KINDS)}) "
                                           f"to numbers above 0, at most {MAX_MODEL_ERROR:g}, "
                                           f"got {errors!r}")
    reader.check(f"{where}stopped_by", verification.get("stopped_by", STOPPED_STEPS),
                 OneOf(tuple(VERIFY_STOPS)))
    below = verification.get("below_min_fidelity")
    if below is not None and not (isinstance(below, dict) and all(
            number_in(below.get(key), 0.0, 1.0) for key in ("fidelity", "min_fidelity"))):
        reader.fail(f"{where}below_min_fidelity", f"must hold a fidelity and a min_fidelity "
                                                  f"from 0 to 1, got {below!r}")
    named = reader.field(verification, "chosen", str, where)
    if named != chosen:
        reader.fail(f"{where}chosen", f"{named!r}, but the finalist marked chosen is {chosen!r}")
    reader.field(verification, "reason", str, where)
