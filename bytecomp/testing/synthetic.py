"""Synthetic profiles: model-shaped tensor lists with modelled times, for tests and
the search benchmark (no ranks needed).

Backward time is spread over the tensors in proportion to their size, or to given
weights (plus a fixed cost per tensor), the last layer's gradients first. Collective sweeps
follow the ring formulas on one link; compressor sweeps follow
``a + numel / throughput`` per spec. Every number is a parameter, and the
profile says ``synthetic: true``.
"""

from __future__ import annotations

import math

import pandas as pd

from bytecomp.compress import default_specs, from_spec
from bytecomp.costs.fitted import ring_ms
from bytecomp.profile_meta import ProfileMeta
from bytecomp.profile_store import FORMAT_VERSION, Profile
from bytecomp.profile_tables import TABLES
from bytecomp.profiler.sweeps import COLLECTIVES, DTYPES

# (fixed ms, elements per ms) for encode and decode, GPU-like speeds; a compressor not
# listed (one registered outside bytecomp) gets DEFAULT_THROUGHPUT.
DEFAULT_THROUGHPUT = (0.05, 3e7, 0.03, 1e8)
THROUGHPUT = {
    "none": (0.0, 1e12, 0.0, 1e12), "fp16": (0.01, 2e8, 0.01, 2e8), "bf16": (0.01, 2e8, 0.01, 2e8),
    "int8": (0.03, 5e7, 0.02, 1e8), "topk": (0.08, 1e7, 0.03, 1e8), "randomk": (0.05, 5e7, 0.03, 1e8),
    "dgc": (0.1, 3e7, 0.03, 1e8), "threshold": (0.05, 3e7, 0.03, 1e8),
    "qsgd": (0.05, 3e7, 0.03, 6e7), "terngrad": (0.05, 3e7, 0.03, 6e7),
    "signsgd": (0.03, 6e7, 0.03, 6e7), "signum": (0.04, 5e7, 0.03, 6e7),
    "efsignsgd": (0.04, 4e7, 0.03, 6e7), "onebit": (0.05, 3e7, 0.03, 6e7),
    "powersgd": (0.2, 2e7, 0.05, 1e8), "acpsgd": (0.15, 3e7, 0.05, 1e8),
    "exdyna": (0.1, 2.5e7, 0.03, 1e8),
}


def mlp_shapes(layers: int = 5, width: int = 1024) -> list[tuple[str, tuple]]:
    shapes = []
    for i in range(layers):
        shapes += [(f"layers.{i}.weight", (width, width)), (f"layers.{i}.bias", (width,))]
    return shapes


def resnet_shapes(blocks: tuple[int, ...] = (3, 4, 6, 3)) -> list[tuple[str, tuple]]:
    """A bottleneck ResNet's parameter tensors (convolutions, batch norms, classifier):
    161 for ResNet-50's blocks, 314 for ResNet-101's ``(3, 4, 23, 3)``."""
    shapes = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    inplanes = 64
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks), 1):
        for block in range(count):
            prefix = f"layer{stage}.{block}"
            convs = [(planes, inplanes, 1, 1), (planes, planes, 3, 3), (planes * 4, planes, 1, 1)]
            for i, shape in enumerate(convs, 1):
                shapes += [(f"{prefix}.conv{i}.weight", shape),
                           (f"{prefix}.bn{i}.weight", (shape[0],)),
                           (f"{prefix}.bn{i}.bias", (shape[0],))]
            if block == 0:
                shapes += [(f"{prefix}.downsample.0.weight", (planes * 4, inplanes, 1, 1)),
                           (f"{prefix}.downsample.1.weight", (planes * 4,)),
                           (f"{prefix}.downsample.1.bias", (planes * 4,))]
            inplanes = planes * 4
    return shapes + [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]


def resnet50_shapes() -> list[tuple[str, tuple]]:
    """ResNet-50's 161 parameter tensors."""
    return resnet_shapes((3, 4, 6, 3))


def resnet101_shapes() -> list[tuple[str, tuple]]:
    """ResNet-101's 314 parameter tensors (44.5M parameters)."""
    return resnet_shapes((3, 4, 23, 3))


def vgg16_shapes() -> list[tuple[str, tuple]]:
    """VGG-16's 32 parameter tensors (13 convolutions, 3 linear layers; 138M parameters)."""
    shapes: list[tuple[str, tuple]] = []
    inputs = 3
    for index, width in enumerate((64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512,
                                   512)):
        shapes += [(f"features.{index}.weight", (width, inputs, 3, 3)),
                   (f"features.{index}.bias", (width,))]
        inputs = width
    for index, (rows, cols) in enumerate(((4096, 25088), (4096, 4096), (1000, 4096))):
        shapes += [(f"classifier.{index}.weight", (rows, cols)),
                   (f"classifier.{index}.bias", (rows,))]
    return shapes


def gan_shapes(blocks: int = 48, width: int = 128) -> list[tuple[str, tuple]]:
    """A GAN-like pair (a generator and a discriminator of residual conv blocks with batch
    norms): several hundred small tensors, 3x3 convolutions of ``width`` channels and
    their norms' weights and biases, 6 per block, plus stems and heads; 48 blocks give
    296 tensors of 7.2M parameters."""
    shapes: list[tuple[str, tuple]] = [("generator.project.weight", (width * 16, 128)),
                                       ("generator.project.bias", (width * 16,))]
    half = blocks // 2
    for net, count in (("generator", half), ("discriminator", blocks - half)):
        for block in range(count):
            prefix = f"{net}.block{block}"
            for i in (1, 2):
                shapes += [(f"{prefix}.conv{i}.weight", (width, width, 3, 3)),
                           (f"{prefix}.norm{i}.weight", (width,)),
                           (f"{prefix}.norm{i}.bias", (width,))]
    shapes += [("generator.to_rgb.weight", (3, width, 3, 3)), ("generator.to_rgb.bias", (3,)),
               ("discriminator.stem.weight", (width, 3, 3, 3)),
               ("discriminator.head.weight", (1, width * 16)), ("discriminator.head.bias", (1,))]
    return shapes


def bert_shapes(layers: int = 12, width: int = 768, vocab: int = 30522) -> list:
    """BERT-base's 199 parameter tensors (110M parameters)."""
    shapes: list[tuple[str, tuple]] = [("embeddings.word", (vocab, width)),
                                       ("embeddings.position", (512, width)),
                                       ("embeddings.token_type", (2, width)),
                                       ("embeddings.norm.weight", (width,)),
                                       ("embeddings.norm.bias", (width,))]
    for i in range(layers):
        p = f"layer.{i}"
        for name in ("query", "key", "value", "output"):
            shapes += [(f"{p}.attention.{name}.weight", (width, width)),
                       (f"{p}.attention.{name}.bias", (width,))]
        shapes += [(f"{p}.attention.norm.weight", (width,)), (f"{p}.attention.norm.bias", (width,)),
                   (f"{p}.intermediate.weight", (4 * width, width)),
                   (f"{p}.intermediate.bias", (4 * width,)),
                   (f"{p}.output.weight", (width, 4 * width)), (f"{p}.output.bias", (width,)),
                   (f"{p}.output.norm.weight", (width,)), (f"{p}.output.norm.bias", (width,))]
    return shapes + [("pooler.weight", (width, width)), ("pooler.bias", (width,))]


def gpt2_shapes(layers: int = 12, width: int = 768, vocab: int = 50257) -> list:
    """GPT-2 small's 148 parameter tensors (124M parameters)."""
    shapes: list[tuple[str, tuple]] = [("wte", (vocab, width)), ("wpe", (1024, width))]
    for i in range(layers):
        p = f"h.{i}"
        shapes += [(f"{p}.ln_1.weight", (width,)), (f"{p}.ln_1.bias", (width,)),
                   (f"{p}.attn.c_attn.weight", (width, 3 * width)),
                   (f"{p}.attn.c_attn.bias", (3 * width,)),
                   (f"{p}.attn.c_proj.weight", (width, width)), (f"{p}.attn.c_proj.bias", (width,)),
                   (f"{p}.ln_2.weight", (width,)), (f"{p}.ln_2.bias", (width,)),
                   (f"{p}.mlp.c_fc.weight", (width, 4 * width)),
                   (f"{p}.mlp.c_fc.bias", (4 * width,)),
                   (f"{p}.mlp.c_proj.weight", (4 * width, width)),
                   (f"{p}.mlp.c_proj.bias", (width,))]
    return shapes + [("ln_f.weight", (width,)), ("ln_f.bias", (width,))]


def lstm_shapes(layers: int = 2, width: int = 1500, vocab: int = 10000) -> list:
    """A 2-layer LSTM language model (Zaremba et al.'s large PTB model: 10,000 words,
    1,500 units) with the decoder tied to the embedding: 10 tensors (51M parameters)."""
    shapes: list[tuple[str, tuple]] = [("embedding.weight", (vocab, width))]
    for i in range(layers):
        shapes += [(f"lstm.weight_ih_l{i}", (4 * width, width)),
                   (f"lstm.weight_hh_l{i}", (4 * width, width)),
                   (f"lstm.bias_ih_l{i}", (4 * width,)), (f"lstm.bias_hh_l{i}", (4 * width,))]
    return shapes + [("decoder.bias", (vocab,))]


def transformer_shapes(layers: int = 48, width: int = 1024, vocab: int = 32000) -> list:
    """A 48-layer decoder with 31 tensors per layer (1,500 in all with embeddings)."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed.weight", (vocab, width)),
                                                 ("pos.weight", (2048, width))]
    for i in range(layers):
        p = f"layers.{i}"
        for name in ("q", "k", "v", "o"):
            shapes += [(f"{p}.attn.{name}.weight", (width, width)), (f"{p}.attn.{name}.bias", (width,))]
        for name in ("norm1", "norm2", "q_norm", "k_norm"):
            shapes += [(f"{p}.{name}.weight", (width,)), (f"{p}.{name}.bias", (width,))]
        for name, shape in (("gate", (4 * width, width)), ("up", (4 * width, width)),
                            ("down", (width, 4 * width))):
            shapes += [(f"{p}.mlp.{name}.weight", shape), (f"{p}.mlp.{name}.bias", (shape[0],))]
        shapes += [(f"{p}.scale.{j}", (width,)) for j in range(9)]
    shapes += [(f"final_norm.{j}", (width,)) for j in range(8)]
    return shapes + [("head.weight", (vocab, width)), ("head.bias", (vocab,))]


def synthetic_profile(shapes: list[tuple[str, tuple]], world_size: int = 8, nodes: int = 1,
                      backward_ms: float | None = None, specs: list[str] | None = None,
                      latency_us: float = 30.0, bandwidth_gbps: float = 10.0,
                      device: str = "cuda", name: str = "synthetic",
                      bucket_cap_mb: float = 25.0, interference: float = 0.0,
                      intra_interference: float | None = None,
                      fidelity: bool = False, probe: dict[str, float] | None = None,
                      weights: list[float] | None = None) -> Profile:
    """A profile of a model with these parameter ``shapes`` (forward order); ``weights``
    (forward order, default each tensor's size): the share of the backward time spent
    before each tensor is ready, after the one behind it (see
    :mod:`bytecomp.testing.architectures`, which derives them from FLOPs); with
    ``fidelity``, a fidelity table from :func:`synthetic_gain` and norm shares that
    grow with the square root of a tensor's size; with ``probe``, these steps factors
    by spec as its convergence probe's."""
    numels = [math.prod(shape) for _, shape in shapes]
    total = sum(numels)
    backward_ms = backward_ms if backward_ms is not None else 5.0 + total / 2e6
    per_tensor = 0.01
    spread = numels if weights is None else list(weights)
    if len(spread) != len(shapes):
        raise ValueError(f"{len(spread)} weights for {len(shapes)} tensors")
    scale = (backward_ms - per_tensor * len(shapes)) / sum(spread)
    rows, ready = [], 0.0
    for (tensor, shape), numel, share in reversed(list(zip(shapes, numels, spread))):
        ready += per_tensor + share * scale
        rows.append({"name": tensor, "shape": "x".join(map(str, shape)), "numel": numel,
                     "dtype": "float32", "bytes": 4 * numel, "ready_ms": round(ready, 6),
                     "bucket": 0})
    alpha = latency_us / 1000.0
    beta = 8.0 / (bandwidth_gbps * 1e9) * 1000.0
    collectives = []
    groups = [("world", world_size)]
    if nodes > 1 and world_size // nodes > 1:
        groups += [("intra", world_size // nodes), ("inter", nodes)]
    elif nodes > 1:
        groups += [("inter", nodes)]
    per_node = world_size // nodes
    for group, ranks in groups:
        # the inter-node groups of all local ranks run at once and share each node's link
        shared = beta * per_node if group == "inter" else beta
        for collective in COLLECTIVES:
            for dtype in DTYPES:
                for exponent in range(10, 27, 2):
                    nbytes = 1 << exponent
                    time = ring_ms(collective, ranks, nbytes, alpha, shared) + 0.005
                    collectives.append({"collective": collective, "group": group, "dtype": dtype,
                                        "bytes": nbytes, "ranks": ranks, "time_ms": time,
                                        "p10_ms": time, "p90_ms": time})
    compressors: list[dict] = []
    for spec in specs or default_specs():
        compressor = from_spec(spec)
        a_enc, rate_enc, a_dec, rate_dec = THROUGHPUT.get(compressor.name, DEFAULT_THROUGHPUT)
        for exponent in range(8, 25, 4):
            numel = 1 << exponent
            compressors.append({"spec": compressor.spec, "device": device, "numel": numel,
                                "encode_ms": a_enc + numel / rate_enc,
                                "decode_ms": a_dec + numel / rate_dec,
                                "payload_bytes": compressor.payload_bytes(numel)})
    if device == "cuda":
        compressors += [{**row, "device": "cpu", "encode_ms": row["encode_ms"] * 10,
                         "decode_ms": row["decode_ms"] * 10} for row in list(compressors)]
    copies: list[dict] = [{"direction": d, "bytes": 1 << e, "time_ms": 0.01 + (1 << e) / rate}
              for d, rate in (("d2h", 2.5e7), ("h2d", 2.5e7), ("d2d", 2e8))
              for e in range(10, 27, 4)]
    forward_ms = backward_ms / 2
    times = {key: {"median_ms": value, "p10_ms": value, "p90_ms": value} for key, value in
             (("forward", forward_ms), ("backward", backward_ms), ("optimizer", 0.05 * backward_ms),
              ("iteration", forward_ms + backward_ms * 1.05),
              ("backward_compute", backward_ms))}
    meta: ProfileMeta = {"format_version": FORMAT_VERSION, "synthetic": True,
            "model": {"name": name, "spec": name, "fingerprint": f"synthetic-{name}",
                      "parameters": total, "tensors": len(shapes)},
            "device": {"type": device, "name": "synthetic"}, "backend": "synthetic",
            "world_size": world_size, "nodes": nodes, "ranks_per_node": world_size // nodes,
            "batch_size": 1, "bucket_cap_mb": bucket_cap_mb, "times": times,
            "interference": {"fraction": interference}}
    if intra_interference is not None:
        meta["interference"]["intra_fraction"] = intra_interference
    gains = []
    if fidelity:
        weights = [math.sqrt(numel) * (1 + index % 4) for index, numel in enumerate(numels)]
        for spec in dict.fromkeys(row["spec"] for row in compressors):
            if not from_spec(spec).compresses:
                continue
            for index, ((tensor, _), weight) in enumerate(zip(shapes, weights)):
                value = synthetic_gain(spec, index)
                gains.append({"tensor": tensor, "spec": spec, "gain": value,
                              "gain_p10": value, "gain_p90": value,
                              "norm_share": weight / sum(weights)})
    probed = [{"spec": from_spec(spec).spec, "steps_factor": factor, "steps": 100}
              for spec, factor in (probe or {}).items()]
    if probe:
        meta["probe"] = {"steps": 100}
    return Profile(meta, pd.DataFrame(rows), pd.DataFrame(collectives), pd.DataFrame(compressors),
                   pd.DataFrame(copies),
                   fidelity=pd.DataFrame(gains, columns=list(TABLES["fidelity"])),
                   probe=pd.DataFrame(probed, columns=list(TABLES["probe"])))


# Typical gains (the shape of what bytecomp profile measures): casts keep nearly all,
# low-rank and error-feedback sparsifiers a part, unscaled signs and random-k little; a
# compressor not listed gets DEFAULT_GAIN.
DEFAULT_GAIN = 0.7
BASE_GAIN = {"fp16": 0.9999, "bf16": 0.999, "int8": 0.999, "topk": 0.6, "randomk": 0.2,
             "dgc": 0.6, "threshold": 0.7, "qsgd": 0.7, "terngrad": 0.4, "signsgd": 0.3,
             "signum": 0.3, "efsignsgd": 0.7, "onebit": 0.72, "powersgd": 0.85,
             "acpsgd": 0.75, "exdyna": 0.7}


def synthetic_gain(spec: str, index: int) -> float:
    """A compressor's gain on the ``index``-th tensor: its base gain, higher on every
    second and third tensor (so that tensors differ)."""
    base = BASE_GAIN.get(from_spec(spec).name, DEFAULT_GAIN)
    return round(base ** (1.0 / (1 + 0.5 * (index % 3))), 6)
