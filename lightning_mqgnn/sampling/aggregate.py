"""``out[i] = Σ_e w_e · h[src_e]`` over one block's CSR rows, with a cheap backward.

``torch.sparse.mm`` on a fresh CSR tensor (a new one every mini-batch) paid MKL's per-matrix
setup and transposed the matrix again in backward. ``embedding_bag(mode="sum",
per_sample_weights=w)`` is exactly this weighted row sum, and ``Aᵀ g`` in backward is the same
call on the transposed rows (one sort of the source ids, done by the producer when the block
carries its transpose), with no per-matrix setup, on CPU and CUDA alike. Only
``h`` gets a gradient: block weights are sampling constants.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor
from torch.nn import functional as F

from lightning_mqgnn.sampling.radix_sort import stable_argsort

Transpose = tuple[Tensor, Tensor, Tensor]  # CSC of A: (src_indptr, src_rows, src_weights)
P = ParamSpec("P")
R = TypeVar("R")


def weighted_row_sum(
    indptr: Tensor, indices: Tensor, weights: Tensor, h: Tensor, transpose: Transpose | None = None
) -> Tensor:
    """``A @ h`` for the CSR ``A = (indptr, indices, weights)`` of ``len(indptr) - 1`` rows;
    ``transpose`` (``Block.with_transpose``) spares the backward its sort."""
    _check_constant(weights)
    return _WeightedRowSum.apply(h, indptr, indices, weights.to(h.dtype), transpose)


def weighted_row_sum_with_self(
    indptr: Tensor, indices: Tensor, weights: Tensor, h: Tensor, transpose: Transpose | None = None
) -> Tensor:
    """``[A @ h, h[:rows]]`` side by side, ``rows = len(indptr) - 1``: GraphSAGE's input to one
    GEMM (eq. 17). Its backward adds the self half's gradient into the first rows in place,
    where ``cat`` of a slice would build a zero-padded copy of ``h`` and add it."""
    _check_constant(weights)
    return _WeightedRowSumWithSelf.apply(h, indptr, indices, weights.to(h.dtype), transpose)


def _check_constant(weights: Tensor) -> None:
    if weights.requires_grad:
        raise ValueError("block weights are sampling constants and cannot take gradients")


def row_sum(indices: Tensor, h: Tensor, indptr: Tensor, weights: Tensor) -> Tensor:
    """``out[i] = Σ_{e in row i} weights[e] · h[indices[e]]``, row ``i`` the entries
    ``indptr[i]:indptr[i + 1]`` (no autograd of its own: the functions above and the gather stage
    call it). The whole ``indptr`` goes to ``embedding_bag`` (``include_last_offset``): given only
    the row starts, it copies them to append the end. No entries at all (an edgeless block)
    gives zero rows."""
    if indices.numel() == 0:
        return h.new_zeros(indptr.numel() - 1, h.shape[1])
    return F.embedding_bag(
        indices, h, indptr, mode="sum", per_sample_weights=weights, include_last_offset=True
    )


def _eager_when_compiled(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run eagerly by torch.compile, as ``torch.compiler.disable`` runs it, with the disabled
    function made only once ``torch._dynamo`` is loaded (by a compilation, or by Lightning):
    made at import, it would load ``torch._dynamo`` and sympy, over a second, into processes that
    never compile (a device sampler's). Made by a first call under compilation, it costs that
    compilation one more graph break. A torch without ``torch.compiler.is_compiling`` (before
    2.3) gets the disabled function at once."""
    if not hasattr(torch.compiler, "is_compiling"):
        return torch.compiler.disable(fn)
    disabled: list[Callable[P, R]] = []

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not disabled and (torch.compiler.is_compiling() or "torch._dynamo" in sys.modules):
            disabled.append(torch.compiler.disable(fn))
        if torch.compiler.is_compiling():
            return disabled[0](*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


@_eager_when_compiled  # the CPU path is a numba loop, which torch.compile cannot trace
def transpose_of(indptr: Tensor, indices: Tensor, weights: Tensor, num_src: int) -> Transpose:
    """The CSC of ``A``: the edges ordered by source (one stable sort: each source's edges keep
    their row order), each with its destination row and weight, and where each source's edges
    start. On the CPU a compiled counting sort (``cpu_kernels.transpose``), the same order."""
    if not indices.is_cuda and weights.dtype == torch.float32:
        # imported at first use: the package's own import reaches this module, and numba with
        # its kernels takes a second to load, which importing the strategy should not pay (the
        # samplers import the kernels, so a training step finds them loaded)
        from lightning_mqgnn.sampling import cpu_kernels

        return cpu_kernels.transpose(indptr, indices, weights, num_src)
    counts = indptr[1:] - indptr[:-1]
    dst = torch.repeat_interleave(
        torch.arange(counts.numel(), device=counts.device), counts, output_size=indices.numel()
    )
    order = stable_argsort(indices, bound=num_src)
    src_counts = torch.zeros(num_src, dtype=torch.int64, device=indices.device)
    src_counts.index_add_(0, indices, torch.ones_like(indices))
    src_indptr = torch.zeros(num_src + 1, dtype=torch.int64, device=indices.device)
    torch.cumsum(src_counts, 0, out=src_indptr[1:])
    return src_indptr, dst.index_select(0, order), weights.index_select(0, order)


def _transposed_row_sum(
    indptr: Tensor, indices: Tensor, weights: Tensor, grad: Tensor, num_src: int, transpose: Transpose | None
) -> Tensor:
    """``Aᵀ @ grad``: the same row sum over the edges grouped by source."""
    src_indptr, src_rows, src_weights = transpose or transpose_of(indptr, indices, weights, num_src)
    return row_sum(src_rows, grad.contiguous(), src_indptr, src_weights.to(grad.dtype))


def block_sums(
    indices: Tensor, h: Tensor, indptr: Tensor, weights: Tensor, with_self: bool = False
) -> Tensor:
    """The forward of an aggregation with a backward of its own: ``A h`` (``with_self``:
    ``[A h, h[:rows]]``). ``h`` goes to ``embedding_bag`` detached: one that requires grad takes
    its training path, which also maps each entry to its row for a backward never run here."""
    sums = row_sum(indices, h.detach(), indptr, weights)
    return torch.cat([sums, h[: indptr.numel() - 1]], 1) if with_self else sums


class _WeightedRowSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, indptr: Tensor, indices: Tensor, weights: Tensor, transpose) -> Tensor:
        ctx.save_for_backward(indptr, indices, weights, *(transpose or ()))
        ctx.num_src = h.shape[0]
        return block_sums(indices, h, indptr, weights)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        indptr, indices, weights, *transpose = ctx.saved_tensors
        grad_h = _transposed_row_sum(indptr, indices, weights, grad, ctx.num_src, tuple(transpose) or None)
        return grad_h, None, None, None, None


class _WeightedRowSumWithSelf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, indptr: Tensor, indices: Tensor, weights: Tensor, transpose) -> Tensor:
        ctx.save_for_backward(indptr, indices, weights, *(transpose or ()))
        ctx.num_src = h.shape[0]
        return block_sums(indices, h, indptr, weights, with_self=True)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        indptr, indices, weights, *transpose = ctx.saved_tensors
        width = grad.shape[1] // 2
        grad_h = _transposed_row_sum(
            indptr, indices, weights, grad[:, :width], ctx.num_src, tuple(transpose) or None
        )
        grad_h[: grad.shape[0]] += grad[:, width:]
        return grad_h, None, None, None, None
