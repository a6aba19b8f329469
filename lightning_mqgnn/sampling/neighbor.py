"""Node-wise uniform neighbour sampling for GCN and GraphSAGE (paper eq. 1-3, 17).

With replacement each draw is ``indptr[v] + floor(u * deg)``, vectorised over the frontier;
without replacement a row with at most ``k`` edges keeps them all and every other row draws a
uniform ``k``-subset of its edges by Floyd's algorithm: on the CPU in one compiled pass over the
rows (``cpu_kernels.floyd_positions``), on a GPU in ``k`` vectorised steps (no sort).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.mapped_pages import prefetch_rows
from lightning_mqgnn.sampling.base import Relabeler, row_positions, sample_top_down
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.cpu_kernels import floyd_positions
from lightning_mqgnn.sampling.exact import AGGREGATIONS, gcn_norm
from lightning_mqgnn.sampling.rng import sampling_generator


def sample_neighbor_edges(
    graph: CSRGraph, nodes: Tensor, fanout: int, replace: bool
) -> tuple[Tensor, Tensor]:
    """Draw up to ``fanout`` in-edges per node. Returns ``(counts, edge_pos)``: edges drawn per
    node and their CSR positions, grouped by node in input order. ``fanout < 0`` takes all."""
    if fanout > 0 and not replace and not nodes.is_cuda:
        return floyd_positions(graph.indptr, nodes.contiguous(), fanout, sampling_generator())
    starts = graph.indptr.index_select(0, nodes)
    deg = graph.indptr.index_select(0, nodes + 1) - starts
    device = starts.device
    if fanout < 0:
        counts = deg
        return counts, row_positions(starts, counts)
    if replace:
        counts = torch.where(deg > 0, torch.full_like(deg, fanout), torch.zeros_like(deg))
        rows = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), counts)
        u = torch.rand(rows.numel(), dtype=torch.float64, device=device, generator=sampling_generator())
        offset = (u * deg.index_select(0, rows)).long()
        return counts, starts.index_select(0, rows) + offset
    counts = deg.clamp(max=fanout)
    return counts, subset_positions_padded(starts, deg, counts, fanout)


def subset_positions_padded(starts: Tensor, deg: Tensor, counts: Tensor, k: int) -> Tensor:
    """``sample_neighbor_edges`` without replacement as a GPU wants it: one host read (the total).
    Every row is laid out as ``k`` slots: a row with at most ``k`` edges takes
    offsets ``0 .. deg - 1``, every other row a uniform ``k``-subset of its offsets (Floyd's, drawn
    for all rows); slots past a row's count are written to one spare entry past the end, which is
    dropped. Same law as the CPU path, other draws."""
    device = starts.device
    total = int(counts.sum())
    slot = torch.arange(k, device=device)
    drawn = uniform_subsets(torch.clamp(deg, min=k), k)  # [R, k]; rows with deg <= k: unused
    offsets = torch.where((deg <= k).unsqueeze(1), slot, drawn)
    out_start = torch.cumsum(counts, 0) - counts
    target = torch.where(slot < counts.unsqueeze(1), out_start.unsqueeze(1) + slot, total)
    out = torch.empty(total + 1, dtype=torch.int64, device=device)
    out.index_copy_(0, target.reshape(-1), (starts.unsqueeze(1) + offsets).reshape(-1))
    return out[:total]


def uniform_subsets(n: Tensor, k: int) -> Tensor:
    """A uniform ``k``-subset of ``[0, n_r)`` for every row r (``n_r >= k``), as ``[R, k]`` offsets.

    Floyd's algorithm (Bentley & Floyd 1987), one vectorised step per element: for
    ``j = n - k, ..., n - 1`` draw ``t`` uniform in ``[0, j]`` and add ``t``, or ``j`` when ``t``
    is already in. Every subset comes out with probability ``1 / C(n, k)``, without rejection and
    without touching the row's other offsets.
    """
    # all k draws at once, step-major: on the CPU the same stream as one draw per step
    j = (n - k).unsqueeze(0) + torch.arange(k, device=n.device).unsqueeze(1)  # [k, R]
    draws = torch.rand(k, n.numel(), dtype=torch.float64, device=n.device, generator=sampling_generator())
    chosen = (draws * (j + 1)).long()
    steps, j_steps = chosen.unbind(0), j.unbind(0)  # views taken once: on a GPU each op is a launch
    for step in range(1, k):
        taken = (chosen[:step] == steps[step]).any(0)
        torch.where(taken, j_steps[step], steps[step], out=steps[step])
    return chosen.t()


def sampled_block(
    num_src: int, counts: Tensor, local: Tensor, weights: Tensor, self_weights: Tensor | None = None
) -> Block:
    """A node-wise layer's block: row v holds its ``counts[v]`` sampled edges (source-local ids
    ``local``, grouped by row), preceded by its self loop when ``self_weights`` is given (GCN's
    exact diagonal 1/d̂_v, eq. 2). Destinations are the first ``len(counts)`` sources."""
    num_dst = counts.numel()
    device = counts.device
    row_len = counts if self_weights is None else counts + 1
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=device)
    torch.cumsum(row_len, 0, out=indptr[1:])
    if self_weights is None:
        indices, w = local, weights
    else:
        nbr_pos = row_positions(indptr[:-1] + 1, counts, total=local.numel())
        total = local.numel() + num_dst  # = indptr[-1], known without reading the device
        indices = torch.empty(total, dtype=torch.int64, device=device)
        w = torch.empty(total, dtype=torch.float64, device=device)
        indices[indptr[:-1]] = torch.arange(num_dst, device=device)
        w[indptr[:-1]] = self_weights.to(torch.float64)
        indices[nbr_pos] = local
        w[nbr_pos] = weights
    return Block(num_dst, num_src, indptr, indices, w.to(torch.float32), dst_in_src=True)


NORMALIZATIONS = ("graph", "block")


def block_normalization(block: Block) -> Tensor:
    """``1 / sqrt(d_v d_u)`` for every entry (v, u) of ``block``: eq. 2's symmetric normalisation
    of the sampled block, d_v its row's entries and d_u the entries naming source u."""
    d_dst = (block.indptr[1:] - block.indptr[:-1]).to(torch.float32)
    d_src = torch.bincount(block.indices, minlength=block.num_src).to(torch.float32)
    return torch.rsqrt(d_dst.index_select(0, block.dst_ids()) * d_src.index_select(0, block.indices))


class NeighborSampler:
    """Uniform node-wise sampler with per-layer fan-outs (paper: 5 per layer).

    ``aggregation="gcn"``, ``normalization="graph"``: block weights make ``Σ_e w_e h_src`` an
    unbiased estimate of row v of P H with P = D̂^-1/2 Â D̂^-1/2 (eq. 2-3): the self loop keeps its
    exact weight 1/d̂_v and each sampled neighbour u gets (deg_v / s_v) · P_vu.
    ``normalization="block"``: eq. 2's normalisation applied to the sampled block itself, self
    loops included, ``w_vu = 1 / sqrt(d_v d_u)`` with d_v the row's entries and d_u the entries
    naming source u (as DGL's ``GraphConv(norm="both")`` on a block): biased, but with far less
    variance, so it trains faster. ``aggregation="mean"``: weight 1/s_v, an unbiased estimate of
    the neighbour mean of eq. 17 (the self term is read from the prefix).
    ``fanouts`` are listed input layer first, as in DGL; -1 takes every neighbour.
    """

    def __init__(
        self,
        graph: CSRGraph,
        fanouts: list[int],
        aggregation: str = "mean",
        replace: bool = False,
        normalization: str = "graph",
    ):
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")
        if normalization == "block" and aggregation != "gcn":
            raise ValueError(f"normalization='block' is GCN's; aggregation {aggregation!r} has none")
        if not fanouts or any(f == 0 or f < -1 for f in fanouts):
            raise ValueError(f"fanouts must be positive (or -1 for all), got {list(fanouts)}")
        self.graph = graph
        self.fanouts = [int(f) for f in fanouts]
        self.aggregation = aggregation
        self.replace = replace
        self.normalization = normalization
        self.num_layers = len(fanouts)
        self._norm = gcn_norm(graph) if aggregation == "gcn" and normalization == "graph" else None
        self._relabel = Relabeler(graph.num_nodes)

    def sample(self, seeds: Tensor) -> MiniBatch:
        return sample_top_down(seeds, self.fanouts, self._sample_layer)

    def _sample_layer(self, dst: Tensor, fanout: int) -> tuple[Block, Tensor]:
        g = self.graph
        prefetch_rows(g.indptr, dst)  # a graph on disk: its reads of this layer in flight together
        counts, edge_pos = sample_neighbor_edges(g, dst, fanout, self.replace)
        prefetch_rows(g.indices, edge_pos)
        nbrs = g.indices.index_select(0, edge_pos)
        src_nodes, local = self._relabel(dst, nbrs)
        rows = torch.repeat_interleave(
            torch.arange(dst.numel(), device=dst.device), counts, output_size=nbrs.numel()
        )  # (the size given: no wait for the device to count it)
        row_counts = counts.index_select(0, rows).to(torch.float64)
        if self.aggregation == "mean":
            return sampled_block(src_nodes.numel(), counts, local, 1.0 / row_counts), src_nodes
        if self.normalization == "block":
            ones = torch.ones(local.numel(), dtype=torch.float64, device=dst.device)
            block = sampled_block(
                src_nodes.numel(),
                counts,
                local,
                ones,
                self_weights=torch.ones(dst.numel(), device=dst.device),
            )
            block.weights = block_normalization(block)
            return block, src_nodes
        deg = (g.indptr.index_select(0, dst + 1) - g.indptr.index_select(0, dst)).to(torch.float64)
        scale = deg.index_select(0, rows) / row_counts  # deg_v / s_v (HT factor, eq. 3)
        norm = self._norm
        w = scale * norm.index_select(0, dst).index_select(0, rows) * norm.index_select(0, nbrs)
        return sampled_block(
            src_nodes.numel(), counts, local, w, self_weights=norm.index_select(0, dst) ** 2
        ), src_nodes
