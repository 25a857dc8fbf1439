"""The fused Triton kernels (bytecomp.compress.triton_kernels) against the PyTorch path.

Without a GPU the kernels run on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, :func:`bytecomp.compress.kernels.interpreted_on_cpu`), each
compressor's steps compared with its PyTorch ops on the same inputs: bit for bit, but
EF-signSGD's and 1-bit's float32 scales, summed in another order (within a relative 1e-5).
Small blocks make a few hundred elements span several programs and end in a partial
one. Where a GPU is, the interpreter is not used (it would reload the kernels): the same
comparisons run compiled, on CUDA (marked ``cuda``: ``make gpu-check``). The dispatch
(which path runs, the trait, the table) is checked without triton.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from bytecomp.compress import COMPRESSORS, bits, from_spec, kernels
from bytecomp.compress.local import decode, encode
from bytecomp.errors import BytecompError

FUSED = ("int8", "int8:ef=true", "signsgd", "signsgd:ef=true", "signum", "signum:ef=true",
         "efsignsgd", "onebit", "onebit:ef=false", "randomk", "randomk:ef=false")
SCALED = ("efsignsgd", "onebit")  # float32 scales summed in another order than torch's
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_TRITON = "triton is not installed (pip install -e '.[kernels]'; make install-dev has it)"
CUDA = torch.device("cuda")


def randn(numel: int, seed: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x.to(device)


def steps(spec: str, inputs: list[torch.Tensor], path: str, monkeypatch,
          meter: bool = False) -> list[dict]:
    """Encode and decode ``inputs`` one step each on ``path`` (the kernels must run on
    it, or must not): each step's payload, decoded tensor and state."""
    monkeypatch.setenv(kernels.ENV, "off" if path == kernels.TORCH else "auto")
    compressor, state = from_spec(spec), {"salt": 3, "meter": meter}
    launched = sum(kernels.LAUNCHES.values())
    fused_steps = []
    if compressor.error_feedback:  # count the steps whose residual update was fused
        inner = compressor.inner
        unfused = inner.compress_fed_back

        def counted(*args, **kwargs):
            done = unfused(*args, **kwargs)
            fused_steps.append(done is not None)
            return done

        monkeypatch.setattr(inner, "compress_fed_back", counted)
    out = []
    for x in inputs:
        encoded = encode(compressor, x, state)
        out.append({"payload": [t.clone() for t in encoded.payload],
                    "decoded": decode(compressor, encoded), **_tensors(state)})
    ran = sum(kernels.LAUNCHES.values()) > launched
    assert ran == (path == kernels.TRITON), f"{spec}: the {path} path did not run"
    assert all(fused_steps) if ran else not any(fused_steps), spec
    monkeypatch.delenv(kernels.ENV)
    return out


def _tensors(state: dict, prefix: str = "") -> dict:
    """Every tensor of a compressor's state (the inner compressor's too), copied."""
    found = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            found[prefix + key] = value.clone()
        elif isinstance(value, dict):
            found.update(_tensors(value, f"{prefix}{key}."))
    return found


def _scale_of(step: dict) -> float:
    return float(step["payload"][1].abs().max())


def assert_same_steps(spec: str, fused: list[dict], plain: list[dict]) -> None:
    """Bit for bit; EF-signSGD's and 1-bit's scales within a relative 1e-5, and what
    they scale within that (plus one rounding to a 16-bit dtype)."""
    for step, (a, b) in enumerate(zip(fused, plain)):
        assert a.keys() == b.keys(), (spec, step)
        if spec.split(":")[0] not in SCALED:
            for key in a:
                tensors = zip(a[key], b[key]) if key == "payload" else [(a[key], b[key])]
                for one, other in tensors:
                    assert one.dtype == other.dtype and one.shape == other.shape, (spec, key)
                    assert torch.equal(one, other), (spec, step, key, one, other)
            continue
        assert torch.equal(a["payload"][0], b["payload"][0]), (spec, step, "signs")
        scale = max(_scale_of(a), _scale_of(b), 1e-30)
        for key in a:
            one, other = (a[key][1], b[key][1]) if key == "payload" else (a[key], b[key])
            assert one.dtype == other.dtype and one.shape == other.shape, (spec, key)
            rounding = 0.0 if one.dtype == torch.float32 else torch.finfo(one.dtype).eps
            assert torch.allclose(one.float(), other.float(), rtol=1e-5 + rounding,
                                  atol=(1e-5 + rounding) * scale), (spec, step, key)


# -- under Triton's interpreter, on the CPU -----------------------------------------


@pytest.fixture(scope="module")
def interpreter():
    """The kernels module, loaded interpreted once for the module, with small blocks."""
    if not kernels.triton_installed():
        pytest.skip(NO_TRITON)
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the kernels are checked compiled on it (the cuda tests)")
    with kernels.interpreted_on_cpu() as module, pytest.MonkeyPatch.context() as patch:
        patch.setitem(kernels._testing, "cpu", False)  # on in the tests that ask for it
        # several programs for a few hundred elements, the last one partial
        for name, value in (("BLOCK", 256), ("SIGN_BYTES", 16), ("INDEX_BLOCK", 64),
                            ("FINALIZE_BLOCK", 2)):
            patch.setattr(module, name, value)
        yield module


@pytest.fixture
def interpreted(interpreter, monkeypatch):
    """The kernels run on CPU tensors, interpreted, for the test."""
    monkeypatch.setitem(kernels._testing, "cpu", True)
    return interpreter


@pytest.mark.parametrize("numel", [1, 7, 300, 1029])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", FUSED)
def test_the_kernels_give_what_the_pytorch_path_gives(interpreted, monkeypatch, spec, dtype,
                                                      numel):
    """Two steps (the second with the residual and momentum the first left)."""
    inputs = [randn(numel, seed, dtype) for seed in (numel, numel + 1)]
    assert_same_steps(spec, steps(spec, inputs, kernels.TRITON, monkeypatch),
                      steps(spec, inputs, kernels.TORCH, monkeypatch))


@pytest.mark.parametrize("spec", ["int8:ef=true", "efsignsgd", "signum:ef=true", "randomk"])
def test_metered_error_feedback_keeps_the_same_norms(interpreted, monkeypatch, spec):
    """An adaptive plan's metering: the fused step keeps the compensated gradient too."""
    inputs = [randn(300, seed, torch.float16) for seed in (1, 2)]
    fused = steps(spec, inputs, kernels.TRITON, monkeypatch, meter=True)
    assert {"sq_norm", "sq_error"} <= fused[-1].keys()
    assert_same_steps(spec, fused, steps(spec, inputs, kernels.TORCH, monkeypatch, meter=True))


def test_the_default_block_sizes_too(interpreted, monkeypatch):
    """The block sizes the GPU runs, one element past the first block."""
    monkeypatch.setattr(interpreted, "BLOCK", 4096)
    monkeypatch.setattr(interpreted, "SIGN_BYTES", 512)
    monkeypatch.setattr(interpreted, "INDEX_BLOCK", 1024)
    monkeypatch.setattr(interpreted, "FINALIZE_BLOCK", 1024)
    for spec in ("int8:ef=true", "signum:ef=true", "onebit"):
        inputs = [randn(4097, seed) for seed in (5, 6)]
        assert_same_steps(spec, steps(spec, inputs, kernels.TRITON, monkeypatch),
                          steps(spec, inputs, kernels.TORCH, monkeypatch))


def test_signs_pack_as_the_bits_module_packs_them(interpreted):
    """Zero and -0 count as +, NaN as -; the first element in a byte's highest bit; the
    last byte padded with zeros; and decoding gives the two values back."""
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30,
                      3.0, -2.0, 0.5, -0.5])
    for numel in (1, 8, 9, 13):
        for dtype in DTYPES:
            part = x[:numel].to(dtype)
            packed = interpreted.sign_encode(part)[0]
            assert torch.equal(packed, bits.pack_signs(part)), (numel, dtype)
            values = torch.tensor([2.5, -0.75])
            decoded = interpreted.sign_decode(packed, values, numel, dtype)
            expected = torch.where(bits.unpack_bools(packed, numel), values[0], values[1])
            assert torch.equal(decoded, expected.to(dtype))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # numpy's
def test_downcasts_round_to_nearest_even_as_torch_casts(interpreted):
    """float32 to bfloat16 and float16 (the scatter kernel's cast): random bit patterns,
    ties, subnormals, overflow and infinities round as torch rounds them (the bfloat16
    rounding is written out: the interpreter truncates)."""
    generator = torch.Generator().manual_seed(0)
    patterns = torch.randint(-2**31, 2**31 - 1, (3000,), generator=generator)
    ties = torch.randint(0, 2**15, (500,), generator=generator) << 16 | 0x8000
    values = torch.cat([patterns.to(torch.int32).view(torch.float32),
                        ties.to(torch.int32).view(torch.float32),
                        torch.tensor([0.0, -0.0, math.inf, -math.inf, 3.3895314e38, 1e-40])])
    values = values[~values.isnan()].contiguous()
    for dtype in (torch.bfloat16, torch.float16):
        out = torch.empty(values.numel(), dtype=dtype)
        interpreted.scatter(values, torch.arange(values.numel()), out)
        assert torch.equal(out, values.to(dtype)), dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_on_flat_and_wide_tensors(interpreted, monkeypatch, dtype):
    """A constant tensor (no range: a step of 1), zeros, and a range near float16's."""
    for x in (torch.full((300,), 3.0), torch.zeros(300), torch.linspace(-6e4, 6e4, 300)):
        inputs = [x.to(dtype)] * 2
        for spec in ("int8", "int8:ef=true"):
            assert_same_steps(spec, steps(spec, inputs, kernels.TRITON, monkeypatch),
                              steps(spec, inputs, kernels.TORCH, monkeypatch))


@pytest.mark.parametrize("spec", ["int8", "onebit", "signsgd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_mean_of_gathered_payloads(interpreted, monkeypatch, spec, dtype):
    """``aggregate_into`` of three ranks' payloads (EF-signSGD's own sum, the default
    elsewhere) on both paths."""
    spec = "efsignsgd" if spec == "signsgd" else spec
    results = []
    for path in (kernels.TRITON, kernels.TORCH):
        monkeypatch.setenv(kernels.ENV, "off" if path == kernels.TORCH else "auto")
        compressor = from_spec(spec)
        encoded = [encode(compressor, randn(300, seed, dtype), {}) for seed in (1, 2, 3)]
        out = torch.empty(300, dtype=dtype)
        results.append(compressor.aggregate_into([e.payload for e in encoded], encoded[0].ctx,
                                                 out))
    scale = float(results[1].float().abs().max())
    rounding = 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps
    tolerance = 0.0 if spec == "int8" else 1e-5 + rounding
    assert torch.allclose(results[0].float(), results[1].float(), rtol=tolerance,
                          atol=tolerance * scale), spec


def test_randomk_draws_the_same_indices_on_both_paths(interpreted, monkeypatch):
    """The indices come from PyTorch's generator on either path (every rank draws the
    same), duplicates included: the residual is zero wherever a value was sent."""
    inputs = [randn(300, seed) for seed in (1, 2)]
    for spec in ("randomk:ratio=0.5", "randomk:ratio=0.5,ef=false"):
        contexts = []
        for path in (kernels.TRITON, kernels.TORCH):
            monkeypatch.setenv(kernels.ENV, "off" if path == kernels.TORCH else "auto")
            compressor, state = from_spec(spec), {"salt": 9}
            inner = (lambda ctx: ctx[0]) if compressor.error_feedback else (lambda ctx: ctx)
            contexts.append([inner(encode(compressor, x, state).ctx)[1] for x in inputs])
        for fused, plain in zip(*contexts):
            assert torch.equal(fused, plain)
            assert fused.unique().numel() < fused.numel()  # duplicates
    monkeypatch.delenv(kernels.ENV)
    assert_same_steps("randomk:ratio=0.5",
                      steps("randomk:ratio=0.5", inputs, kernels.TRITON, monkeypatch),
                      steps("randomk:ratio=0.5", inputs, kernels.TORCH, monkeypatch))


def test_what_the_kernels_do_not_take_runs_the_pytorch_path(interpreted):
    """float64, a non-contiguous tensor, an empty one: the PyTorch path. A residual of
    another dtype is not fused (``x + residual`` promotes, as the PyTorch path has it)."""
    before = sum(kernels.LAUNCHES.values())
    encode(from_spec("int8:ef=true"), randn(64, 1, torch.float64), {})
    encode(from_spec("signsgd"), randn(128, 1)[::2], {})
    encode(from_spec("onebit"), torch.zeros(0), {})
    assert sum(kernels.LAUNCHES.values()) == before
    for name in ("int8", "signum", "efsignsgd", "randomk"):
        inner, state = COMPRESSORS[name](), {}
        assert inner.compress_fed_back(randn(64, 1, torch.float16), randn(64, 2), state) is None
        assert state == {}  # untouched: error feedback takes its own steps


def test_a_failing_kernel_warns_and_the_pytorch_path_runs(interpreted, monkeypatch):
    """Outside the tests' strict mode, a compile or launch error turns the kernels off for
    the process with one warning, and the step still gives the PyTorch path's result."""

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(interpreted, "_int8_encode_kernel", Broken())
    monkeypatch.setattr(kernels, "_disabled", [])
    monkeypatch.setitem(kernels._testing, "strict", False)
    x = randn(300, 1)
    with pytest.warns(RuntimeWarning, match="no kernel image"):
        payload, _ = from_spec("int8").compress(x, {})
    monkeypatch.setenv(kernels.ENV, "off")
    expected, _ = from_spec("int8").compress(x, {})
    assert all(torch.equal(a, b) for a, b in zip(payload, expected))
    monkeypatch.delenv(kernels.ENV)
    monkeypatch.setitem(kernels._testing, "strict", True)
    assert kernels.for_tensor(x) is None and not kernels.enabled()


# -- the dispatch, with or without triton ---------------------------------------------


def test_the_cpu_path_never_takes_the_kernels():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.for_tensor(torch.zeros(8)) is None


def test_kernels_can_be_switched_off_and_a_bad_setting_is_refused(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "off")
    assert kernels.mode() == "off" and not kernels.enabled()
    assert kernels.path(from_spec("int8")) == kernels.TORCH
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(BytecompError, match="BYTECOMP_KERNELS='fast'"):
        kernels.mode()
    monkeypatch.setenv(kernels.ENV, "")
    assert kernels.mode() == "auto"


def test_the_kernel_trait_is_declared_where_kernels_exist_and_carried_by_error_feedback():
    with_kernels = {name for name, cls in COMPRESSORS.items() if cls.kernel == kernels.TRITON}
    assert with_kernels >= {"int8", "signsgd", "signum", "efsignsgd", "onebit", "randomk"}
    assert not with_kernels & {"topk", "dgc", "exdyna", "threshold", "fp16", "qsgd"}
    assert from_spec("randomk").kernel == kernels.TRITON  # through the wrapper
    assert from_spec("topk").kernel is None
    expected = kernels.TRITON if kernels.enabled() else kernels.TORCH
    assert kernels.path(from_spec("signum")) == expected
    assert kernels.path(from_spec("signum"), "cpu") == kernels.TORCH


def test_the_compressors_table_says_which_path_encodes_on_cuda(cli):
    import json

    result = cli("compressors", "--format", "json", "int8", "topk")
    assert result.returncode == 0, result.stderr
    shown = {c["name"]: c for c in json.loads(result.stdout)["compressors"]}
    assert shown["int8"]["traits"]["kernel"] == kernels.TRITON
    assert shown["topk"]["cuda_path"] == kernels.TORCH
    assert shown["int8"]["cuda_path"] == kernels.path(from_spec("int8"))
    table = cli("compressors", "int8", "topk")
    assert "kernel" in table.stdout and kernels.path(from_spec("int8")) in table.stdout


# -- compiled, on a GPU (make gpu-check) ----------------------------------------------

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU (make gpu-check runs these there)")


@pytest.fixture
def on_gpu():
    if not kernels.triton_installed():
        pytest.skip(NO_TRITON)
    if not kernels._capable(CUDA):
        pytest.skip("the kernels need compute capability 8.0 or newer")


@pytest.mark.parametrize("numel", [1, 7, 4099, (1 << 20) + 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", FUSED)
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.cuda
@cuda_only
def test_on_cuda_the_kernels_give_what_the_pytorch_path_gives(monkeypatch, spec, dtype, numel):
    """Compiled: bit for bit (Signum's momentum included: an FMA, as torch's add_ with
    alpha on CUDA), the scales within 1e-5; three steps."""
    inputs = [randn(numel, seed, dtype, CUDA) for seed in range(3)]
    assert_same_steps(spec, steps(spec, inputs, kernels.TRITON, monkeypatch),
                      steps(spec, inputs, kernels.TORCH, monkeypatch))


@pytest.mark.parametrize("spec", ["int8:ef=true", "efsignsgd", "signum:ef=true", "randomk"])
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.cuda
@cuda_only
def test_on_cuda_metering_matches_and_the_path_is_described(monkeypatch, spec):
    inputs = [randn(4099, seed, torch.bfloat16, CUDA) for seed in range(2)]
    assert_same_steps(spec, steps(spec, inputs, kernels.TRITON, monkeypatch, meter=True),
                      steps(spec, inputs, kernels.TORCH, monkeypatch, meter=True))
    assert kernels.describe(CUDA).startswith(kernels.TRITON)
