"""The top-down loop shared by the layer-wise samplers (FastGCN, LADIES; Chen et al. §2).

Every layer-wise sampler estimates ``L H`` with ``L = D^-1/2 (A+I) D^-1/2`` (paper §III-B). Going
down from the output layer: ``prev`` = the batch; per layer draw a node set ``S`` (successive
sampling, ``s = min(nnz(p), samples)``), emit the block ``L[prev, S] · diag(colweight(S))`` and
set ``prev = S``. ``colweight`` is ``1/(s p)`` (eq. 8) or, with ``debias``, the weights of eq. 13.
No row normalisation and no added batch nodes (Chen et al.); all-zero rows are allowed.

Subclasses only say where the probabilities come from (``layer_distribution``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.debias import debias_weights
from lightning_mqgnn.sampling.exact import edge_weights
from lightning_mqgnn.sampling.successive import successive_sample


@dataclass
class LaplacianRows:
    """Rows ``L[prev, :]`` in COO form: every neighbour entry, then the self loops (not grouped)."""

    rows: Tensor  # int64 [nnz], position in prev
    cols: Tensor  # int64 [nnz], global node id
    values: Tensor  # float32 [nnz], L[prev[row], col]


@dataclass
class LayerDistribution:
    """Sampling distribution of one layer: ``p[i]`` for node ``support[i]``, normalised.

    ``cdf``, ``nnz`` and ``last`` (index of the last positive entry) are cached when the
    distribution is reused across batches, so a draw costs O(s log n) instead of O(n).
    """

    support: Tensor  # int64 global ids
    p: Tensor  # float64, sums to 1
    cdf: Tensor | None = None
    nnz: int | None = None
    last: int | None = None


class LayerwiseSampler:
    """Top-down layer-wise sampler over ``L``; ``samples`` are listed input layer first (like
    ``NeighborSampler``'s fan-outs), e.g. ``[1024, 512]`` = Chen et al.'s 512 with growth 2.

    ``flat``: probabilities ∝ column norms instead of squared norms (eq. 10). ``debias``: the
    recursive weights of eq. 13 instead of ``1/(s p)``. Blocks have ``dst_in_src=False``.
    """

    aggregation = "gcn"

    def __init__(self, graph: CSRGraph, samples: Sequence[int], flat: bool = False, debias: bool = False):
        samples = [int(s) for s in samples]
        if not samples or any(s <= 0 for s in samples):
            raise ValueError(f"{type(self).__name__}: samples must be positive counts, got {samples}")
        self.graph = graph
        self.samples = samples
        self.num_layers = len(samples)
        self.flat = bool(flat)
        self.debias = bool(debias)
        self._edge_w, self._self_w = edge_weights(graph, "gcn")  # L's off-diagonal and diagonal
        self._scratch: Tensor | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_scratch"] = None  # per-process scratch, rebuilt on first use
        return state

    def scratch(self) -> Tensor:
        """An all ``-1`` int64 [N] array, reused; callers restore every entry they set."""
        if self._scratch is None:
            self._scratch = torch.full((self.graph.num_nodes,), -1, dtype=torch.int64)
        return self._scratch

    def layer_distribution(self, prev: Tensor, lap: LaplacianRows) -> LayerDistribution:
        raise NotImplementedError

    def sample(self, seeds: Tensor) -> MiniBatch:
        seeds = seeds.to(torch.int64)
        if seeds.numel() == 0:
            raise ValueError(f"{type(self).__name__}.sample: seeds is empty")
        prev = seeds
        blocks: list[Block] = []
        for s in reversed(self.samples):  # top-down: output layer first
            lap = laplacian_rows(self.graph, prev, self._edge_w, self._self_w)
            dist = self.layer_distribution(prev, lap)
            pos = successive_sample(dist.p, s, cdf=dist.cdf, nnz=dist.nnz, last=dist.last)
            chosen, p_chosen = dist.support[pos], dist.p[pos]
            blocks.append(self._block(prev, lap, chosen, self.column_weights(p_chosen)))
            prev = chosen
        blocks.reverse()
        return MiniBatch(input_nodes=prev, output_nodes=seeds, blocks=blocks)

    def column_weights(self, p_chosen: Tensor) -> Tensor:
        """Importance weight of each drawn column, float64, in draw order."""
        if self.debias:
            return debias_weights(p_chosen, self.graph.num_nodes)  # eq. 13, n = len(p) = N
        return 1.0 / (p_chosen.numel() * p_chosen)  # eq. 8

    def _block(self, prev: Tensor, lap: LaplacianRows, chosen: Tensor, col_w: Tensor) -> Block:
        """``L[prev, chosen] · diag(col_w)`` as a CSR block over source positions in ``chosen``."""
        slot = self.scratch()
        slot.index_copy_(0, chosen, torch.arange(chosen.numel()))  # index_copy_/index_select: the
        local = slot.index_select(0, lap.cols)  # fast paths of scatter/gather (vs. tensor[idx])
        slot.index_fill_(0, chosen, -1)
        keep = (local >= 0).nonzero().squeeze(1)
        rows = lap.rows.index_select(0, keep)
        order = torch.sort(rows, stable=True).indices  # group by row: only the kept entries are sorted
        keep = keep.index_select(0, order)
        rows = rows.index_select(0, order)
        local = local.index_select(0, keep)
        weights = lap.values.index_select(0, keep).to(torch.float64) * col_w.index_select(0, local)
        indptr = torch.zeros(prev.numel() + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(rows, minlength=prev.numel()), 0, out=indptr[1:])
        return Block(
            num_dst=prev.numel(),
            num_src=chosen.numel(),
            indptr=indptr,
            indices=local,
            weights=weights.to(torch.float32),
            dst_in_src=False,
        )


def laplacian_rows(graph: CSRGraph, prev: Tensor, edge_w: Tensor, self_w: Tensor) -> LaplacianRows:
    """Rows of ``L`` for ``prev``: the CSR neighbour entries (grouped by row), then one self
    loop per row. Vectorised, no boolean masks over the edges."""
    starts = graph.indptr[prev]
    deg = graph.indptr[prev + 1] - starts
    total = int(deg.sum())
    first = torch.cumsum(deg, 0) - deg  # where each row's entries start in the output
    edge_pos = torch.arange(total) + torch.repeat_interleave(starts - first, deg, output_size=total)
    rows = torch.repeat_interleave(torch.arange(prev.numel()), deg, output_size=total)
    return LaplacianRows(
        rows=torch.cat([rows, torch.arange(prev.numel())]),
        cols=torch.cat([graph.indices.index_select(0, edge_pos), prev]),
        values=torch.cat([edge_w.index_select(0, edge_pos), self_w.index_select(0, prev)]),
    )


def normalise(pi: Tensor, who: str) -> Tensor:
    """``pi / sum(pi)``; ``pi`` has a positive entry whenever the rows it came from exist."""
    total = pi.sum()
    if not bool(total > 0):
        raise ValueError(f"{who}: sampling distribution has no positive mass (sum {float(total)})")
    return pi / total
