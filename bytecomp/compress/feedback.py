"""Error feedback (residual memory) as a wrapper around any compressor.

Each step the residual is added to the gradient before compression, and what
this rank's own payload does not carry becomes the next residual::

    c = x + residual
    payload = compress(c)
    residual = c - decompress(own final-round payload)

so over steps, everything sent plus the residual equals the sum of the
inputs (telescoping). A compressor with fused kernels takes these steps in one
(:meth:`~bytecomp.compress.base.Compressor.compress_fed_back`, on a GPU: the same values). For multi-round compressors (PowerSGD, ExDyna) the
residual is taken at the last round, from this rank's own contribution to it.

Where the state asks for it (``state["meter"]``, set by the executor for
adaptive plans), each step also leaves the squared norms of the compensated
gradient and of the new residual in ``state["sq_norm"]`` and
``state["sq_error"]`` (0-d float tensors on the gradient's device): the
compression gain ``sqrt(1 - sq_error / sq_norm)`` without another pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bytecomp.compress.base import SOLO, Compressor, Peers

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch


def _squared_norm(x: torch.Tensor) -> torch.Tensor:
    """``||x||^2`` as a 0-d tensor: a dot product (one pass, no temporary; a float64 sum
    of ``x * x`` cost four times as much on the CPU). It stays in the gradient's float
    type: a cast to float64 would be one more kernel per group and step on a GPU, and
    the gain needs no more than float32's precision (on the CPU a float32 dot of 10M
    Gaussian elements is off by about 1e-4, relative)."""
    import torch

    flat = x.reshape(-1)
    if flat.dtype in (torch.float16, torch.bfloat16):  # a 16-bit dot rounds its result
        flat = flat.float()
    return torch.dot(flat, flat)


def _keep_residual(state: dict, compensated: torch.Tensor, approx: torch.Tensor) -> None:
    _store_residual(state, compensated, compensated - approx)


def _store_residual(state: dict, compensated: torch.Tensor | None,
                    residual: torch.Tensor) -> None:
    state["residual"] = residual
    if state.get("meter"):
        assert compensated is not None, "metering needs the compensated gradient"
        state["sq_norm"] = _squared_norm(compensated)
        state["sq_error"] = _squared_norm(residual)


class ErrorFeedback(Compressor):
    """Wrap ``inner`` with a residual kept in ``state["residual"]`` (inner state in
    ``state["inner"]``)."""

    def __init__(self, inner: Compressor) -> None:
        self.inner = inner
        self.values = inner.values
        for trait in Compressor.TRAITS:
            setattr(self, trait, getattr(inner, trait))

    @property
    def error_feedback(self) -> bool:
        return True

    def runs_as_pytorch_hook(self) -> str | None:
        return self.inner.hook_for(True)

    def collectives_of_rounds(self):
        return self.inner.collectives_of_rounds()

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return self.inner.payload_bytes(numel, element_size, shapes)

    def round_payload_bytes(self, numel, element_size=4, shapes=None):
        return self.inner.round_payload_bytes(numel, element_size, shapes)

    def _inner_state(self, state: dict) -> dict:
        inner = state.get("inner")
        if inner is None:
            inner = state["inner"] = {k: v for k, v in state.items() if k in ("salt", "shapes")}
        return inner

    def compress(self, x, state, peers: Peers = SOLO):
        residual = state.get("residual")
        if residual is not None and (residual.shape != x.shape or residual.device != x.device):
            residual = None
        if self.inner.rounds == 1:  # a kernel may fuse the residual's update (on a GPU)
            meter = bool(state.get("meter"))
            fused = self.inner.compress_fed_back(x, residual, self._inner_state(state), peers,
                                                 keep=meter)
            if fused is not None:
                payload, ctx, new_residual, compensated = fused
                _store_residual(state, compensated, new_residual)
                return payload, (ctx, compensated, 1)
        compensated = x + residual if residual is not None else x.clone()
        payload, ctx = self.inner.compress(compensated, self._inner_state(state), peers)
        if self.inner.rounds == 1:
            _keep_residual(state, compensated,
                           self.inner.approximation(payload, ctx, compensated))
        return payload, (ctx, compensated, 1)

    def advance(self, result, ctx, state, peers: Peers = SOLO):
        inner_ctx, compensated, round_number = ctx
        payload, inner_ctx = self.inner.advance(result, inner_ctx, self._inner_state(state), peers)
        round_number += 1
        if round_number == self.inner.rounds:
            _keep_residual(state, compensated, self.inner.decompress(payload, inner_ctx))
        return payload, (inner_ctx, compensated, round_number)

    def decompress(self, payload, ctx):
        return self.inner.decompress(payload, ctx[0])

    def approximation(self, payload, ctx, x):
        return self.inner.approximation(payload, ctx[0], x)

    def decompress_into(self, payload, ctx, out):
        return self.inner.decompress_into(payload, ctx[0], out)

    def aggregate_into(self, payloads, ctx, out):
        return self.inner.aggregate_into(payloads, ctx[0], out)
