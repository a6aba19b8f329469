"""The top-down loop shared by the layer-wise samplers (FastGCN, LADIES; Chen et al. §2).

Every layer-wise sampler estimates ``L H`` with ``L = D^-1/2 (A+I) D^-1/2`` (paper §III-B). Going
down from the output layer: ``prev`` = the batch; per layer draw a node set ``S`` (successive
sampling, ``s = min(nnz(p), samples)``), emit the block ``L[prev, S] · diag(colweight(S))`` and
set ``prev = S``. ``colweight`` is ``1/(s p)`` (eq. 8) or, with ``debias``, the weights of eq. 13.
No row normalisation and no added batch nodes (Chen et al.); all-zero rows are allowed.

Subclasses implement two hooks: ``draw_layer``, one layer's draws (``sample`` calls it), and
``layer_distribution``, the exact law those draws follow (eq. 7-8; ``distribution`` exposes it
for checks). They are separate because a sampler may draw from the law without ever building it:
FastGCN's is global and precomputed, LADIES draws entries of ``L[prev, :]`` whose columns follow
eq. 7 and sums probabilities only for the columns drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.huge_pages import advise_huge_pages
from lightning_mqgnn.sampling.base import row_positions
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.debias import debias_weights
from lightning_mqgnn.sampling.exact import edge_weights


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
        advise_huge_pages(self._edge_w, self._self_w)
        self._scratch: Tensor | None = None
        self._bitmap: Tensor | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_scratch"] = state["_bitmap"] = None  # per-process scratch, rebuilt on first use
        return state

    def scratch(self) -> Tensor:
        """An all ``-1`` int64 [N] array, reused; callers restore every entry they set."""
        if self._scratch is None:
            self._scratch = torch.full((self.graph.num_nodes,), -1, dtype=torch.int64, device=self.device)
            advise_huge_pages(self._scratch)
        return self._scratch

    @property
    def device(self) -> torch.device:
        """Where the graph, and so every tensor this sampler makes, lives."""
        return self.graph.indptr.device

    def layer_distribution(self, prev: Tensor, cols: Tensor, values: Tensor) -> LayerDistribution:
        """Hook: the distribution of the layer below ``prev``, from the entries of ``L[prev, :]``
        (their columns and values, in any order)."""
        raise NotImplementedError(f"{type(self).__name__} must implement layer_distribution")

    def draw_layer(self, prev: Tensor, rows: RowEntries, s: int) -> LayerDraw:
        """Hook: ``s`` successive draws (without replacement) from ``layer_distribution`` of
        ``prev``, and the entries of ``rows`` they keep (``keep``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement draw_layer")

    def distribution(self, prev: Tensor) -> LayerDistribution:
        """``layer_distribution`` of the rows ``prev``."""
        rows = row_entries(self.graph, prev)
        return self.layer_distribution(prev, rows.cols, self.entry_values(prev, rows))

    def sample(self, seeds: Tensor) -> MiniBatch:
        seeds = seeds.to(torch.int64)
        if seeds.numel() == 0:
            raise ValueError(f"{type(self).__name__}.sample: seeds is empty")
        prev = seeds
        blocks: list[Block] = []
        layers = [seeds]
        for s in reversed(self.samples):  # top-down: output layer first
            rows = row_entries(self.graph, prev)
            draw = self.draw_layer(prev, rows, s)
            blocks.append(self._block(rows, draw))
            prev = draw.chosen
            layers.append(prev)
        blocks.reverse()
        layers.reverse()
        # the global ids of every layer's nodes, which the blocks (not a source prefix of each
        # other) do not give: what removing an edge seed's own edges reads (``edge_seeds``)
        return MiniBatch(input_nodes=prev, output_nodes=seeds, blocks=blocks, meta={"layer_nodes": layers})

    def keep(self, prev: Tensor, rows: RowEntries, chosen: Tensor, p_chosen: Tensor) -> LayerDraw:
        """The ``LayerDraw`` of ``chosen``: its kept entries of ``rows`` and their values."""
        kept, local = self.kept_entries(chosen, rows.cols)
        return LayerDraw(chosen, p_chosen, kept, local, self.entry_values(prev, rows, kept))

    def entry_values(self, prev: Tensor, rows: RowEntries, entries: Tensor | None = None) -> Tensor:
        """``L`` at ``entries`` of ``rows`` (all of them when None), float32."""
        if entries is None:
            values = self._edge_values(rows.edge_pos)
            values[rows.ends - 1] = self._self_w.index_select(0, prev)
            return values
        row = torch.searchsorted(rows.ends, entries, right=True)
        values = self._edge_values(rows.edge_pos.index_select(0, entries))
        is_self = entries == rows.ends.index_select(0, row) - 1
        # a select over every entry, not an index of the self loops: no wait for their count
        return torch.where(is_self, self._self_w.index_select(0, prev.index_select(0, row)), values)

    def positions_in(self, chosen: Tensor, cols: Tensor) -> Tensor:
        """Position of each ``cols`` entry in ``chosen`` (distinct ids), -1 if absent; O(len(cols))."""
        slot = self.scratch()
        slot.scatter_(0, chosen, torch.arange(chosen.numel(), device=chosen.device))
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
        member = words.index_select(0, cols >> 6).bitwise_right_shift_(cols & 63).bitwise_and_(1)
        words.scatter_(0, word, 0)
        kept = member.nonzero().squeeze(1)
        return kept, self.positions_in(chosen, cols.index_select(0, kept))

    def bitmap(self) -> Tensor:
        """An all-zero int64 array of ``ceil(N / 64)`` words, reused; callers clear what they set."""
        if self._bitmap is None:
            self._bitmap = torch.zeros(
                (self.graph.num_nodes + 63) // 64, dtype=torch.int64, device=self.device
            )
        return self._bitmap

    def column_weights(self, p_chosen: Tensor) -> Tensor:
        """Importance weight of each drawn column, float64, in draw order."""
        if self.debias:
            return debias_weights(p_chosen, self.graph.num_nodes)  # eq. 13, n = len(p) = N
        return 1.0 / (p_chosen.numel() * p_chosen)  # eq. 8

    def _edge_values(self, edge_pos: Tensor) -> Tensor:
        if self._edge_w.numel() == 0:  # an edgeless graph: every entry is a self loop (edge_pos 0)
            return torch.zeros(edge_pos.numel(), dtype=torch.float32, device=edge_pos.device)
        return self._edge_w.index_select(0, edge_pos)

    def _block(self, rows: RowEntries, draw: LayerDraw) -> Block:
        """``L[prev, chosen] · diag(col_w)`` as a CSR block over source positions in ``chosen``.

        The kept entries are ascending, so already grouped by row in CSR order (self loop last):
        a row's slice ends where its entries end."""
        indptr = torch.zeros(rows.ends.numel() + 1, dtype=torch.int64, device=rows.ends.device)
        torch.searchsorted(draw.kept, rows.ends, out=indptr[1:])
        col_w = self.column_weights(draw.p_chosen)
        return Block(
            num_dst=rows.ends.numel(),
            num_src=col_w.numel(),
            indptr=indptr,
            indices=draw.local,
            weights=(draw.values.to(torch.float64) * col_w.index_select(0, draw.local)).to(torch.float32),
            dst_in_src=False,
        )


@dataclass
class RowEntries:
    """Where the entries of ``L[prev, :]`` are, without their values: grouped by row, each row's
    neighbour entries in CSR order and then its self loop (at ``ends - 1``)."""

    edge_pos: Tensor  # int64 [E + R], position of each entry in graph.indices / edge weights; 0 at self loops
    cols: Tensor  # int64 [E + R], global column id of every entry
    ends: Tensor  # int64 [R], end of each row (cumulative degree + 1)


@dataclass
class LayerDraw:
    """A layer's draws: ``chosen`` (global ids, draw order) with their normalised probabilities,
    the entries of ``RowEntries`` in a drawn column (``kept``, ascending), each one's column
    position in ``chosen`` (``local``) and its value of ``L`` (float32)."""

    chosen: Tensor
    p_chosen: Tensor
    kept: Tensor
    local: Tensor
    values: Tensor


def row_entries(graph: CSRGraph, prev: Tensor) -> RowEntries:
    """The entries of ``L[prev, :]`` (see ``RowEntries``): three passes over E, no row vector."""
    starts = graph.indptr.index_select(0, prev)
    lengths = graph.indptr.index_select(0, prev + 1) - starts + 1  # + the self loop
    ends = torch.cumsum(lengths, 0)
    edge_pos = row_positions(starts, lengths)
    selfs = ends - 1
    edge_pos[selfs] = 0  # (the next row's first edge there, or one past the last edge)
    if graph.num_edges:
        cols = graph.indices.index_select(0, edge_pos)
        cols[selfs] = prev
    else:
        cols = prev.clone()
    return RowEntries(edge_pos=edge_pos, cols=cols, ends=ends)


def normalise(pi: Tensor, who: str) -> Tensor:
    """``pi / sum(pi)``; ``pi`` has a positive entry whenever the rows it came from exist."""
    total = pi.sum()
    if not bool(total > 0):
        raise ValueError(f"{who}: sampling distribution has no positive mass (sum {float(total)})")
    return pi / total
