"""LADIES (Zou et al. 2019) as calibrated by Chen et al. (TMLR): layer-dependent importance.

``p_j ∝ Σ_{i∈prev} L_ij²`` (eq. 7), or ``∝ sqrt`` of it with ``flat`` (eq. 10): only neighbours of
``prev`` and ``prev`` itself (the self loop) have mass, so the support is the union of their rows
(eq. 6). It is found in O(edges of prev) without a sort or a dense N-vector of probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_mqgnn.sampling.layerwise import LaplacianRows, LayerDistribution, LayerwiseSampler, normalise


class LADIESSampler(LayerwiseSampler):
    """LADIES / +flat / +debias / +flat+debias; ``samples`` input layer first."""

    def layer_distribution(self, prev: Tensor, lap: LaplacianRows) -> LayerDistribution:
        support, inverse = self._distinct(lap.cols)
        pi = torch.zeros(support.numel(), dtype=torch.float64)
        pi.index_add_(0, inverse, lap.values.to(torch.float64).square())  # eq. 7 numerator
        if self.flat:
            pi = pi.sqrt()  # eq. 10
        p = normalise(pi, f"LADIES layer over {prev.numel()} rows")
        # every support entry has mass: squares of positive L entries (no O(support) recount)
        return LayerDistribution(support=support, p=p, nnz=support.numel(), last=support.numel() - 1)

    def _distinct(self, cols: Tensor) -> tuple[Tensor, Tensor]:
        """``(support, inverse)`` with ``support[inverse] == cols``, via the scratch array.

        Every entry writes its own position; exactly one write per distinct id survives, and
        that entry becomes the representative. O(len(cols)), no sort.
        """
        slot = self.scratch()
        pos = torch.arange(cols.numel())
        slot.index_copy_(0, cols, pos)  # duplicates: one write per id survives
        support = cols[slot.index_select(0, cols) == pos]
        slot.index_copy_(0, support, torch.arange(support.numel()))
        inverse = slot.index_select(0, cols)
        slot.index_fill_(0, support, -1)
        return support, inverse
