"""GCNII (Chen et al., "Simple and Deep Graph Convolutional Networks", ICML 2020): a GCN layer with
an initial residual and an identity mapping, which keeps 16-64-layer models from over-smoothing."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_mqgnn.sampling.batch import Block


def identity_mapping_strength(theta: float, layer: int) -> float:
    """β_l = ln(θ / l + 1) for the ``layer``-th convolution (1-based), eq. 6 of the paper: deeper
    layers keep more of the identity, so stacking them stays close to the shallow model."""
    if layer < 1:
        raise ValueError(f"GCNII layers are numbered from 1, got {layer}")
    return math.log(theta / layer + 1.0)


class GCNIILayer(nn.Module):
    """``H' = ((1 - α) P̃ H + α H0) ((1 - β) I + β W)`` (eq. 5, without the activation): the
    aggregated rows mixed with the initial representation ``H0`` (initial residual, weight α),
    then a linear map pulled towards the identity (identity mapping, weight β)."""

    def __init__(self, dim: int, alpha: float, beta: float):
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"GCNII alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.beta = beta
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, block: Block, h_src: Tensor, h0_dst: Tensor) -> Tensor:
        support = torch.lerp(block.aggregate(h_src), h0_dst, self.alpha)
        return torch.addmm(support, support, self.weight, beta=1.0 - self.beta, alpha=self.beta)
