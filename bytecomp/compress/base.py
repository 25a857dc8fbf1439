"""The compressor interface.

A compressor turns a flat gradient tensor into a *payload* (the tensors that
travel over the network) and a local *context* (what stays on this rank), and
turns a payload back into a flat tensor. Error feedback is a separate wrapper
(:mod:`bytecomp.compress.feedback`), so any compressor runs with or without it.

Exchange protocol, driven by the schemes in :mod:`bytecomp.comm`:

* ``payload, ctx = c.compress(x, state, peers)``
* for every further round: the payload goes through that round's collective
  (``c.round_collectives``); ``payload, ctx = c.advance(result, ctx, state, peers)``
  where ``result`` is the element-wise mean of all ranks' payloads for an
  ``"allreduce"`` round (reduced *in place*, so a compressor may keep a payload
  tensor as state, like PowerSGD's warm-start Q) or the list of every rank's
  payload for an ``"allgather"`` round;
* the last payload goes through the last collective and ``c.decompress(mean, ctx)``
  (``"allreduce"``) or the mean of ``c.decompress(p, ctx)`` over ranks
  (``"allgather"``) is the aggregated gradient.

``state`` is a dict owned by the caller, one per tensor (or merged group, or
chunk): compressors keep step counters, momentum, factors and residuals in it,
so that it can be checkpointed with ``torch.save``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch

    Payload = list[torch.Tensor]


def __getattr__(name: str) -> Any:
    if name == "Payload":  # list[torch.Tensor], made on first use (it needs torch)
        import torch

        globals()["Payload"] = payload = list[torch.Tensor]
        return payload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Peers:
    """The caller's place in the group of ranks that exchange payloads."""

    rank: int = 0
    size: int = 1


SOLO = Peers()


class Meta(NamedTuple):
    """What every decompression needs to know about the original tensor."""

    numel: int
    dtype: torch.dtype
    device: torch.device


def meta_of(x: torch.Tensor) -> Meta:
    return Meta(x.numel(), x.dtype, x.device)


@dataclass(frozen=True)
class Param:
    """A compressor parameter: its type, default and valid range."""

    kind: type
    default: Any
    rule: str = ""
    check: Callable[[Any], bool] | None = None
    help: str = ""
    primary: bool = True  # shown in the canonical spec even at its default
    choices: tuple[str, ...] | None = None

    def valid(self, value: Any) -> bool:
        if self.choices is not None and value not in self.choices:
            return False
        return self.check is None or bool(self.check(value))

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + "|".join(self.choices)
        return self.rule or self.kind.__name__


# PyTorch's DDP communication hooks a compressor may be (``Compressor.pytorch_hook``), by
# their names in torch.distributed.algorithms.ddp_comm_hooks: DDP's own allreduce (no hook
# registered), the fp16 cast and PowerSGD.
ALLREDUCE_HOOK = "allreduce_hook"
FP16_HOOK = "fp16_compress_hook"
POWERSGD_HOOK = "powerSGD_hook"

# An adaptive ladder over a sparsifier's kept fraction, as GraVAC's: 0.1 halving down to
# 1e-4 (values as their specs print them).
FRACTION_LADDER = tuple(float(f"{0.1 / 2 ** k:.6g}") for k in range(10))


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class Compressor:
    """Base class: subclasses set the class attributes and implement the methods.

    Capability flags (what the planner's search needs):

    * ``summable``: payloads can be averaged element-wise by allreduce and the
      mean decompresses to the mean of the ranks' decompressions.
    * ``gatherable``: a payload can be decompressed by any rank with its own
      context (allgather works).
    * ``chunkable``: compressing chunks independently is valid (two-shot
      alltoall + allgather).
    * ``fixed_size``: the payload size depends on numel only, so receivers know
      it without exchanging sizes; otherwise ``payload_bytes`` is an upper bound.
    * ``round_collectives``: the collective of each exchange round for the
      native protocol (``("allreduce",)`` for summable, ``("allgather",)`` else).

    Traits (what the planner, the cost model and the executor need to know; no
    module outside :mod:`bytecomp.compress` decides by a compressor's name):

    * ``compresses``: False for the identity (the gradient travels as it is).
    * ``cast_dtype``: a plain cast to this dtype (``"float16"``): its payload is
      reduced in that dtype (:attr:`wire_dtype`), and a hierarchical scheme's 16-bit
      intra-node stages are timed with its profile timings.
    * ``metered_without_ef``: an adaptive plan's level may run it without error
      feedback; the controller takes its gain as 1 (a 16-bit cast keeps nearly all).
    * ``per_matrix``: a merged group's members stay matrices of their own (the
      payload depends on their shapes: low-rank compressors).
    * ``measured_payload``: the payload's size depends on the data; the planner prices
      it with the profile's measured payloads.
    * ``payload_estimate``: what :meth:`payload_bytes` gives for a variable-size
      payload: a ``"bound"`` or the ``"target"`` it adapts to.
    * ``pytorch_hook``: the PyTorch DDP communication hook that does what this
      compressor does, by its name (:data:`ALLREDUCE_HOOK`: DDP's own allreduce;
      :data:`FP16_HOOK`, :data:`POWERSGD_HOOK`), when configured as the hook is
      (:meth:`runs_as_pytorch_hook`).
    * ``ladder``: ``(parameter, settings mild to aggressive)`` of the family's adaptive
      ladder (``plan --adaptive``), if it has one.
    * ``kernel``: ``"triton"`` where its encode and decode (and, with error feedback, the
      residual's update: :meth:`compress_fed_back`) run fused Triton kernels on a CUDA
      tensor when triton imports (:mod:`bytecomp.compress.kernels`), with the results of
      its PyTorch ops; None: PyTorch ops everywhere.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    summable: ClassVar[bool] = False
    gatherable: ClassVar[bool] = True
    chunkable: ClassVar[bool] = True
    fixed_size: ClassVar[bool] = True
    default_ef: ClassVar[bool] = False
    requires_ef: ClassVar[bool] = False
    round_collectives: ClassVar[tuple[str, ...]] = ()
    compresses: ClassVar[bool] = True
    cast_dtype: ClassVar[str | None] = None
    metered_without_ef: ClassVar[bool] = False
    per_matrix: ClassVar[bool] = False
    measured_payload: ClassVar[bool] = False
    payload_estimate: ClassVar[str] = "bound"
    pytorch_hook: ClassVar[str | None] = None
    ladder: ClassVar[tuple[str, tuple] | None] = None
    kernel: ClassVar[str | None] = None
    # the names of every class attribute above, in their order: what a wrapper (error
    # feedback) takes from its inner one. Set below the class from its annotations, so
    # that a trait is declared once, above.
    TRAITS: ClassVar[tuple[str, ...]]

    def __init__(self, **values: Any) -> None:
        self.values = {key: p.default for key, p in self.params.items()}
        self.values.update(values)
        for key, value in self.values.items():
            setattr(self, key, value)

    # -- identity --------------------------------------------------------------
    @property
    def error_feedback(self) -> bool:
        return False

    @property
    def rounds(self) -> int:
        return len(self.collectives_of_rounds())

    def collectives_of_rounds(self) -> tuple[str, ...]:
        if self.round_collectives:
            return self.round_collectives
        return ("allreduce",) if self.summable else ("allgather",)

    @property
    def wire_dtype(self) -> str:
        """The dtype a summable payload is reduced in (a cast's, else float32)."""
        return self.cast_dtype or "float32"

    def runs_as_pytorch_hook(self) -> str | None:
        """The PyTorch DDP communication hook (:attr:`pytorch_hook`) that does exactly
        what this compressor, so configured, does; None where it differs (error feedback
        on or off, say)."""
        return self.hook_for(self.error_feedback)

    def hook_for(self, error_feedback: bool) -> str | None:
        """:meth:`runs_as_pytorch_hook` with error feedback on or off: by default the
        hook runs without."""
        return None if error_feedback else self.pytorch_hook

    @property
    def spec(self) -> str:
        """Canonical spec string: primary parameters always, others when not default."""
        parts = []
        for key, param in self.params.items():
            value = self.values[key]
            if param.primary or value != param.default:
                parts.append(f"{key}={format_value(value)}")
        if self.error_feedback != self.default_ef:
            parts.append(f"ef={format_value(self.error_feedback)}")
        return self.name + (":" + ",".join(parts) if parts else "")

    def __repr__(self) -> str:
        return f"<compressor {self.spec}>"

    # -- what the search needs -------------------------------------------------
    def payload_bytes(self, numel: int, element_size: int = 4, shapes: list | None = None) -> int:
        """Bytes that travel for one tensor of ``numel`` elements (bound if not fixed_size).

        ``shapes``: the shapes of the tensors concatenated into it, where known
        (matrix compressors use them)."""
        raise NotImplementedError

    def round_payload_bytes(self, numel: int, element_size: int = 4,
                            shapes: list | None = None) -> list[int]:
        """Bytes each rank sends in each exchange round (they sum to payload_bytes)."""
        return [self.payload_bytes(numel, element_size, shapes)]

    # -- the protocol ----------------------------------------------------------
    def compress(self, x: torch.Tensor, state: dict, peers: Peers = SOLO) -> tuple[Payload, Any]:
        raise NotImplementedError

    def advance(self, result: Any, ctx: Any, state: dict, peers: Peers = SOLO) -> tuple[Payload, Any]:
        raise NotImplementedError(f"{self.name} has a single exchange round")

    def decompress(self, payload: Payload, ctx: Any) -> torch.Tensor:
        raise NotImplementedError

    def compress_fed_back(self, x: torch.Tensor, residual: torch.Tensor | None, state: dict,
                          peers: Peers = SOLO, keep: bool = False) -> tuple | None:
        """Error feedback's step fused with the compression, where a kernel does it: for
        ``c = x + residual`` (``x`` where ``residual`` is None) ``(payload, ctx, c -
        approximation, c where keep else None)``, with exactly the values of
        :meth:`compress` and :meth:`approximation` on ``c``. None (the default, and
        wherever no kernel takes ``x``) leaves ``state`` as it was: error feedback then
        takes those two steps itself. Single-round compressors only."""
        return None

    def approximation(self, payload: Payload, ctx: Any, x: torch.Tensor) -> torch.Tensor:
        """What this rank's own payload of ``x`` (just compressed) decompresses to: error
        feedback keeps ``x`` less this. A compressor may rebuild it from ``x`` more
        cheaply than by decompressing; it must give exactly :meth:`decompress`'s values."""
        return self.decompress(payload, ctx)

    def decompress_into(self, payload: Payload, ctx: Any, out: torch.Tensor) -> torch.Tensor:
        """``decompress`` written into ``out`` (a flat tensor of the original dtype)."""
        result = self.decompress(payload, ctx)
        if result.data_ptr() != out.data_ptr():
            out.copy_(result.reshape(out.shape))
        return out

    def aggregate_into(self, payloads: list[Payload], ctx: Any, out: torch.Tensor) -> torch.Tensor:
        """The mean of every rank's decompressed payload, summed in rank order in float32,
        written into ``out``."""
        import torch

        total = torch.zeros(out.numel(), dtype=torch.float32, device=out.device)
        for payload in payloads:
            total += self.decompress(payload, ctx).float()
        return out.copy_(total.div_(len(payloads)))


Compressor.TRAITS = tuple(name for name in Compressor.__annotations__ if name != "TRAITS")


# -- helpers shared by the compressors -------------------------------------------


def count_of(ratio: float, numel: int) -> int:
    """Number of elements kept at ``ratio`` of ``numel``: at least one, at most all."""
    if numel == 0:
        return 0
    return max(1, min(numel, math.ceil(ratio * numel)))


def index_dtype(numel: int) -> torch.dtype:
    import torch

    return torch.int32 if numel < 2**31 else torch.int64


def index_bytes(numel: int) -> int:
    return 4 if numel < 2**31 else 8


def seeded_generator(device: torch.device, *keys: int) -> torch.Generator:
    """A generator whose seed is a stable hash of ``keys`` (same on every rank and run)."""
    import torch

    digest = hashlib.blake2b(repr(tuple(int(k) for k in keys)).encode(), digest_size=8).digest()
    generator = torch.Generator(device=device)
    generator.manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    return generator


def next_step(state: dict) -> int:
    """Return this call's step number for ``state`` and advance the counter."""
    step = state.get("step", 0)
    state["step"] = step + 1
    return step


def scatter_values(values: torch.Tensor, indices: torch.Tensor, meta: Meta) -> torch.Tensor:
    import torch

    out = torch.zeros(meta.numel, dtype=meta.dtype, device=meta.device)
    if indices.numel():
        out.index_put_((indices.long(),), values.to(meta.dtype))
    return out


def payload_nbytes(payload: Payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload)
