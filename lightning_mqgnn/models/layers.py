"""Graph convolution layers on ``Block``s. Block edge weights carry all normalisation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_mqgnn.sampling.batch import Block


class GCNLayer(nn.Module):
    """``Z = P̂ H W`` (eq. 1, 18): weighted sum of transformed source rows.

    The linear map runs before the aggregation when it shrinks the width (fewer sparse flops),
    after it otherwise; both orders give the same result since both maps are linear.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, block: Block, h_src: Tensor, h_dst: Tensor | None = None) -> Tensor:
        if self.linear.out_features < self.linear.in_features:
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
        if self.neigh.out_features < self.neigh.in_features:
            agg = block.aggregate(self.neigh(h_src))
        else:
            agg = self.neigh(block.aggregate(h_src))
        return agg + self.self_(h_dst)


LAYERS = {"gcn": GCNLayer, "sage": SAGELayer}
