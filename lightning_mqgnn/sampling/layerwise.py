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
from lightning_mqgnn.sampling.base import row_positions
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
        self._bitmap: Tensor | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_scratch"] = state["_bitmap"] = None  # per-process scratch, rebuilt on first use
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
            rows = row_entries(self.graph, prev)
            chosen, p_chosen, kept, local = self.draw_layer(prev, rows, s)
            blocks.append(self._block(prev, rows, kept, local, self.column_weights(p_chosen)))
            prev = chosen
        blocks.reverse()
        return MiniBatch(input_nodes=prev, output_nodes=seeds, blocks=blocks)

    def draw_layer(self, prev: Tensor, rows: RowEntries, s: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(chosen, p_chosen, kept, local)``: the successive draws (global ids, draw order),
        their normalised probabilities, and ``kept_entries`` of ``rows`` for them."""
        dist = self.layer_distribution(prev, laplacian_rows(self.graph, prev, self._edge_w, self._self_w))
        pos = successive_sample(dist.p, s, cdf=dist.cdf, nnz=dist.nnz, last=dist.last, slot=self.scratch())
        chosen = dist.support[pos]
        return chosen, dist.p[pos], *self.kept_entries(chosen, rows.cols)

    def positions_in(self, chosen: Tensor, cols: Tensor) -> Tensor:
        """Position of each ``cols`` entry in ``chosen`` (distinct ids), -1 if absent; O(len(cols))."""
        slot = self.scratch()
        slot.scatter_(0, chosen, torch.arange(chosen.numel()))
        local = slot.gather(0, cols)
        slot.scatter_(0, chosen, -1)
        return local

    def kept_entries(self, chosen: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
        """``(kept, local)``: the entries of ``cols`` whose column is in ``chosen`` (ascending) and
        that column's position in ``chosen``.

        Membership is tested in a bitmap of N bits (~125 KiB for 1M nodes: stays in L2 cache)
        rather than in the N-entry scratch (one cache miss per entry); only the kept entries read
        the scratch.
        """
        words = self.bitmap()
        word = chosen >> 6
        words.scatter_add_(0, word, torch.ones_like(chosen) << (chosen & 63))  # distinct ids: no carries
        member = (words.index_select(0, cols >> 6) >> (cols & 63)) & 1
        words.scatter_(0, word, 0)
        kept = member.nonzero().squeeze(1)
        return kept, self.positions_in(chosen, cols.index_select(0, kept))

    def bitmap(self) -> Tensor:
        """An all-zero int64 array of ``ceil(N / 64)`` words, reused; callers clear what they set."""
        if self._bitmap is None:
            self._bitmap = torch.zeros((self.graph.num_nodes + 63) // 64, dtype=torch.int64)
        return self._bitmap

    def column_weights(self, p_chosen: Tensor) -> Tensor:
        """Importance weight of each drawn column, float64, in draw order."""
        if self.debias:
            return debias_weights(p_chosen, self.graph.num_nodes)  # eq. 13, n = len(p) = N
        return 1.0 / (p_chosen.numel() * p_chosen)  # eq. 8

    def _block(self, prev: Tensor, rows: RowEntries, kept: Tensor, local: Tensor, col_w: Tensor) -> Block:
        """``L[prev, chosen] · diag(col_w)`` as a CSR block over source positions in ``chosen``.

        ``kept``: the entries of ``rows`` in a drawn column (ascending), ``local``: that column's
        position in ``chosen``. Rows stay in CSR order with the self loop last (no sort): a kept
        neighbour entry moves down by the kept self loops of earlier rows.
        """
        num_nb = rows.edge_pos.numel()
        split = int(torch.searchsorted(kept, num_nb))
        kept_nb, self_rows = kept[:split], kept[split:] - num_nb
        has_self = torch.zeros(prev.numel(), dtype=torch.int64)
        has_self[self_rows] = 1
        self_upto = torch.cumsum(has_self, 0)
        indptr = torch.zeros(prev.numel() + 1, dtype=torch.int64)
        torch.add(torch.searchsorted(kept_nb, rows.ends), self_upto, out=indptr[1:])
        row_of_nb = torch.searchsorted(rows.ends, kept_nb, right=True)
        at_nb = torch.arange(kept_nb.numel()) + (self_upto - has_self).index_select(0, row_of_nb)
        at_self = indptr.index_select(0, self_rows + 1) - 1
        values = torch.empty(kept.numel(), dtype=torch.float32)
        values[at_nb] = self._edge_w.index_select(0, rows.edge_pos.index_select(0, kept_nb))
        values[at_self] = self._self_w.index_select(0, prev.index_select(0, self_rows))
        indices = torch.empty(kept.numel(), dtype=torch.int64)
        indices[at_nb] = local[:split]
        indices[at_self] = local[split:]
        weights = values.to(torch.float64) * col_w.index_select(0, indices)
        return Block(
            num_dst=prev.numel(),
            num_src=col_w.numel(),
            indptr=indptr,
            indices=indices,
            weights=weights.to(torch.float32),
            dst_in_src=False,
        )


@dataclass
class RowEntries:
    """Where the entries of ``L[prev, :]`` are, without their values: the neighbour entries of
    each row in CSR order, then one self loop per row (the last ``len(prev)`` columns)."""

    edge_pos: Tensor  # int64 [E], position of each neighbour entry in graph.indices / edge weights
    cols: Tensor  # int64 [E + len(prev)], global column id of every entry
    ends: Tensor  # int64 [len(prev)], end of each row's neighbour entries (cumulative degree)


def row_entries(graph: CSRGraph, prev: Tensor) -> RowEntries:
    """The entries of ``L[prev, :]`` (see ``RowEntries``): three passes over E, no row vector."""
    starts = graph.indptr.index_select(0, prev)
    deg = graph.indptr.index_select(0, prev + 1) - starts
    ends = torch.cumsum(deg, 0)
    total = int(ends[-1])
    edge_pos = segment_positions(starts, deg, ends, total)
    cols = torch.empty(total + prev.numel(), dtype=torch.int64)
    torch.index_select(graph.indices, 0, edge_pos, out=cols[:total])
    cols[total:] = prev
    return RowEntries(edge_pos=edge_pos, cols=cols, ends=ends)


def segment_positions(starts: Tensor, lengths: Tensor, ends: Tensor, total: int) -> Tensor:
    """``cat([arange(a, a + n) for a, n in zip(starts, lengths)])`` as one cumulative sum.

    Steps are 1 except where a segment begins: there the step jumps from the previous segment's
    last value to its start. Empty segments add jumps that cancel out (they telescope).
    """
    step = torch.ones(total, dtype=torch.int64)
    if total == 0:
        return step
    first = ends - lengths
    prev_stop = torch.cat([starts.new_ones(1), (starts + lengths)[:-1]])  # virtual segment [0, 1)
    inside = (first < total).nonzero().squeeze(1)
    step.index_add_(0, first.index_select(0, inside), (starts - prev_stop).index_select(0, inside))
    return step.cumsum_(0)


def laplacian_rows(graph: CSRGraph, prev: Tensor, edge_w: Tensor, self_w: Tensor) -> LaplacianRows:
    """Rows of ``L`` for ``prev``: the CSR neighbour entries (grouped by row), then one self
    loop per row. Vectorised, no boolean masks over the edges."""
    starts = graph.indptr[prev]
    deg = graph.indptr[prev + 1] - starts
    edge_pos = row_positions(starts, deg)
    rows = torch.repeat_interleave(torch.arange(prev.numel()), deg, output_size=edge_pos.numel())
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
