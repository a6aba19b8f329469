"""Exact (unsampled) aggregation operators: what sampled blocks estimate, and what inference uses."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ExactOperator:
    """The exact aggregation operator of a graph as node-sized factors: ``P_vu = dst_scale[v] *
    src_scale[u]`` for an edge ``u -> v`` (``src_scale`` None: 1) and ``P_vv = self_weight[v]``
    (None: no self term). A block's weights are computed from them for its edges only, so exact
    inference over a graph with billions of edges never holds a weight per edge of the graph.

    ``gcn``: ``1/sqrt(d̂_v d̂_u)`` and ``1/d̂_v`` (eq. 2), the products taken in float64 and
    rounded once. ``mean``: ``1/deg_v`` per neighbour, no self term (SAGE reads self features
    separately, eq. 17).
    """

    dst_scale: Tensor
    src_scale: Tensor | None
    self_weight: Tensor | None

    def weights(self, dst: Tensor, counts: Tensor, src: Tensor) -> Tensor:
        """float32 weights of the edges of destinations ``dst`` (``counts[i]`` edges each, in that
        order) from sources ``src``."""
        w = self.dst_scale[dst].repeat_interleave(counts, output_size=src.numel())
        if self.src_scale is not None:
            w = w * self.src_scale[src]
        return w.to(torch.float32)


def exact_operator(graph: CSRGraph, aggregation: str) -> ExactOperator:
    """The exact operator that ``aggregation`` ('gcn' or 'mean') samplers estimate."""
    if aggregation == "gcn":
        norm = gcn_norm(graph)
        return ExactOperator(norm, norm, (norm * norm).to(torch.float32))
    if aggregation == "mean":
        return ExactOperator(1.0 / graph.in_degrees().clamp(min=1).to(torch.float32), None, None)
    raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")


def edge_weights(graph: CSRGraph, aggregation: str) -> tuple[Tensor, Tensor]:
    """Exact weights of every graph edge (CSR order) and of each node's self loop (zero where
    there is none): ``exact_operator`` spelled out per edge, for code that indexes the edges of
    the whole graph."""
    op = exact_operator(graph, aggregation)
    nodes = torch.arange(graph.num_nodes)
    weights = op.weights(nodes, graph.in_degrees(), graph.indices)
    self_weights = op.self_weight if op.self_weight is not None else torch.zeros(graph.num_nodes)
    return weights, self_weights


def full_block(graph: CSRGraph, dst: Tensor, op: ExactOperator) -> tuple[Block, Tensor]:
    """Full-neighbourhood block of ``dst`` over *global* source ids (``num_src = N``), weighted
    by ``op``.

    Returns the block and nothing to relabel: inference holds all N rows of the previous layer,
    so global ids index it directly. Self loops are added as edges where ``op`` has them. When
    ``dst`` is ``0, 1, ..., len(dst) - 1`` the destinations are the first sources
    (``dst_in_src``), as in a sampled block.
    """
    first = int(dst[0]) if dst.numel() else 0
    consecutive = torch.equal(dst, torch.arange(first, first + dst.numel(), dtype=dst.dtype))
    if op.self_weight is None and consecutive:
        # consecutive destinations: their rows are one slice of the CSR, used as they are
        lo, hi = int(graph.indptr[first]), int(graph.indptr[first + dst.numel()])
        indptr = graph.indptr[first : first + dst.numel() + 1] - lo
        indices = graph.indices[lo:hi]
        block = Block(
            num_dst=dst.numel(),
            num_src=graph.num_nodes,
            indptr=indptr,
            indices=indices,
            weights=op.weights(dst, indptr[1:] - indptr[:-1], indices),
            dst_in_src=first == 0,
        )
        return block, dst
    starts, ends = graph.indptr[dst], graph.indptr[dst + 1]
    counts = ends - starts
    src = graph.indices[row_positions(starts, counts)]
    w = op.weights(dst, counts, src)
    if op.self_weight is not None:
        local_dst = torch.repeat_interleave(torch.arange(dst.numel()), counts)
        local_dst = torch.cat([local_dst, torch.arange(dst.numel())])
        src = torch.cat([src, dst])
        w = torch.cat([w, op.self_weight[dst]])
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
        dst_in_src=first == 0 and consecutive,
    )
    return block, dst
