"""Exact (unsampled) aggregation operators: what sampled blocks estimate, and what inference uses."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import row_positions
from lightning_mqgnn.sampling.batch import Block
from lightning_mqgnn.sampling.radix_sort import stable_argsort

AGGREGATIONS = ("gcn", "mean")


def gcn_norm(graph: CSRGraph) -> Tensor:
    """1 / sqrt(d̂_v) with d̂ = degree + 1 (the self loop of Â = A + I, eq. 2)."""
    return (graph.in_degrees().to(torch.float64) + 1.0).rsqrt()


def row_mass(graph: CSRGraph, aggregation: str, norm: Tensor | None) -> Tensor:
    """Σ_u P_vu over every in-neighbour u of each node v (self loop excluded): 1 for the mean of a
    node with neighbours, ``norm_v Σ_u norm_u`` for GCN's L (eq. 2)."""
    deg = graph.in_degrees()
    if aggregation == "mean":
        return (deg > 0).to(torch.float64)
    sums = torch.zeros(graph.num_nodes, dtype=torch.float64).index_add_(
        0, graph.row_ids(), norm[graph.indices]
    )
    return norm * sums


def edge_weights(graph: CSRGraph, aggregation: str) -> tuple[Tensor, Tensor]:
    """Exact weights of every graph edge (CSR order) and of each node's self loop.

    ``gcn``: P_vu = 1/sqrt(d̂_v d̂_u) and P_vv = 1/d̂_v (eq. 2). ``mean``: 1/deg_v per neighbour,
    no self term (SAGE reads self features separately, eq. 17).
    """
    if aggregation == "gcn":
        norm = gcn_norm(graph)
        w = norm[graph.row_ids()] * norm[graph.indices]
        return w.to(torch.float32), (norm * norm).to(torch.float32)
    if aggregation == "mean":
        deg = graph.in_degrees().clamp(min=1).to(torch.float32)
        return (1.0 / deg)[graph.row_ids()], torch.zeros(graph.num_nodes)
    raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")


def full_block(graph: CSRGraph, dst: Tensor, weights: Tensor, self_weights: Tensor) -> tuple[Block, Tensor]:
    """Full-neighbourhood block of ``dst`` over *global* source ids (``num_src = N``).

    Returns the block and nothing to relabel: inference holds all N rows of the previous layer,
    so global ids index it directly. Self loops with non-zero weight are added as edges. When
    ``dst`` is ``0, 1, ..., len(dst) - 1`` the destinations are the first sources
    (``dst_in_src``), as in a sampled block.
    """
    has_self = bool((self_weights != 0).any())
    first = int(dst[0]) if dst.numel() else 0
    if not has_self and torch.equal(dst, torch.arange(first, first + dst.numel(), dtype=dst.dtype)):
        # consecutive destinations: their rows are one slice of the CSR, used as they are
        lo, hi = int(graph.indptr[first]), int(graph.indptr[first + dst.numel()])
        block = Block(
            num_dst=dst.numel(),
            num_src=graph.num_nodes,
            indptr=graph.indptr[first : first + dst.numel() + 1] - lo,
            indices=graph.indices[lo:hi],
            weights=weights[lo:hi],
            dst_in_src=first == 0,
        )
        return block, dst
    starts, ends = graph.indptr[dst], graph.indptr[dst + 1]
    counts = ends - starts
    edge_pos = row_positions(starts, counts)
    src = graph.indices[edge_pos]
    w = weights[edge_pos]
    if has_self:
        local_dst = torch.repeat_interleave(torch.arange(dst.numel()), counts)
        local_dst = torch.cat([local_dst, torch.arange(dst.numel())])
        src = torch.cat([src, dst])
        w = torch.cat([w, self_weights[dst]])
        order = stable_argsort(local_dst, bound=dst.numel())
        src, w = src[order], w[order]
        counts = counts + 1
    indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    block = Block(
        num_dst=dst.numel(),
        num_src=graph.num_nodes,
        indptr=indptr,
        indices=src,
        weights=w,
        dst_in_src=bool(torch.equal(dst, torch.arange(dst.numel(), dtype=dst.dtype))),
    )
    return block, dst
