"""Graph convolution layers on ``Block``s. Block edge weights carry all normalisation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_mqgnn.sampling.batch import Block


def transform_first(block: Block, in_dim: int, out_dim: int) -> bool:
    """Whether ``A (H W)`` costs fewer multiply-adds than ``(A H) W`` on this block.

    Both orders give the same result (both maps are linear). Transforming first maps every
    *source* row, aggregating first only the *destination* rows: on a sampled block with 5x more
    sources than destinations that decides more than the widths do (SAGE 100 -> 64 on a
    products-like batch: 205M vs 39M multiply-adds, forward alone).
    """
    transform = block.num_src * in_dim * out_dim + block.num_edges * out_dim
    aggregate = block.num_edges * in_dim + block.num_dst * in_dim * out_dim
    return transform < aggregate


class GCNLayer(nn.Module):
    """``Z = P̂ H W`` (eq. 1, 18): weighted sum of transformed source rows, in the cheaper order
    (``transform_first``)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, block: Block, h_src: Tensor, h_dst: Tensor | None = None) -> Tensor:
        if transform_first(block, self.linear.in_features, self.linear.out_features):
            return block.aggregate(self.linear(h_src)) + self.bias
        return self.linear(block.aggregate(h_src)) + self.bias


class SAGELayer(nn.Module):
    """GraphSAGE-mean: ``[mean_{u in N(v)} h_u, h_v] W`` (eq. 17), as two linear maps.

    Self features are ``h_dst`` when given (inference over global ids), else the first
    ``num_dst`` source rows (node-wise blocks keep destinations as a source prefix).
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.self_ = nn.Linear(in_dim, out_dim)

    def forward(self, block: Block, h_src: Tensor, h_dst: Tensor | None = None) -> Tensor:
        if h_dst is None:
            if not block.dst_in_src:
                raise ValueError("SAGELayer needs destination features: block.dst_in_src is False")
            h_dst = h_src[: block.num_dst]
        if transform_first(block, self.neigh.in_features, self.neigh.out_features):
            agg = block.aggregate(self.neigh(h_src))
        else:
            agg = self.neigh(block.aggregate(h_src))
        return agg + self.self_(h_dst)


LAYERS = {"gcn": GCNLayer, "sage": SAGELayer}
