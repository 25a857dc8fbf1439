"""Single-process tests of every compressor, error feedback and the spec registry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bytecomp.compress import COMPRESSORS, Peers, bits, default_specs, from_spec, payload_nbytes
from bytecomp.compress.base import Compressor
from bytecomp.compress.exdyna import ExDyna
from bytecomp.compress.local import encode, roundtrip
from bytecomp.errors import SpecError
from bytecomp.testing import check_compressor

import reference

ALL_SPECS = default_specs()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(numel, seed=0, dtype=torch.float32):
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- the registry ----------------------------------------------------------------------


def test_every_designed_compressor_is_registered():
    """The set the design names is built in (others may register beside it)."""
    assert set(COMPRESSORS) >= {
        "none", "fp16", "bf16", "int8", "topk", "randomk", "dgc", "threshold", "qsgd",
        "terngrad", "signsgd", "signum", "efsignsgd", "onebit", "powersgd", "acpsgd", "exdyna"}


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_every_registered_compressor_passes_the_conformance_check(name):
    check_compressor(COMPRESSORS[name])


def _broken(**overrides):
    """A registered copy of top-k with one thing wrong, for the check to find."""
    from bytecomp.compress.sparse import TopK

    return type("Broken", (TopK,), {"name": "broken", **overrides})


def _unseeded_topk(self, x, state, peers=None):
    """Top-k's payload, its indices drawn from the global generator (no seed)."""
    from bytecomp.compress.base import meta_of

    kept = max(1, x.numel() // 100)
    indices = torch.randint(0, max(1, x.numel()), (kept,), dtype=torch.int32)
    return [x[indices.long()], indices], meta_of(x)


@pytest.mark.parametrize("check,overrides,finds", [
    ("payload_sizes", {"payload_bytes": lambda self, numel, element_size=4, shapes=None: numel},
     "declared"),  # forgets the values
    ("approximation", {"approximation": lambda self, payload, ctx, x: x * 0.5},
     "approximation differs"),
    ("error_feedback", {"approximation": lambda self, payload, ctx, x: x * 0.5},
     "error feedback loses"),
    ("declared", {"summable": True, "round_collectives": ("allgather",)},
     "last round must be an allreduce"),
    ("summable", {"summable": True}, "not summable"),
    ("declared", {"payload_estimate": "guess"}, "payload_estimate"),
    ("declared", {"cast_dtype": "float17"}, "not a torch dtype"),
    ("agreement", {"compress": _unseeded_topk}, "different payloads"),
    ("compresses", {"payload_bytes": lambda self, numel, element_size=4, shapes=None:
                    numel * element_size}, "compresses, yet"),
])
def test_the_conformance_check_finds_what_is_wrong(check, overrides, finds):
    """Each check fails a compressor that breaks what it checks (and one that is not
    registered), naming the fault."""
    from bytecomp.compress.registry import register

    broken = _broken(**overrides)
    with pytest.raises(AssertionError, match="not registered"):
        check_compressor(broken, only=["declared"])
    register(broken)
    try:
        with pytest.raises(AssertionError, match=finds):
            check_compressor(broken, only=[check])
    finally:
        COMPRESSORS.pop("broken", None)


def test_a_ladder_on_a_parameter_it_lacks_is_refused_at_registration():
    from bytecomp.compress.registry import register

    with pytest.raises(ValueError, match="ladder moves 'rank'"):
        register(_broken(ladder=("rank", (4, 2))))
    assert "broken" not in COMPRESSORS


def test_spec_parsing_sets_parameters_and_error_feedback():
    topk = from_spec("topk:ratio=0.001")
    assert topk.values["ratio"] == 0.001 and topk.error_feedback
    assert from_spec("topk:ratio=0.001,ef=false").error_feedback is False
    assert from_spec(" powersgd : rank = 2 ").values["rank"] == 2
    assert from_spec("topk").spec == "topk:ratio=0.01"
    assert from_spec("powersgd:rank=2,warm_start=false").spec == \
        "powersgd:rank=2,warm_start=false"
    assert from_spec("fp16:ef=true").spec == "fp16:ef=true"


@pytest.mark.parametrize("spec,message", [
    ("nope", "unknown compressor 'nope'; choose from: none, fp16"),
    ("topk:ratio=2", "ratio=2 is out of range (expected 0 < ratio <= 1)"),
    ("powersgd:rank=0", "rank=0 is out of range"),
    ("topk:k=5", "unknown parameter 'k'; valid parameters: ratio, ef"),
    ("topk:ratio=abc", "is not a valid float"),
    ("topk:ratio", "needs a value"),
    ("efsignsgd:ef=false", "always uses error feedback"),
    ("powersgd:orth=svd", "expected one of auto|gs|qr"),
    ("", "empty compressor spec"),
])
def test_bad_specs_raise_value_error_naming_valid_choices(spec, message):
    with pytest.raises(ValueError) as caught:
        from_spec(spec)
    assert isinstance(caught.value, SpecError)
    assert message in str(caught.value)


# -- payload sizes -------------------------------------------------------------------


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_payload_size_matches_declared_function(spec, dtype):
    compressor = from_spec(spec)
    for numel in (0, 1, 9, 1000, 4096, 12345):
        x = randn(numel, numel, dtype)
        state = {}
        encoded = encode(compressor, x, state)
        declared = compressor.payload_bytes(numel, x.element_size())
        if compressor.name == "acpsgd":  # P and Q on alternate steps: declared is the mean
            assert encoded.bytes_sent + encode(compressor, x, state).bytes_sent == 2 * declared
        elif compressor.fixed_size:
            assert encoded.bytes_sent == declared, (spec, numel)
        elif compressor.name == "exdyna":
            # indices + values of the selected elements + the threshold proposal
            selected = encoded.payload[0].numel()
            assert encoded.bytes_sent == selected * (4 + x.element_size()) + 4
        else:
            assert encoded.bytes_sent <= declared, (spec, numel)
            kept = encoded.payload[1].numel()
            assert encoded.bytes_sent == kept * (x.element_size() + 4)


def test_sign_payloads_are_one_bit_per_element_plus_scales():
    for numel in (1, 8, 9, 1001):
        x = randn(numel)
        scales = {"signsgd": 0, "signum": 0, "efsignsgd": 4, "onebit": 8}
        for name, extra in scales.items():
            payload, _ = from_spec(name).compress(x, {})
            assert payload[0].dtype == torch.uint8
            assert payload_nbytes(payload) == math.ceil(numel / 8) + extra


def test_powersgd_batches_the_matrices_of_a_merged_group():
    generator = torch.Generator().manual_seed(1)
    shapes = [(20, 2, 3), (7,), (12, 10)]
    low_rank = [torch.randn(20, 2, generator=generator) @ torch.randn(2, 6, generator=generator),
                torch.randn(7, generator=generator),
                torch.randn(12, 2, generator=generator) @ torch.randn(2, 10, generator=generator)]
    flat = torch.cat([m.reshape(-1) for m in low_rank])
    compressor = from_spec("powersgd:rank=2,ef=false")
    # rows x rank + cols x rank per matrix; the 1-D tensor is a 3x3 near-square matrix
    assert compressor.round_payload_bytes(flat.numel(), shapes=shapes) == \
        [4 * 2 * (20 + 3 + 12), 4 * 2 * (6 + 3 + 10)]
    out, sent = roundtrip(compressor, flat, {"shapes": shapes})
    assert sent == compressor.payload_bytes(flat.numel(), shapes=shapes)
    assert torch.allclose(out[:120], flat[:120], atol=1e-4)      # rank-2 matrices: exact
    assert torch.allclose(out[127:], flat[127:], atol=1e-4)


def test_powersgd_payload_uses_the_shape_hint():
    compressor = from_spec("powersgd:rank=4")
    assert compressor.payload_bytes(64 * 300, shapes=[(64, 3, 10, 10)]) == (64 + 300) * 4 * 4
    x = randn(64 * 300)
    assert encode(compressor, x, {"shapes": [(64, 3, 10, 10)]}).bytes_sent == (64 + 300) * 16


# -- behaviour of each method --------------------------------------------------------


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    x = randn(10_000, 3)
    compressor = from_spec("topk:ratio=0.013,ef=false")
    (values, indices), ctx = compressor.compress(x, {})
    k = math.ceil(0.013 * 10_000)
    assert indices.numel() == k
    assert set(indices.tolist()) == set(x.abs().argsort(descending=True)[:k].tolist())
    assert torch.equal(values, x[indices.long()])
    out = compressor.decompress([values, indices], ctx)
    assert torch.count_nonzero(out) == k and torch.equal(out[indices.long()], values)


def test_randomk_indices_agree_across_ranks_and_change_each_step():
    compressor = from_spec("randomk:ratio=0.01,ef=false")
    state_rank0, state_rank1 = {}, {}
    seen = []
    for step in range(3):
        _, (_, idx0) = compressor.compress(randn(5000, step), state_rank0, Peers(0, 2))
        _, (_, idx1) = compressor.compress(randn(5000, 99 + step), state_rank1, Peers(1, 2))
        assert torch.equal(idx0, idx1)
        seen.append(idx0)
    assert not torch.equal(seen[0], seen[1])
    other_seed = from_spec("randomk:ratio=0.01,seed=7,ef=false")
    _, (_, idx) = other_seed.compress(randn(5000), {}, Peers(0, 2))
    assert not torch.equal(idx, seen[0])


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "qsgd", "terngrad"])
def test_stochastic_quantizers_are_unbiased(spec):
    compressor = from_spec(spec)
    x = randn(64, 5)
    draws = torch.stack([roundtrip(compressor, x, state)[0]
                         for state in [{}] for _ in range(4000)])
    mean, spread = draws.mean(0), draws.std(0)
    # Five standard errors of the mean, element by element (plus float slack).
    bound = 5 * spread / math.sqrt(draws.shape[0]) + 1e-6
    assert torch.all((mean - x).abs() <= bound), (mean - x).abs().max()
    assert spread.max() > 0  # the draws really are random


def test_powersgd_reconstructs_a_rank_r_matrix_exactly():
    generator = torch.Generator().manual_seed(0)
    for rank, orth in [(1, "auto"), (3, "gs"), (4, "qr"), (6, "auto")]:
        matrix = torch.randn(40, rank, generator=generator) @ torch.randn(rank, 25,
                                                                          generator=generator)
        compressor = from_spec(f"powersgd:rank={rank},orth={orth},ef=false")
        out, _ = roundtrip(compressor, matrix.reshape(-1), {"shapes": [(40, 25)]})
        assert torch.allclose(out, matrix.reshape(-1), atol=1e-4 * matrix.abs().max())


def test_thin_products_equal_the_products_as_written():
    """thin_product multiplies thin factor first below THIN_FIRST_BELOW on the CPU (the
    same product, rounded differently), as written above; contiguous either way."""
    from bytecomp.compress.lowrank import THIN_FIRST_BELOW, thin_product

    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(70, 30, generator=generator)
    for rank in (1, 4, THIN_FIRST_BELOW - 1, THIN_FIRST_BELOW):
        q, p = torch.randn(30, rank, generator=generator), torch.randn(70, rank,
                                                                      generator=generator)
        for got, want in [(thin_product(matrix, q), matrix @ q),
                          (thin_product(matrix, p, transpose=True), matrix.T @ p)]:
            assert got.shape == want.shape and got.is_contiguous()
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["powersgd:rank=3", "acpsgd:rank=3"])
def test_low_rank_decompress_into_writes_what_decompress_returns(spec):
    """Into a float32 buffer it writes in place (a padded matrix too); into another dtype
    it converts, as decompress does."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40 * 25 + 37, generator=generator)  # a matrix, then a padded vector
    state = {"shapes": [(40, 25), (37,)]}
    compressor = from_spec(spec)
    payload, ctx = compressor.compress(x, state)
    for _ in range(1, len(compressor.collectives_of_rounds())):
        payload, ctx = compressor.advance(payload, ctx, state)
    want = compressor.decompress(payload, ctx)
    out = torch.full_like(x, float("nan"))
    assert compressor.decompress_into(payload, ctx, out) is out
    assert torch.equal(out, want)
    half = torch.zeros(x.shape, dtype=torch.float16)
    assert torch.equal(compressor.decompress_into(payload, ctx, half), want.half())


def test_acpsgd_alternates_factors_and_recovers_a_low_rank_matrix():
    matrix = torch.randn(30, 2) @ torch.randn(2, 20)
    compressor = from_spec("acpsgd:rank=2,ef=false")
    state = {"shapes": [(30, 20)]}
    first, sent_p = roundtrip(compressor, matrix.reshape(-1), state)
    second, sent_q = roundtrip(compressor, matrix.reshape(-1), state)
    assert (sent_p, sent_q) == (30 * 2 * 4, 20 * 2 * 4)  # one factor per step
    assert not torch.allclose(first, matrix.reshape(-1), atol=1e-3)
    assert torch.allclose(second, matrix.reshape(-1), atol=1e-4 * matrix.abs().max())


def test_int8_error_is_within_half_a_step():
    x = randn(5000, 2)
    out, _ = roundtrip(from_spec("int8"), x, {})
    step = (x.max() - x.min()) / 255
    assert (out - x).abs().max() <= step / 2 + 1e-6


def test_onebit_decodes_to_the_two_sign_means():
    x = torch.tensor([1.0, 3.0, -2.0, -4.0, 0.0])
    out, _ = roundtrip(from_spec("onebit:ef=false"), x, {})
    assert torch.allclose(out, torch.tensor([4 / 3, 4 / 3, -3.0, -3.0, 4 / 3]))


def test_signum_follows_the_momentum_sign():
    compressor = from_spec("signum:momentum=0.9")
    state = {}
    roundtrip(compressor, torch.tensor([1.0, -1.0]), state)
    out, _ = roundtrip(compressor, torch.tensor([-0.5, 0.5]), state)  # momentum keeps its sign
    assert torch.equal(out, torch.tensor([1.0, -1.0]))


# -- error feedback --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_error_feedback_telescopes_for_every_compressor(name):
    compressor = from_spec(f"{name}:ef=true")
    state, sent, inputs = {}, torch.zeros(3000, dtype=torch.float64), torch.zeros(3000,
                                                                                  dtype=torch.float64)
    for step in range(6):
        x = randn(3000, step)
        transmitted, _ = roundtrip(compressor, x, state)
        sent += transmitted.double()
        inputs += x.double()
    total = sent + state["residual"].double()
    assert torch.allclose(total, inputs, atol=1e-4 * inputs.abs().max()), \
        (total - inputs).abs().max()


# -- ExDyna ------------------------------------------------------------------------------


def _exdyna_steps(compressor, world, steps, numel=20_000, seed=0):
    """Run ``steps`` steps of ``world`` virtual ranks; yield each step's selections."""
    states = [{} for _ in range(world)]
    for step in range(steps):
        xs = [randn(numel, seed + 1000 * step + rank) for rank in range(world)]
        sent = [compressor.compress(xs[r], states[r], Peers(r, world)) for r in range(world)]
        payloads = [payload for payload, _ in sent]
        for r in range(world):
            compressor.advance(payloads, sent[r][1], states[r], Peers(r, world))
        yield [payload[0] for payload in payloads], states


def test_exdyna_partitions_are_disjoint_across_ranks():
    compressor = from_spec("exdyna:density=0.02,ef=false")
    for selections, states in _exdyna_steps(compressor, 4, 30):
        union = torch.cat(selections)
        assert union.unique().numel() == union.numel()
        bounds = states[0]["bounds"]
        assert all(s["bounds"] == bounds for s in states)  # every rank agrees
        assert bounds[0] == 0 and all(a < b for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("world", [1, 4])
def test_exdyna_density_converges_to_target_on_a_stationary_stream(world):
    density, numel = 0.01, 20_000
    compressor = ExDyna(density=density)
    densities = [sum(s.numel() for s in selections) / numel
                 for selections, _ in _exdyna_steps(compressor, world, 400, numel)]
    settled = sum(densities[-100:]) / 100
    assert abs(settled - density) <= 0.1 * density, settled


def test_exdyna_moves_a_boundary_toward_the_crowded_partition():
    from bytecomp.compress.exdyna import rebalance

    assert rebalance([0, 10, 20, 30], [200, 100, 100]) == [0, 9, 20, 30]
    assert rebalance([0, 10, 20, 30], [100, 100, 100]) == [0, 10, 20, 30]
    assert rebalance([0, 1, 20, 30], [300, 100, 100]) == [0, 1, 20, 30]  # keeps one block


def test_exdyna_reference_matches_two_rank_protocol():
    compressor = from_spec("exdyna:density=0.05,ef=false")
    xs = [randn(5000, 1), randn(5000, 2)]
    out = reference.flat(compressor, xs, [{}, {}])
    assert torch.count_nonzero(out) > 0 and out.shape == xs[0].shape


# -- properties over shapes and dtypes -----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(ALL_SPECS), numel=st.integers(0, 3000),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_roundtrip_keeps_shape_dtype_and_finiteness(spec, numel, dtype, seed):
    compressor = from_spec(spec)
    x = randn(numel, seed, dtype)
    state, total = {}, 0
    for _ in range(2):
        out, sent = roundtrip(compressor, x, state)
        total += sent
        assert out.shape == x.shape and out.dtype == x.dtype
        assert torch.isfinite(out.float()).all()
    if compressor.fixed_size:  # per step; ACP-SGD's alternating factors: on average
        assert total == 2 * compressor.payload_bytes(numel, x.element_size())


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(0, 2000), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 999))
def test_lossless_and_cast_compressors_are_exact_to_their_dtype(numel, dtype, seed):
    x = randn(numel, seed, dtype)
    assert torch.equal(roundtrip(from_spec("none"), x, {})[0], x)
    assert torch.equal(roundtrip(from_spec("fp16"), x, {})[0], x.to(torch.float16).to(dtype))
    assert torch.equal(roundtrip(from_spec("bf16"), x, {})[0], x.to(torch.bfloat16).to(dtype))


@settings(max_examples=60, deadline=None)
@given(numel=st.integers(0, 500), width=st.sampled_from([1, 2, 4]), seed=st.integers(0, 999))
def test_bit_packing_roundtrips(numel, width, seed):
    codes = torch.randint(0, 2**width, (numel,), generator=torch.Generator().manual_seed(seed))
    packed = bits.pack(codes, width)
    assert packed.numel() == math.ceil(numel * width / 8)
    assert torch.equal(bits.unpack(packed, numel, width), codes.to(torch.uint8))


@settings(max_examples=60, deadline=None)
@given(numel=st.integers(0, 500), seed=st.integers(0, 999))
def test_flags_unpack_as_bools(numel, seed):
    flags = torch.rand(numel, generator=torch.Generator().manual_seed(seed)) < 0.5
    assert torch.equal(bits.unpack_bools(bits.pack(flags, 1), numel), flags)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit (so -0 differs from 0, and a nan matches the same nan)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _with_edges(x: torch.Tensor) -> torch.Tensor:
    """``x`` with exact zeros of both signs in it (where signs and scales are decided)."""
    x = x.clone()
    x[: x.numel() // 4] = 0.0
    x[x.numel() // 4: x.numel() // 3] = -0.0
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if from_spec(s).rounds == 1])
def test_a_payloads_own_approximation_is_its_decompression_to_the_bit(spec, dtype):
    """Error feedback keeps x less ``approximation``: a compressor's shortcut (EF-signSGD
    rebuilds it from x's signs) must give decompress's very bits, zeros and all."""
    compressor = from_spec(spec)
    inner = getattr(compressor, "inner", compressor)
    for x in (_with_edges(randn(1001, 3, dtype)), torch.zeros(64, dtype=dtype)):
        payload, ctx = inner.compress(x, {})
        assert _same_bits(inner.approximation(payload, ctx, x), inner.decompress(payload, ctx))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if from_spec(s).rounds == 1 and
                                  from_spec(s).gatherable])
def test_every_aggregate_is_the_mean_of_the_decompressions(spec, dtype):
    """A compressor's own aggregate_into gives the default's values: the payloads
    decompressed and summed in rank order in float32, then divided."""
    compressor = from_spec(spec)
    inner = getattr(compressor, "inner", compressor)
    payloads, ctx = [], None
    for rank in range(3):
        payload, ctx = inner.compress(_with_edges(randn(777, 10 + rank, dtype)),
                                      {"salt": 5}, Peers(rank, 3))
        payloads.append(payload)
    ours = inner.aggregate_into(payloads, ctx, torch.empty(777, dtype=dtype))
    default = Compressor.aggregate_into(inner, payloads, ctx, torch.empty(777, dtype=dtype))
    assert torch.equal(ours, default)


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(1, 3000), ratio=st.floats(0.001, 1.0), seed=st.integers(0, 999),
       dtype=st.sampled_from(DTYPES))
def test_sparsifiers_keep_original_values_at_kept_positions(numel, ratio, seed, dtype):
    x = randn(numel, seed, dtype)
    for name in ("topk", "dgc"):
        compressor = from_spec(f"{name}:ratio={ratio},ef=false")
        out, _ = roundtrip(compressor, x, {})
        kept = out != 0
        assert torch.equal(out[kept], x[kept])
        assert int(kept.sum()) <= math.ceil(ratio * numel)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dgc_sends_only_nonzeros_of_a_mostly_zero_gradient(dtype):
    """An embedding's gradient is zero outside the rows of the tokens seen: with fewer
    nonzeros than k the sampled threshold is zero, which once selected every element and
    ran an exact top-k over all of them (4x slower than on a dense gradient)."""
    x = torch.zeros(64, 128, dtype=dtype)
    x[[3, 17, 40]] = randn(3 * 128, seed=5, dtype=dtype).view(3, 128)
    x[3, 0] = 1e-6  # subnormal in fp16: still a nonzero to send
    values, indices = from_spec("dgc:ratio=0.05,ef=false").compress(x.reshape(-1), {})[0]
    assert values.numel() == 3 * 128 < math.ceil(0.05 * x.numel())
    assert torch.equal(torch.sort(indices.long()).values, torch.nonzero(x.reshape(-1)).reshape(-1))
