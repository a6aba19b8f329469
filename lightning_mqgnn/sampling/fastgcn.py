"""FastGCN (Chen et al. 2018) as calibrated by Chen et al. (TMLR): one global distribution.

``p_j ∝ Σ_i L_ij²`` (squared column norm of the whole ``L``), or ``∝ ‖L[:, j]‖`` with ``flat``
(eq. 10). Every layer draws from the same ``p``, independently of the rows above it, so blocks
may have all-zero rows; the self loop keeps every column's mass positive (isolated nodes too).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.layerwise import (
    LayerDistribution,
    LayerDraw,
    LayerwiseSampler,
    RowEntries,
    normalise,
)
from lightning_mqgnn.sampling.successive import GuidedCDF, successive_sample


def fastgcn_probabilities(graph: CSRGraph, edge_w: Tensor, self_w: Tensor, flat: bool) -> Tensor:
    """Global FastGCN distribution over all N nodes (float64)."""
    pi = self_w.to(torch.float64).square()  # L_jj²
    pi.index_add_(0, graph.indices, edge_w.to(torch.float64).square())  # Σ_{i: j in row i} L_ij²
    if flat:
        pi = pi.sqrt()  # column norm, eq. 10
    return normalise(pi, f"FastGCN on a graph of {graph.num_nodes} nodes")


class FastGCNSampler(LayerwiseSampler):
    """FastGCN / +flat / +debias / +flat+debias; ``samples`` input layer first."""

    def __init__(self, graph: CSRGraph, samples: Sequence[int], flat: bool = False, debias: bool = False):
        super().__init__(graph, samples, flat=flat, debias=debias)
        p = fastgcn_probabilities(graph, self._edge_w, self._self_w, self.flat)
        positive = (p > 0).nonzero()
        self._dist = LayerDistribution(
            support=torch.arange(graph.num_nodes),
            p=p,
            cdf=torch.cumsum(p, 0),
            nnz=positive.numel(),
            last=int(positive[-1]),
        )
        self._table = GuidedCDF(self._dist.cdf, self._dist.last)

    def layer_distribution(self, prev: Tensor, cols: Tensor, values: Tensor) -> LayerDistribution:
        return self._dist

    def draw_layer(self, prev: Tensor, rows: RowEntries, s: int) -> LayerDraw:
        """Draws need no rows of ``L`` (the distribution is global): only the block does."""
        d = self._dist
        chosen = successive_sample(d.p, s, nnz=d.nnz, last=d.last, slot=self.scratch(), table=self._table)
        return self.keep(prev, rows, chosen, d.p.index_select(0, chosen))
