"""Real architectures' parameter tensors with per-tensor backward times, for the search
benchmark's ``real`` set (``benchmarks/search.py --set real``).

Each generator walks its architecture layer by layer (the shapes are the published
architectures'; nothing is copied from another project's files) and returns the
parameter tensors in forward order (``synthetic_profile`` readies them in reverse: the
last layer's gradients first), each with the backward time spent before it is ready.

How the backward times are derived. A layer's backward is two GEMMs or convolutions
(the gradient of its input and of its weight), so twice its forward FLOPs (once for the
network's first layer: no input gradient), priced at :data:`FLOPS_PER_MS`; what is bound
by memory (norms, activations, bias reductions, embedding scatters, softmax) is priced
by the bytes it moves at :data:`BYTES_PER_MS`. A layer's time is charged to its last
tensor in forward order, the first of its tensors that backward readies; work without
parameters (the attention's score and value products, pooling, an untied output head)
is charged to the tensor that backward readies next. The rates are one fp32 V100's,
sustained rather than peak: 8 TFLOP/s (of 15.7 peak) puts ResNet-50 (not in the set, a
check) at 3 x 8.2 GFLOP per 224 x 224 image, about 330 images/s of training, the order
of the published fp32 V100 rates (VGG-16's 3x3 convolutions run faster than their FLOPs
say, by Winograd's transform, so its backward here is on the long side); 450 GB/s is
half of HBM2's 900. Batches per GPU are the usual fp32 V100 ones, in each generator's
docstring; what they give (:func:`backward_ms`, the ``real`` set's table prints them):

    VGG-16 264 ms, ResNet-101 162 ms, BERT-base 247 ms, GPT-2 small 335 ms,
    UGATIT-like 115 ms, LSTM LM 16 ms of backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bytecomp.profile_store import Profile
from bytecomp.testing.synthetic import synthetic_profile

FLOPS_PER_MS = 8e9  # 8 TFLOP/s: a V100's sustained fp32 rate on convolutions and GEMMs
BYTES_PER_MS = 4.5e8  # 450 GB/s: half of a V100's HBM2 bandwidth, for memory-bound work
FLOAT = 4  # bytes per fp32 element


@dataclass
class Net:
    """Parameter tensors in forward order with the backward time charged to each."""

    tensors: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    first: bool = True  # the next compute layer is the network's first (no input gradient)

    def layer(self, params: Sequence[tuple[str, tuple[int, ...]]], flops: float = 0.0,
              moved: float = 0.0) -> None:
        """A layer of ``params`` whose forward costs ``flops`` and whose backward moves
        ``moved`` bytes besides its GEMMs: the backward's time is charged to its last
        tensor (the first that backward readies)."""
        gemms = flops * (1 if self.first else 2)  # input and weight gradients
        if flops:
            self.first = False
        self.tensors += params
        self.ms += [0.0] * len(params)
        self.ms[-1] += gemms / FLOPS_PER_MS + moved / BYTES_PER_MS

    def extra(self, flops: float = 0.0, moved: float = 0.0) -> None:
        """Backward work without parameters after the last layer added (it runs before
        that layer's backward, so it delays that layer's tensors)."""
        self.ms[-1] += 2 * flops / FLOPS_PER_MS + moved / BYTES_PER_MS

    def conv(self, name: str, cin: int, cout: int, k: int, out_hw: int, batch: int,
             bias: bool = False) -> None:
        """A ``k`` x ``k`` convolution with an ``out_hw`` x ``out_hw`` output, and its
        activation's backward (read the output's gradient and the mask, write)."""
        outputs = batch * cout * out_hw * out_hw
        params = [(f"{name}.weight", (cout, cin, k, k))] + \
            ([(f"{name}.bias", (cout,))] if bias else [])
        self.layer(params, 2.0 * outputs * cin * k * k, 3 * FLOAT * outputs)

    def linear(self, name: str, fan_in: int, fan_out: int, rows: int, bias: bool = True,
               weight_shape: tuple[int, ...] | None = None) -> None:
        """A linear layer over ``rows`` rows (tokens or images)."""
        params = [(f"{name}.weight", weight_shape or (fan_out, fan_in))] + \
            ([(f"{name}.bias", (fan_out,))] if bias else [])
        self.layer(params, 2.0 * rows * fan_in * fan_out, 3 * FLOAT * rows * fan_out)

    def norm(self, name: str, shape: tuple[int, ...], elements: int,
             names: tuple[str, ...] = ("weight", "bias")) -> None:
        """A norm's affine parameters over ``elements`` activations: its backward reads
        the input and the output's gradient and writes the input's, twice (statistics)."""
        self.layer([(f"{name}.{n}", shape) for n in names], 0.0, 5 * FLOAT * elements)

    def shapes_and_ms(self) -> tuple[list[tuple[str, tuple[int, ...]]], list[float]]:
        return list(self.tensors), list(self.ms)


def backward_ms(net: Net) -> float:
    """The backward time a generator's tensors add up to (without per-tensor costs)."""
    return sum(net.ms)


def vgg16(batch: int = 32, image: int = 224) -> Net:
    """VGG-16 (configuration D: 13 3x3 convolutions in five stages, max pooling after each,
    then 25088-4096-4096-1000), 32 tensors, 138M parameters; 224 x 224, batch 32."""
    net = Net()
    size, inputs = image, 3
    for widths in ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)):
        for width in widths:
            net.conv(f"features.{len(net.tensors) // 2}", inputs, width, 3, size, batch,
                     bias=True)
            inputs = width
        size //= 2
        net.extra(moved=3 * FLOAT * batch * inputs * size * size * 4)  # max pooling
    rows = batch
    for index, (fan_in, fan_out) in enumerate(((inputs * size * size, 4096), (4096, 4096),
                                               (4096, 1000))):
        net.linear(f"classifier.{index}", fan_in, fan_out, rows)
    return net


def resnet101(batch: int = 32, image: int = 224) -> Net:
    """ResNet-101 (bottleneck blocks 3, 4, 23, 3; batch norms with weight and bias; the
    downsampling projection on each stage's first block), 314 tensors, 44.5M
    parameters; 224 x 224, batch 32."""
    net = Net()
    size = image // 2
    net.conv("conv1", 3, 64, 7, size, batch)
    net.norm("bn1", (64,), batch * 64 * size * size)
    size //= 2
    net.extra(moved=3 * FLOAT * batch * 64 * size * size * 4)  # max pooling
    inplanes = 64
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 23, 3)), 1):
        for block in range(count):
            prefix = f"layer{stage}.{block}"
            out = size // 2 if stage > 1 and block == 0 else size
            convs = ((inplanes, planes, 1, size),  # the stride is on the 3x3 (v1.5)
                     (planes, planes, 3, out), (planes, planes * 4, 1, out))
            for i, (cin, cout, k, hw) in enumerate(convs, 1):
                net.conv(f"{prefix}.conv{i}", cin, cout, k, hw, batch)
                net.norm(f"{prefix}.bn{i}", (cout,), batch * cout * hw * hw)
            if block == 0:
                net.conv(f"{prefix}.downsample.0", inplanes, planes * 4, 1, out, batch)
                net.norm(f"{prefix}.downsample.1", (planes * 4,), batch * planes * 4 * out * out)
            inplanes, size = planes * 4, out
    net.extra(moved=2 * FLOAT * batch * 2048 * size * size)  # global average pooling
    net.linear("fc", 2048, 1000, batch)
    return net


def _attention_core(net: Net, batch: int, seq: int, width: int, heads: int) -> None:
    """The scores (Q K^T), the softmax and the weighted values: no parameters."""
    net.extra(flops=2.0 * 2 * batch * seq * seq * width,
              moved=5 * FLOAT * batch * heads * seq * seq)


def bert_base(batch: int = 32, seq: int = 128, layers: int = 12, width: int = 768,
              heads: int = 12, vocab: int = 30522) -> Net:
    """BERT-base pretraining (embeddings, 12 post-norm encoder layers, the pooler, the
    masked-LM head tied to the word embeddings with its own transform and bias, the
    next-sentence classifier), 206 tensors, 110M parameters; sequences of 128, batch 32."""
    net = Net()
    tokens = batch * seq
    net.layer([("embeddings.word_embeddings.weight", (vocab, width)),
               ("embeddings.position_embeddings.weight", (512, width)),
               ("embeddings.token_type_embeddings.weight", (2, width))],
              moved=3 * 2 * FLOAT * tokens * width)  # scatter-adds of the gradient
    net.norm("embeddings.LayerNorm", (width,), tokens * width)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            net.linear(f"{p}.attention.self.{name}", width, width, tokens)
        _attention_core(net, batch, seq, width, heads)
        net.linear(f"{p}.attention.output.dense", width, width, tokens)
        net.norm(f"{p}.attention.output.LayerNorm", (width,), tokens * width)
        net.linear(f"{p}.intermediate.dense", width, 4 * width, tokens)
        net.linear(f"{p}.output.dense", 4 * width, width, tokens)
        net.norm(f"{p}.output.LayerNorm", (width,), tokens * width)
    net.linear("pooler.dense", width, width, batch)
    net.linear("cls.predictions.transform.dense", width, width, tokens)
    net.norm("cls.predictions.transform.LayerNorm", (width,), tokens * width)
    # the decoder's weight is the word embeddings' (tied): only its bias is a tensor
    net.layer([("cls.predictions.bias", (vocab,))], 2.0 * tokens * width * vocab,
              3 * FLOAT * tokens * vocab)
    net.linear("cls.seq_relationship", width, 2, batch)
    return net


def gpt2_small(batch: int = 4, seq: int = 1024, layers: int = 12, width: int = 768,
               heads: int = 12, vocab: int = 50257) -> Net:
    """GPT-2 small (token and position embeddings, 12 pre-norm decoder layers with a fused
    QKV projection, the final norm, the head tied to the token embeddings), 148 tensors,
    124M parameters; sequences of 1,024, batch 4."""
    net = Net()
    tokens = batch * seq
    net.layer([("wte.weight", (vocab, width)), ("wpe.weight", (seq, width))],
              moved=2 * 2 * FLOAT * tokens * width)
    for i in range(layers):
        p = f"h.{i}"
        net.norm(f"{p}.ln_1", (width,), tokens * width)
        net.linear(f"{p}.attn.c_attn", width, 3 * width, tokens, weight_shape=(width, 3 * width))
        _attention_core(net, batch, seq, width, heads)
        net.linear(f"{p}.attn.c_proj", width, width, tokens, weight_shape=(width, width))
        net.norm(f"{p}.ln_2", (width,), tokens * width)
        net.linear(f"{p}.mlp.c_fc", width, 4 * width, tokens, weight_shape=(width, 4 * width))
        net.linear(f"{p}.mlp.c_proj", 4 * width, width, tokens, weight_shape=(4 * width, width))
    net.norm("ln_f", (width,), tokens * width)
    # the tied head (logits and their softmax) runs first in backward, before ln_f is ready
    net.extra(flops=2.0 * tokens * width * vocab, moved=3 * FLOAT * tokens * vocab)
    return net


def _ugatit_generator(net: Net, prefix: str, batch: int, image: int, blocks: int,
                      ngf: int = 64) -> None:
    """U-GAT-IT's generator, light version (the MLP for AdaILN's gamma and beta works on
    pooled features): down-sampling, ``blocks`` residual blocks with instance norms (no
    affine parameters), the CAM attention (gap/gmp logits, a 1x1 convolution),
    ``blocks`` AdaILN residual blocks (a rho per norm), up-sampling with ILN (rho,
    gamma, beta) and the output convolution; convolutions without biases."""
    size = image
    net.conv(f"{prefix}.DownBlock.1", 3, ngf, 7, size, batch)
    width = ngf
    for i in range(2):
        size //= 2
        net.conv(f"{prefix}.DownBlock.{4 + 3 * i}", width, width * 2, 3, size, batch)
        width *= 2
    elements = batch * width * size * size
    for i in range(blocks):
        for j in (1, 4):
            net.conv(f"{prefix}.DownBlock.{10 + i}.conv_block.{j}", width, width, 3, size, batch)
            net.extra(moved=5 * FLOAT * elements)  # the instance norm
    net.layer([(f"{prefix}.gap_fc.weight", (1, width)), (f"{prefix}.gmp_fc.weight", (1, width))],
              2.0 * 2 * batch * width, 2 * FLOAT * elements)
    net.conv(f"{prefix}.conv1x1", 2 * width, width, 1, size, batch, bias=True)
    for name in ("FC.0", "FC.2", "gamma", "beta"):
        net.linear(f"{prefix}.{name}", width, width, batch, bias=False)
    for i in range(blocks):
        p = f"{prefix}.UpBlock1_{i + 1}"
        for j in (1, 2):
            net.conv(f"{p}.conv{j}", width, width, 3, size, batch)
            net.norm(f"{p}.norm{j}", (1, width, 1, 1), elements, names=("rho",))
    for i in range(2):
        size *= 2
        net.conv(f"{prefix}.UpBlock2.{2 + 4 * i}", width, width // 2, 3, size, batch)
        width //= 2
        net.norm(f"{prefix}.UpBlock2.{3 + 4 * i}", (1, width, 1, 1), batch * width * size * size,
                 names=("rho", "gamma", "beta"))
    net.conv(f"{prefix}.UpBlock2.{2 + 4 * 2}", width, 3, 7, size, batch)


def _ugatit_discriminator(net: Net, prefix: str, batch: int, image: int, layers: int,
                          ndf: int = 64) -> None:
    """U-GAT-IT's discriminator of ``layers`` layers (7: global, 5: local): strided 4x4
    convolutions with biases under spectral norm (``weight_orig`` is the parameter), one
    unstrided, the CAM logits, a 1x1 convolution and the output convolution."""
    size = image // 2
    net.conv(f"{prefix}.model.1", 3, ndf, 4, size, batch, bias=True)
    width = ndf
    for i in range(1, layers - 2):
        size //= 2
        net.conv(f"{prefix}.model.{1 + 3 * i}", width, width * 2, 4, size, batch, bias=True)
        width *= 2
    size -= 1
    net.conv(f"{prefix}.model.{1 + 3 * (layers - 2)}", width, width * 2, 4, size, batch,
             bias=True)
    width *= 2
    net.layer([(f"{prefix}.gap_fc.weight_orig", (1, width)),
               (f"{prefix}.gmp_fc.weight_orig", (1, width))], 2.0 * 2 * batch * width,
              2 * FLOAT * batch * width * size * size)
    net.conv(f"{prefix}.conv1x1", 2 * width, width, 1, size, batch, bias=True)
    net.conv(f"{prefix}.conv", width, 1, 4, size - 1, batch)


def ugatit(batch: int = 1, image: int = 256, blocks: int = 9) -> Net:
    """A U-GAT-IT-like pair: two generators (A to B, B to A) and four discriminators (a
    global and a local one per domain), one backward over all of them; 9 residual
    blocks per half of a generator (the count CycleGAN uses at 256 x 256; U-GAT-IT's
    default is 4), 256 x 256 images, batch 1 (the paper's): 208 tensors, most of them
    small (norms' rho, gamma and beta; biases; CAM logits)."""
    net = Net()
    for name in ("genA2B", "genB2A"):
        net.first = True
        _ugatit_generator(net, name, batch, image, blocks)
    for name, layers in (("disGA", 7), ("disGB", 7), ("disLA", 5), ("disLB", 5)):
        net.first = True
        _ugatit_discriminator(net, name, batch, image, layers)
    return net


def lstm_lm(batch: int = 20, seq: int = 35, layers: int = 2, width: int = 1500,
            vocab: int = 10000) -> Net:
    """A 2-layer LSTM language model (Zaremba et al.'s large PTB model: 10,000 words,
    1,500 units, decoder not tied), 11 tensors, 66M parameters; 35 steps, batch 20. Each
    layer's gradients are ready once its backward through time has ended."""
    net = Net()
    tokens = batch * seq
    net.layer([("encoder.weight", (vocab, width))], moved=2 * FLOAT * tokens * width)
    for i in range(layers):
        gates = 4 * width
        net.layer([(f"rnn.weight_ih_l{i}", (gates, width)), (f"rnn.weight_hh_l{i}", (gates, width)),
                   (f"rnn.bias_ih_l{i}", (gates,)), (f"rnn.bias_hh_l{i}", (gates,))],
                  2.0 * tokens * gates * 2 * width, 6 * FLOAT * tokens * gates)
    net.linear("decoder", width, vocab, tokens)
    net.extra(moved=3 * FLOAT * tokens * vocab)  # the softmax and the loss
    return net


# (name, generator) of the real set, in the benchmark's order
REAL = [("VGG-16", vgg16), ("ResNet-101", resnet101), ("BERT-base", bert_base),
        ("GPT-2 small", gpt2_small), ("UGATIT-like", ugatit), ("LSTM LM", lstm_lm)]


def parameters(net: Net) -> int:
    """The network's parameter count."""
    return sum(math.prod(shape) for _, shape in net.tensors)


def real_profile(net: Net, world_size: int = 8, nodes: int = 1,
                 fidelity: bool = False) -> Profile:
    """A synthetic profile (GPU-like compression speeds) of ``net``'s tensors, each ready
    after the backward time the generator charged to it (plus the profile's fixed 0.01
    ms per tensor); with ``fidelity``, the synthetic fidelity table (then the planner's
    objective is effective time, as on a profile that measured gains)."""
    shapes, ms = net.shapes_and_ms()
    return synthetic_profile(shapes, world_size=world_size, nodes=nodes,
                             backward_ms=sum(ms) + 0.01 * len(shapes), weights=ms,
                             fidelity=fidelity)
