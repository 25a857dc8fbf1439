"""Low-rank compressors: PowerSGD and ACP-SGD.

A flat tensor is viewed as one or more matrices. When the caller puts the
``shapes`` of the tensors it concatenated in the state (one shape for a single
parameter), each becomes its own ``(shape[0], numel / shape[0])`` matrix, as
in PyTorch's PowerSGD hook, and their factors travel concatenated in one
collective per round (the hook's batching). Without shapes, or for 1-D
shapes, a near-square zero-padded matrix is used, so that any flat tensor
(a chunk, say) works. Factors are float32 whatever the gradient's dtype.
Random initial factors come from a seed shared by all ranks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from bytecomp.compress.base import (
    POWERSGD_HOOK,
    SOLO,
    Compressor,
    Param,
    Peers,
    meta_of,
    next_step,
    seeded_generator,
)
from bytecomp.compress.registry import register

if TYPE_CHECKING:  # torch is imported where it runs: planning imports this module without it
    import torch

_RANK = Param(int, 4, "1 <= rank <= 1024", lambda v: 1 <= v <= 1024, "approximation rank")
_SEED = Param(int, 0, "seed >= 0", lambda v: v >= 0, "seed of the shared random factors",
              primary=False)
RANK_LADDER = (16, 8, 4, 2, 1)  # an adaptive ladder's ranks, mild to aggressive
_ORTH = Param(str, "auto", choices=("auto", "gs", "qr"), primary=False,
              help="orthogonalization: Gram-Schmidt, QR, or auto (QR above rank 2)")


def powersgd_compresses(shape: tuple, rank: int) -> bool:
    """PyTorch's powerSGD_hook rule (``min_compression_rate`` 2): it compresses a tensor
    of 2 or more dimensions, viewed as ``(n, m)``, where ``(n + m) r * 2 < n m``."""
    if len(shape) < 2:
        return False
    rows = shape[0]
    cols = math.prod(shape) // rows
    return (rows + cols) * min(rank, rows, cols) * 2 < rows * cols


def matrix_shape(numel: int, shape: tuple | None = None) -> tuple[int, int]:
    if shape is not None and len(shape) >= 2 and math.prod(shape) == numel and numel:
        return int(shape[0]), numel // int(shape[0])
    rows = math.isqrt(numel)
    rows += rows * rows < numel
    return rows, (-(-numel // rows) if rows else 0)


# On the CPU, a matrix times a thin one (a few columns: P = M Q, Q = M^T P at low rank)
# ran 3x faster with the thin factor on the left: (Q^T M^T)^T, 0.23 ms against 0.73 for
# the transformer's matrices at rank 8, and 11 against 134 ms for a 4096 x 4096 one at
# rank 4; from rank 16 up the two are even (benchmarks/lowrank_products.py).
THIN_FIRST_BELOW = 16


def thin_product(matrix: torch.Tensor, thin: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """``matrix @ thin`` (``matrix.T @ thin`` with ``transpose``), contiguous, computed
    thin factor first where that is faster (see :data:`THIN_FIRST_BELOW`)."""
    left = matrix.T if transpose else matrix
    if thin.device.type != "cpu" or thin.shape[1] >= THIN_FIRST_BELOW:
        return left @ thin
    return (thin.T @ left.T).T.contiguous()


class Segment(NamedTuple):
    offset: int
    numel: int
    rows: int
    cols: int
    rank: int


def layout(numel: int, shapes, max_rank: int) -> list[Segment]:
    """The matrices a flat tensor of ``numel`` elements is viewed as."""
    sizes = [math.prod(shape) for shape in shapes] if shapes else []
    if not sizes or sum(sizes) != numel:
        shapes, sizes = [None], [numel]
    segments, offset = [], 0
    for shape, size in zip(shapes, sizes):
        rows, cols = matrix_shape(size, tuple(shape) if shape is not None else None)
        segments.append(Segment(offset, size, rows, cols, min(max_rank, rows, cols)))
        offset += size
    return segments


def orthogonalize(matrix: torch.Tensor, method: str = "auto", epsilon: float = 1e-8) -> torch.Tensor:
    """Orthonormal columns spanning ``matrix``'s columns (Gram-Schmidt or QR)."""
    import torch

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
    per_matrix = True
    ladder = ("rank", RANK_LADDER)
    rank: int
    orth: str
    seed: int

    def _layout(self, numel: int, shapes) -> list[Segment]:
        return layout(numel, shapes, self.rank)

    def factor_bytes(self, numel: int, shapes=None) -> tuple[int, int]:
        """Bytes of all P factors and of all Q factors."""
        segments = self._layout(numel, shapes)
        return (4 * sum(s.rows * s.rank for s in segments),
                4 * sum(s.cols * s.rank for s in segments))

    def payload_bytes(self, numel, element_size=4, shapes=None):
        return sum(self.factor_bytes(numel, shapes))

    def _matrices(self, x: torch.Tensor, segments: list[Segment]) -> list[torch.Tensor]:
        import torch

        flat = x.reshape(-1).float()
        matrices = []
        for s in segments:
            piece = flat[s.offset : s.offset + s.numel]
            if s.rows * s.cols != s.numel:
                piece = torch.cat([piece, piece.new_zeros(s.rows * s.cols - s.numel)])
            matrices.append(piece.view(s.rows, s.cols))
        return matrices

    @staticmethod
    def _views(flat: torch.Tensor, segments, length) -> list[torch.Tensor]:
        views, offset = [], 0
        for s in segments:
            size = length(s) * s.rank
            views.append(flat[offset : offset + size].view(length(s), s.rank))
            offset += size
        return views

    def _random_factor(self, size: int, device, state: dict, step: int):
        import torch

        generator = seeded_generator(device, self.seed, state.get("salt", 0), step)
        return torch.randn(size, generator=generator, device=device)

    @staticmethod
    def _factor(matrices, thins, transpose: bool = False) -> torch.Tensor:
        """Every matrix times its thin factor (``M Q``; ``M^T P`` with ``transpose``),
        concatenated flat: the payload of one round."""
        import torch

        return torch.cat([thin_product(m, thin, transpose).reshape(-1)
                          for m, thin in zip(matrices, thins)])

    def _products(self, lefts, rights, segments, meta,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        """Every segment's ``left @ right.T``, written in its place of a flat tensor of
        ``meta``'s dtype: ``out`` where given."""
        import torch

        total = sum(s.numel for s in segments)
        if out is not None and out.dtype == torch.float32 and out.is_contiguous():
            flat, direct = out.reshape(-1), True
        else:
            flat, direct = torch.empty(total, dtype=torch.float32, device=meta.device), False
        for left, right, s in zip(lefts, rights, segments):
            place = flat[s.offset : s.offset + s.numel]
            if s.rows * s.cols == s.numel:
                torch.matmul(left, right.T, out=place.view(s.rows, s.cols))
            else:  # a padded matrix: its first numel elements
                place.copy_((left @ right.T).reshape(-1)[: s.numel])
        if out is None:
            return flat.to(meta.dtype)
        if not direct:
            out.copy_(flat.reshape(out.shape))
        return out


@register
class PowerSGD(_LowRank):
    """PowerSGD (Vogels et al.): two allreduce rounds per step, P then Q.

    ``P = M Q``; allreduce P; ``P^ = orth(P)``; ``Q = M^T P^``; allreduce Q;
    the result is ``P^ Q^T``. With warm start, the averaged Q seeds the next step.
    """

    name = "powersgd"
    summary = "PowerSGD rank-r, two allreduce rounds (P then Q), warm start"
    round_collectives = ("allreduce", "allreduce")
    pytorch_hook = POWERSGD_HOOK  # on the matrices its rule compresses
    params = {
        "rank": _RANK,
        "warm_start": Param(bool, True, help="reuse the last averaged Q", primary=False),
        "orth": _ORTH,
        "seed": _SEED,
    }
    warm_start: bool

    def hook_for(self, error_feedback: bool) -> str | None:
        """PyTorch's powerSGD_hook runs PowerSGD with error feedback and warm start."""
        return self.pytorch_hook if error_feedback and self.values["warm_start"] else None

    def round_payload_bytes(self, numel, element_size=4, shapes=None):
        return list(self.factor_bytes(numel, shapes))

    def compress(self, x, state, peers: Peers = SOLO):
        step = next_step(state)
        segments = self._layout(x.numel(), state.get("shapes"))
        matrices = self._matrices(x, segments)
        q_size = sum(s.cols * s.rank for s in segments)
        q = state.get("q") if self.warm_start else None
        if q is None or q.numel() != q_size or q.device != x.device:
            q = self._random_factor(q_size, x.device, state, 0 if self.warm_start else step)
        qs = self._views(q, segments, lambda s: s.cols)
        p = self._factor(matrices, qs) if segments else q
        return [p], (meta_of(x), segments, matrices)

    def advance(self, result, ctx, state, peers: Peers = SOLO):
        meta, segments, matrices = ctx
        p_hats = [orthogonalize(p, self.orth)
                  for p in self._views(result[0], segments, lambda s: s.rows)]
        q = self._factor(matrices, p_hats, transpose=True)
        if self.warm_start:
            state["q"] = q  # averaged in place by the next allreduce
        return [q], (meta, segments, p_hats)

    def decompress(self, payload, ctx):
        return self.decompress_into(payload, ctx, None)

    def decompress_into(self, payload, ctx, out):
        meta, segments, p_hats = ctx
        qs = self._views(payload[0], segments, lambda s: s.cols)
        return self._products(p_hats, qs, segments, meta, out)


@register
class ACPSGD(_LowRank):
    """ACP-SGD (Zhang et al., ICDCS'23): one allreduce per step, alternating factors.

    P-step: ``Q^ = orth(Q)``, ``P = M Q^``, allreduce P, result ``P Q^^T``.
    Q-step: ``P^ = orth(P)``, ``Q = M^T P^``, allreduce Q, result ``P^ Q^T``.
    Error feedback (on by default) keeps ``M + E - (local estimate)`` as in the paper.
    """

    name = "acpsgd"
    summary = "ACP-SGD: alternate P and Q, one allreduce per step"
    params = {"rank": _RANK, "orth": _ORTH, "seed": _SEED}

    def payload_bytes(self, numel, element_size=4, shapes=None):
        """Per step on average: P (rows x r) and Q (cols x r) travel on alternate steps."""
        return super().payload_bytes(numel, element_size, shapes) // 2

    def compress(self, x, state, peers: Peers = SOLO):
        import torch

        segments = self._layout(x.numel(), state.get("shapes"))
        matrices = self._matrices(x, segments)
        q_size = sum(s.cols * s.rank for s in segments)
        q = state.get("q")
        if q is None or q.numel() != q_size or q.device != x.device:
            state.update(q=self._random_factor(q_size, x.device, state, 0), step=0)
            state.pop("p", None)
        if next_step(state) % 2 == 0:
            q_hats = [orthogonalize(q, self.orth)
                      for q in self._views(state["q"], segments, lambda s: s.cols)]
            state["q"] = torch.cat([q.reshape(-1) for q in q_hats])
            state["p"] = self._factor(matrices, q_hats)
            return [state["p"]], (meta_of(x), segments, "p", q_hats)  # p: averaged in place
        p_hats = [orthogonalize(p, self.orth)
                  for p in self._views(state["p"], segments, lambda s: s.rows)]
        state["p"] = torch.cat([p.reshape(-1) for p in p_hats])
        state["q"] = self._factor(matrices, p_hats, transpose=True)
        return [state["q"]], (meta_of(x), segments, "q", p_hats)

    def decompress(self, payload, ctx):
        return self.decompress_into(payload, ctx, None)

    def decompress_into(self, payload, ctx, out):
        meta, segments, which, fixed = ctx
        if which == "p":
            ps = self._views(payload[0], segments, lambda s: s.rows)
            return self._products(ps, fixed, segments, meta, out)
        qs = self._views(payload[0], segments, lambda s: s.cols)
        return self._products(fixed, qs, segments, meta, out)
