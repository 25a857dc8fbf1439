"""The real architectures' tensor lists (bytecomp/testing/architectures.py) and, over the
search benchmark's real set, the printed lower bound against every plan found."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from bytecomp.costs.clusters import load_cluster
from bytecomp.search import Planner
from bytecomp.search.planner import EXACT_AUTO_TENSORS
from bytecomp.testing.architectures import (
    REAL,
    bert_base,
    gpt2_small,
    lstm_lm,
    parameters,
    real_profile,
    resnet101,
    ugatit,
    vgg16,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from search import real_instances  # noqa: E402  (benchmarks/ is no package)


@pytest.mark.parametrize(("generator", "tensors", "millions"), [
    (vgg16, 32, 138.36), (resnet101, 314, 44.55), (bert_base, 206, 110.11),
    (gpt2_small, 148, 124.44), (lstm_lm, 11, 66.03), (ugatit, 208, 157.62)])
def test_the_architectures_have_their_published_sizes(generator, tensors, millions):
    """Tensor counts and parameters as the architectures have them (torchvision's VGG-16
    138,357,544 and ResNet-101 44,549,160; BERT-base 110M with its pretraining heads;
    GPT-2 small 124,439,808; Zaremba's large LSTM 66M), every name once, and a
    backward time on every layer's first-ready tensor, none negative."""
    net = generator()
    assert len(net.tensors) == tensors
    assert parameters(net) / 1e6 == pytest.approx(millions, abs=0.01)
    assert len({name for name, _ in net.tensors}) == tensors
    assert all(ms >= 0 for ms in net.ms) and sum(net.ms) > 0


def test_the_profile_readies_tensors_last_layer_first_after_their_layers_time():
    """The profile's ready times: the output layer's tensors first, each after the time
    charged to it and to those readied before it (plus 0.01 ms a tensor), the
    backward pass's end at the last one."""
    net = bert_base(layers=2)
    profile = real_profile(net)
    rows = profile.tensors.sort_values("ready_ms", kind="stable")
    assert list(rows["name"]) == [name for name, _ in reversed(net.tensors)]
    expected = [sum(net.ms[i:]) + 0.01 * (len(net.ms) - i) for i in range(len(net.ms))][::-1]
    assert list(rows["ready_ms"]) == pytest.approx(expected, abs=1e-6)  # (rounded)
    assert profile.meta["times"]["backward"]["median_ms"] == pytest.approx(expected[-1])
    # the masked-LM head's GEMM lands before its bias, the first tensor readied
    assert rows.iloc[0]["name"] == "cls.seq_relationship.bias"
    head = rows.set_index("name")["ready_ms"]
    assert head["cls.predictions.bias"] - head["cls.seq_relationship.weight"] > 1.0


def _plans(profile, cluster, specs, evaluations: int, exact_s: float):
    """The default search and every plan the other searches found: a local search of
    ``evaluations``, and where the problem is small the exact search (``exact_s``)."""
    default = Planner(profile, cluster, specs).search()
    found = [default, Planner(profile, cluster, specs).search(
        algorithm="local", min_gain=0.0, evaluations=evaluations)]
    if len(default.problem.tensors) <= EXACT_AUTO_TENSORS:
        found.append(Planner(profile, cluster, specs).search(algorithm="exact",
                                                              budget_s=exact_s))
    return default, found


def _check(default, found) -> None:
    """The printed bound is at or below the best plan of any search, "optimal" is printed
    alone where a search proved it, and no search calls a plan optimal that another beat."""
    best = min(result.value for result in found)
    assert default.lower_bound_ms <= best + 1e-9, (default.lower_bound_ms, best)
    for result in found:
        assert result.lower_bound_ms <= best + 1e-9
        if result.exact:
            assert result.gap_text() == "optimal"
            assert result.value <= best + 1e-9
        else:
            assert result.gap_text().startswith(("gap <= ", "gap unknown"))
    assert all(math.isfinite(result.value) for result in found)


@pytest.mark.parametrize(("cluster", "specs"), [("v100-nvlink-100g", ["topk:ratio=0.01"]),
                                               ("v100-pcie-25g", None)],
                         ids=["nvlink-100g top-k", "pcie-25g all"])
@pytest.mark.parametrize("net", [lstm_lm(), bert_base(layers=1), ugatit(blocks=1),
                                 resnet101(batch=4, image=64)],
                         ids=["LSTM LM", "BERT 1 layer", "UGATIT 1 block", "ResNet-101 small"])
def test_the_bound_is_below_every_plan_on_real_shapes(net, specs, cluster):
    """Fast tier: the real set's LSTM, and small variants of its other shapes (a part
    of the instances; the exact search cut short at 0.25 s, proven or not)."""
    default, found = _plans(real_profile(net), load_cluster(cluster), specs, 1500, 0.25)
    _check(default, found)


@pytest.mark.slow
def test_the_bound_is_below_every_plan_over_the_real_set():
    """The whole real set (benchmarks/search.py --set real), each instance with a local
    search of 2,000 evaluations and, up to 30 tensors, the exact search for 0.5 s (cut
    short or not, what it found is a plan the bound must be below)."""
    names = [name for name, _ in REAL]
    seen = []
    for name, _, profile, cluster, _, specs, _ in real_instances():
        default, found = _plans(profile, cluster, specs, 2000, 0.5)
        _check(default, found)
        seen.append(name)
    assert sorted(set(seen)) == sorted(names) and len(seen) == 8 * len(names)
