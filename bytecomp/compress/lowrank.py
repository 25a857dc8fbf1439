"""Low-rank compressors: PowerSGD and ACP-SGD.

A flat tensor is viewed as a matrix: ``(shape[0], numel / shape[0])`` when the
caller put the parameter's ``shape`` (two or more dimensions) in the state, as
PyTorch's PowerSGD hook does, otherwise a near-square zero-padded matrix, so
that merged groups and chunks work too. Factors are float32 whatever the
gradient's dtype. Random initial factors come from a seed shared by all ranks.
"""

from __future__ import annotations

import math

import torch

from bytecomp.compress.base import (
    SOLO,
    Compressor,
    Param,
    Peers,
    meta_of,
    next_step,
    seeded_generator,
)

_RANK = Param(int, 4, "1 <= rank <= 1024", lambda v: 1 <= v <= 1024, "approximation rank")
_SEED = Param(int, 0, "seed >= 0", lambda v: v >= 0, "seed of the shared random factors",
              primary=False)
_ORTH = Param(str, "auto", choices=("auto", "gs", "qr"), primary=False,
              help="orthogonalization: Gram-Schmidt, QR, or auto (QR above rank 2)")


def matrix_shape(numel: int, shape: tuple | None = None) -> tuple[int, int]:
    if shape is not None and len(shape) >= 2 and math.prod(shape) == numel and numel:
        return int(shape[0]), numel // int(shape[0])
    rows = math.isqrt(numel)
    rows += rows * rows < numel
    return rows, (-(-numel // rows) if rows else 0)


def orthogonalize(matrix: torch.Tensor, method: str = "auto", epsilon: float = 1e-8) -> torch.Tensor:
    """Orthonormal columns spanning ``matrix``'s columns (Gram-Schmidt or QR)."""
    rank = matrix.shape[1]
    if rank == 0 or matrix.shape[0] == 0:
        return matrix
    if method == "qr" or (method == "auto" and rank > 2):
        return torch.linalg.qr(matrix, mode="reduced").Q
    matrix = matrix.clone()
    for i in range(rank):
        column = matrix[:, i : i + 1]
        column.div_(column.norm() + epsilon)
        if i + 1 < rank:
            rest = matrix[:, i + 1 :]
            rest.sub_(column @ (column.T @ rest))
    return matrix


class _LowRank(Compressor):
    summable = True
    gatherable = False  # factors are kept as state and must be the mean on every rank
    chunkable = False
    default_ef = True

    def _rank_for(self, rows: int, cols: int) -> int:
        return min(self.rank, rows, cols)

    def payload_bytes(self, numel, element_size=4, shape=None):
        rows, cols = matrix_shape(numel, shape)
        return (rows + cols) * self._rank_for(rows, cols) * 4

    def _matrix(self, x: torch.Tensor, state: dict) -> torch.Tensor:
        rows, cols = matrix_shape(x.numel(), state.get("shape"))
        flat = torch.zeros(rows * cols, dtype=torch.float32, device=x.device)
        flat[: x.numel()] = x.reshape(-1)
        return flat.view(rows, cols)

    def _random_factor(self, length: int, rank: int, device, state: dict, step: int):
        generator = seeded_generator(device, self.seed, state.get("salt", 0), step)
        return torch.randn(length, rank, generator=generator, device=device)

    def _product(self, left: torch.Tensor, right: torch.Tensor, meta) -> torch.Tensor:
        return (left @ right.T).reshape(-1)[: meta.numel].to(meta.dtype)


class PowerSGD(_LowRank):
    """PowerSGD (Vogels et al.): two allreduce rounds per step, P then Q.

    ``P = M Q``; allreduce P; ``P^ = orth(P)``; ``Q = M^T P^``; allreduce Q;
    the result is ``P^ Q^T``. With warm start, the averaged Q seeds the next step.
    """

    name = "powersgd"
    summary = "PowerSGD rank-r, two allreduce rounds (P then Q), warm start"
    round_collectives = ("allreduce", "allreduce")
    params = {
        "rank": _RANK,
        "warm_start": Param(bool, True, help="reuse the last averaged Q", primary=False),
        "orth": _ORTH,
        "seed": _SEED,
    }

    def compress(self, x, state, peers: Peers = SOLO):
        step = next_step(state)
        matrix = self._matrix(x, state)
        rows, cols = matrix.shape
        rank = self._rank_for(rows, cols)
        q = state.get("q") if self.warm_start else None
        if q is None or q.shape != (cols, rank) or q.device != x.device:
            q = self._random_factor(cols, rank, x.device, state, 0 if self.warm_start else step)
        return [matrix @ q], (meta_of(x), matrix)

    def advance(self, result, ctx, state, peers: Peers = SOLO):
        meta, matrix = ctx
        p_hat = orthogonalize(result[0], self.orth)
        q = matrix.T @ p_hat
        if self.warm_start:
            state["q"] = q  # averaged in place by the next allreduce
        return [q], (meta, p_hat)

    def decompress(self, payload, ctx):
        meta, p_hat = ctx
        return self._product(p_hat, payload[0], meta)


class ACPSGD(_LowRank):
    """ACP-SGD (Zhang et al., ICDCS'23): one allreduce per step, alternating factors.

    P-step: ``Q^ = orth(Q)``, ``P = M Q^``, allreduce P, result ``P Q^^T``.
    Q-step: ``P^ = orth(P)``, ``Q = M^T P^``, allreduce Q, result ``P^ Q^T``.
    Error feedback (on by default) keeps ``M + E - (local estimate)`` as in the paper.
    """

    name = "acpsgd"
    summary = "ACP-SGD: alternate P and Q, one allreduce per step"
    params = {"rank": _RANK, "orth": _ORTH, "seed": _SEED}

    def payload_bytes(self, numel, element_size=4, shape=None):
        """Per step on average: P (rows x r) and Q (cols x r) travel on alternate steps."""
        return super().payload_bytes(numel, element_size, shape) // 2

    def compress(self, x, state, peers: Peers = SOLO):
        matrix = self._matrix(x, state)
        rows, cols = matrix.shape
        rank = self._rank_for(rows, cols)
        q = state.get("q")
        if q is None or q.shape != (cols, rank) or q.device != x.device:
            state.update(q=self._random_factor(cols, rank, x.device, state, 0), step=0)
            state.pop("p", None)
        if next_step(state) % 2 == 0:
            q_hat = orthogonalize(state["q"], self.orth)
            state["q"] = q_hat
            state["p"] = matrix @ q_hat  # averaged in place by the allreduce
            return [state["p"]], (meta_of(x), "p", q_hat)
        p_hat = orthogonalize(state["p"], self.orth)
        state["p"] = p_hat
        state["q"] = matrix.T @ p_hat
        return [state["q"]], (meta_of(x), "q", p_hat)

    def decompress(self, payload, ctx):
        meta, which, fixed = ctx
        if which == "p":
            return self._product(payload[0], fixed, meta)
        return self._product(fixed, payload[0], meta)
