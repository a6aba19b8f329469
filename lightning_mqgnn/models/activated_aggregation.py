"""ReLU + dropout and the next layer's aggregation as one autograd step, for a backward of one pass.

Apart, the backward of ``A · dropout(relu(h))`` is three passes over the activation: the
aggregation's ``Aᵀ g`` (``embedding_bag`` over the block's transpose) writes it, ReLU + dropout's
backward reads it and the forward's output and writes it again. Together, one compiled loop
gathers each source row's ``Aᵀ g`` and keeps it, scaled, only where the forward's output is
positive: the activation is written once and read once. The loop runs in blocks of rows on
torch's own OpenMP threads (``omp_blocks``).
The forward is unchanged: the compiled ReLU + dropout pass (``dropout.relu_mask_``) over ``h``,
then the aggregation (with GraphSAGE's self rows beside it).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

from lightning_mqgnn.models.dropout import ReLUDropout, _operator_scope, keep_scale, relu_mask_
from lightning_mqgnn.models.omp_blocks import blocked_loop, run_blocked
from lightning_mqgnn.sampling.aggregate import _check_constant, block_sums, transpose_of
from lightning_mqgnn.sampling.batch import Block

_SIGNATURE = (
    "void(int64[::1], int64[::1], float32[::1], float32[:, ::1], boolean, float32[:, ::1], float32, "
    "float32[:, ::1], int64)"
)


def _compiled(blocks_of, parallel: bool):
    """The loop, its blocks of rows on threads (``parallel``) or in turn (``omp_blocks``)."""

    @njit(_SIGNATURE, nogil=True, parallel=parallel, cache=True)
    def masked_transposed_row_sum(src_indptr, dst_rows, weights, g, with_self, out, scale, grad, blocks):
        """``grad[s] = scale · (Σ_e w_e g[dst_e] (+ g[s, c:] for a self row)) where out[s] > 0, else
        0`` over source rows ``s`` (the CSC ``src_indptr``/``dst_rows``/``weights``), in ``blocks``
        contiguous blocks of rows. ``g`` holds the neighbour half's gradient in its first ``c``
        columns and, ``with_self``, the self half's in the next ``c``."""
        num_src, c = grad.shape
        num_dst = g.shape[0]
        zero = np.float32(0.0)
        for b in blocks_of(blocks):
            for s in range(num_src * b // blocks, num_src * (b + 1) // blocks):
                gs = grad[s]
                for j in range(c):
                    gs[j] = zero
                for e in range(src_indptr[s], src_indptr[s + 1]):
                    gd, w = g[dst_rows[e]], weights[e]
                    for j in range(c):
                        gs[j] += w * gd[j]
                if with_self and s < num_dst:
                    gd = g[s]
                    for j in range(c):
                        gs[j] += gd[c + j]
                os_ = out[s]
                for j in range(c):
                    gs[j] = gs[j] * scale if os_[j] > zero else zero

    return masked_transposed_row_sum


_MASKED_TRANSPOSED_ROW_SUM = blocked_loop(_compiled)


def _run_masked_transposed_row_sum(
    transpose, g: Tensor, with_self: bool, out: Tensor, scale: float
) -> Tensor:
    src_indptr, dst_rows, weights = transpose
    grad = torch.empty_like(out)
    args = (
        src_indptr.numpy(),
        dst_rows.numpy(),
        weights.numpy(),
        g.contiguous().numpy(),
        with_self,
        out.numpy(),
        np.float32(scale),
        grad.numpy(),
    )
    with _operator_scope("mqgnn::masked_aggregation_backward"):
        run_blocked(_MASKED_TRANSPOSED_ROW_SUM, *args, threads=torch.get_num_threads())
    return grad


class _ReLUDropoutRowSum(torch.autograd.Function):
    """``A · relu_dropout(h)`` (``with_self``: ``[A h', h'[:rows]]``), ``h`` overwritten with
    ``h' = relu_dropout(h)`` (marked dirty and returned second, for autograd's books)."""

    @staticmethod
    def forward(ctx, h, p, indptr, indices, weights, transpose, with_self):
        ctx.mark_dirty(h)
        ctx.set_materialize_grads(False)
        relu_mask_(h, p)
        agg = block_sums(indices, h, indptr, weights, with_self)
        ctx.save_for_backward(h, indptr, indices, weights, *(transpose or ()))
        ctx.scale, ctx.with_self = keep_scale(p), with_self
        return agg, h

    @staticmethod
    def backward(ctx, grad_agg, grad_h):
        if grad_agg is None:
            return (None,) * 7
        out, indptr, indices, weights, *transpose = ctx.saved_tensors
        transpose = tuple(transpose) or transpose_of(indptr, indices, weights, out.shape[0])
        grad = _run_masked_transposed_row_sum(transpose, grad_agg, ctx.with_self, out, ctx.scale)
        return grad, None, None, None, None, None, None


def _fusable(activation, h: Tensor) -> bool:
    """Whether ``activation`` is a training ReLU + dropout that may overwrite ``h``, and ``h`` a
    contiguous float32 CPU tensor in a graph: the fused step's case; anything else runs apart."""
    return (
        isinstance(activation, ReLUDropout)
        and activation.training
        and activation.inplace
        and activation.p > 0.0
        and h.device.type == "cpu"
        and h.dtype == torch.float32
        and h.is_contiguous()
        and h.requires_grad
        and torch.is_grad_enabled()
    )


@torch.compiler.disable  # compiled loops over numpy views: torch.compile runs it eagerly
def _fused(block: Block, h: Tensor, p: float, with_self: bool) -> Tensor:
    _check_constant(block.weights)
    weights = block.weights.to(h.dtype)
    return _ReLUDropoutRowSum.apply(
        h, p, block.indptr, block.indices, weights, block._transpose(), with_self
    )[0]


def activated_aggregate(block: Block, h: Tensor, activation=None, with_self: bool = False) -> Tensor:
    """``block.aggregate(activation(h))`` (``with_self``: ``aggregate_with_self``), ``activation``
    None for none; a ``ReLUDropout`` that may overwrite ``h`` runs fused with the aggregation
    (module docstring), the same function."""
    if activation is not None and _fusable(activation, h):
        return _fused(block, h, activation.p, with_self)
    if activation is not None:
        h = activation(h)
    return block.aggregate_with_self(h) if with_self else block.aggregate(h)
