"""Steps factors read within fp32 DDP's loss noise floor (bytecomp.training.factors), on
synthetic curves."""

from __future__ import annotations

import math

import pytest

from bytecomp.training.factors import (
    curve_scatter,
    floored_factor,
    loss_floor,
    reference_factor,
)
from bytecomp.training.finalist_runs import matched_factor, results
from bytecomp.training.probe import MAX_FACTOR

WIGGLE = [0, 1, -1, 1, -1, 0.5, -0.5, 1, -1, 0.7, -0.7]
# fp32 DDP's curve: it falls, then levels off around 2.0, scattered 0.1% there
PLATEAU = [(0, 4.0), (10, 3.0), (20, 2.5), (30, 2.2), (40, 2.05), (50, 2.004), (60, 2.001),
           (70, 2.003), (80, 2.000), (90, 2.002), (100, 2.001)]


def shifted(curve, by):
    return [(s, loss + by) for s, loss in curve]


def test_a_strategy_a_hair_above_fp32_inside_the_floor_gets_a_factor_near_1_not_the_cap():
    """0.14% above fp32's losses all along (its final loss too): at fp32's exact losses it
    never reaches the plateau's levels, the cap; within a 1% floor it gets there about
    when fp32 does, a factor near 1 with a range around it whose top is the cap (it never
    reached fp32's exact losses in this run)."""
    final = PLATEAU[-1][1]
    near = shifted(PLATEAU, 0.0014 * final)
    assert matched_factor(near, PLATEAU, 50) == MAX_FACTOR  # the artefact
    factor = floored_factor(near, PLATEAU, 50, 0.01 * final, MAX_FACTOR)
    assert 0.95 <= factor.value <= 1.1
    assert factor.low < factor.value <= factor.high and factor.uncertain
    assert factor.low <= 1.0
    assert matched_factor(near, PLATEAU, 50, 0.01 * final) == factor.value


def test_one_clearly_worse_still_gets_the_cap_and_a_slower_one_its_steps():
    final = PLATEAU[-1][1]
    worse = shifted(PLATEAU, 0.05 * final)  # 5% above, outside a 1% floor
    assert floored_factor(worse, PLATEAU, 50, 0.01 * final, MAX_FACTOR).value == MAX_FACTOR
    falling = [(s, 1 + 3 * math.exp(-s / 30)) for s in range(0, 101, 10)]
    slower = [(2 * s, loss) for s, loss in falling]  # every loss at twice the steps
    factor = floored_factor(slower, falling, 50, 0.01, MAX_FACTOR)
    assert factor.value == pytest.approx(2.0)
    assert factor.low < 2.0 < factor.high < 2.5


def test_fp32_against_itself_is_1_and_no_floor_is_the_exact_reading():
    noisy = [(s, 1 + 3 * math.exp(-s / 30) + 0.01 * w) for s, w in zip(range(0, 101, 10), WIGGLE)]
    assert reference_factor(noisy, noisy, 50, MAX_FACTOR).value == 1.0
    exact = floored_factor(shifted(noisy, 0.001), noisy, 50, 0.0, MAX_FACTOR)
    assert exact.low == exact.value == exact.high and not exact.uncertain


def test_the_floor_is_the_curve_s_own_scatter_or_a_second_data_order():
    """A smooth curve scatters little around its fit (its misfit: under 0.2% of the
    loss); one scattered +-s about s (the fit takes three degrees of freedom), and the
    floor is sqrt(2) of it: the spread of two such readings' difference. fp32 on a second
    data order widens it to how far the two runs end apart."""
    smooth = [(s, 1 + 3 * math.exp(-s / 30)) for s in range(0, 201, 10)]
    assert curve_scatter(smooth, 100) < 0.002 * smooth[-1][1]
    scattered = [(s, loss + 0.01 * (-1) ** (s // 10)) for s, loss in smooth]
    assert 0.008 < curve_scatter(scattered, 100) < 0.015
    assert loss_floor(scattered, 100) == pytest.approx(math.sqrt(2) * curve_scatter(scattered, 100))
    second = shifted(smooth, 0.05)
    assert loss_floor(scattered, 100, second) == pytest.approx(0.05, abs=0.011)
    assert curve_scatter(smooth[:2], 0) == 0.0  # too few points to tell: no floor


def test_the_finalists_results_record_the_factor_s_range_and_the_floor():
    final = PLATEAU[-1][1]
    noisy_near = [(s, loss + 0.0014 * final + 0.004 * w) for (s, loss), w in zip(PLATEAU, WIGGLE)]
    reference = [(s, loss + 0.004 * w) for (s, loss), w in zip(PLATEAU, WIGGLE)]
    out = results({"fp32 DDP": reference, "fp16 hook": noisy_near},
                  {"fp32 DDP": [10.0] * 100, "fp16 hook": [8.0] * 100}, 100, "validation")
    assert out["loss_floor"] > 0.0014 * final
    fp16 = out["finalists"]["fp16 hook"]
    assert fp16["steps_factor"] < 2
    assert fp16["steps_factor_low"] <= fp16["steps_factor"] <= fp16["steps_factor_high"]
    fp32 = out["finalists"]["fp32 DDP"]
    assert fp32["steps_factor"] == fp32["steps_factor_low"] == fp32["steps_factor_high"] == 1.0
