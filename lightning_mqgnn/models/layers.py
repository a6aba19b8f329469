"""Graph convolution layers on ``Block``s. Block edge weights carry all normalisation."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_mqgnn.models.activated_aggregation import activated_aggregate
from lightning_mqgnn.sampling.aggregate import row_sum
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


def unbiased_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x Wᵀ`` for a dense or a sparse CSR ``x``. A CSR ``x`` goes as ``embedding_bag``'s sums
    of ``Wᵀ``'s rows weighted by each row's non-zeros: on citeseer's 3327 x 1024 bag-of-words
    features times 1024 x 512, 3.7 ms against 6.2 ms for torch's CSR product, and 4.4 ms against
    15.8 ms in a process's first call (2-core VM, medians of 30)."""
    if x.layout != torch.sparse_csr:
        return F.linear(x, weight)
    return row_sum(x.col_indices(), weight.t().contiguous(), x.crow_indices(), x.values())


class GCNLayer(nn.Module):
    """``Z = P̂ H W + b`` (eq. 1, 18): weighted sum of transformed source rows, in the cheaper order
    (``transform_first``); aggregating first folds the bias into the GEMM (``addmm``).

    ``glorot``: ``W`` starts Glorot-uniform (Glorot & Bengio 2010, eq. 16), as in Kipf &
    Welling's GCN and DGL's ``GraphConv``, which the paper's baselines use; else with
    ``nn.Linear``'s initialisation, whose range is narrower (2.4x for 256 -> 10 classes). ``b``
    starts at zero. Which trains better depends on the sampler (BENCHMARKS.md: Glorot for
    node-wise GCN and LADIES, ``nn.Linear``'s for FastGCN).
    """

    def __init__(self, in_dim: int, out_dim: int, glorot: bool = True):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        if glorot:
            nn.init.xavier_uniform_(self.linear.weight)

    def forward(
        self, block: Block, h_src: Tensor, h_dst: Tensor | None = None, activation: nn.Module | None = None
    ) -> Tensor:
        """``activation``: applied to ``h_src`` first (the previous layer's ReLU + dropout), fused
        with the aggregation where this layer aggregates first (``activated_aggregate``)."""
        if transform_first(block, self.linear.in_features, self.linear.out_features):
            if activation is not None:
                h_src = activation(h_src)
            return block.aggregate(self.linear(h_src)).add_(self.bias)
        return self.transform(activated_aggregate(block, h_src, activation))

    def transform(self, aggregated: Tensor) -> Tensor:
        """The layer after its aggregation: ``(P̂ H) W + b`` from ``P̂ H`` (``MiniBatch.aggregated``)."""
        return F.linear(aggregated, self.linear.weight, self.bias)

    def project(self, x: Tensor) -> Tensor:
        """``X W`` for every row of ``X``, which may be a sparse CSR matrix (its product then costs
        its non-zeros, not its width): the inputs of ``from_projected``."""
        return unbiased_linear(x, self.linear.weight)

    def from_projected(self, block: Block, projected: Tensor, dst: Tensor) -> Tensor:
        """The layer's output for ``block``'s destinations from ``project``'s rows of its sources:
        ``P̂ (X W) + b``, the transform-first order of ``forward``. ``dst`` (the destinations'
        rows of ``projected``) is not read: the block holds them."""
        return block.aggregate(projected).add_(self.bias)


class SAGELayer(nn.Module):
    """GraphSAGE-mean: ``[mean_{u in N(v)} h_u, h_v] W`` (eq. 17), with ``W`` kept as two linear maps.

    Self features are ``h_dst`` when given (inference over global ids), else the first
    ``num_dst`` source rows (node-wise blocks keep destinations as a source prefix). Aggregating
    first, the two halves run as one GEMM on ``[A H, H_dst]`` with the bias folded in; transforming
    first, the neighbour half is added into the self half's GEMM.

    ``glorot``: both halves start Glorot-uniform with ReLU's gain (Glorot & Bengio 2010, eq. 16,
    scaled by sqrt(2)) and the bias at zero, as DGL's ``SAGEConv``; else (the default) with
    ``nn.Linear``'s initialisation, whose range is narrower (3.4x for 6,805 -> 256). On wide
    bag-of-words inputs Glorot's start reaches DGL's accuracy in about half the steps, but on
    citeseer (120 training nodes) it lowers the test accuracy by 1.3 points (BENCHMARKS.md).
    """

    def __init__(self, in_dim: int, out_dim: int, glorot: bool = False):
        super().__init__()
        self.neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.self_ = nn.Linear(in_dim, out_dim)
        if glorot:
            gain = nn.init.calculate_gain("relu")
            nn.init.xavier_uniform_(self.neigh.weight, gain=gain)
            nn.init.xavier_uniform_(self.self_.weight, gain=gain)
            nn.init.zeros_(self.self_.bias)

    def forward(
        self, block: Block, h_src: Tensor, h_dst: Tensor | None = None, activation: nn.Module | None = None
    ) -> Tensor:
        """``activation``: applied to the inputs first (the previous layer's ReLU + dropout), fused
        with the aggregation where this layer aggregates first and takes its self rows from
        ``h_src`` (``activated_aggregate``)."""
        if h_dst is None and not block.dst_in_src:
            raise ValueError("SAGELayer needs destination features: block.dst_in_src is False")
        first = transform_first(block, self.neigh.in_features, self.neigh.out_features)
        if h_dst is None and not first:
            return self.transform(activated_aggregate(block, h_src, activation, with_self=True))
        if activation is not None:
            h_src = activation(h_src)
            h_dst = None if h_dst is None else activation(h_dst)
        if first:
            if h_dst is None:
                h_dst = h_src[: block.num_dst]
            agg = block.aggregate(self.neigh(h_src)).add_(self.self_.bias)
            return torch.addmm(agg, h_dst, self.self_.weight.t())
        return self.transform(torch.cat([block.aggregate(h_src), h_dst], 1))

    def transform(self, aggregated: Tensor) -> Tensor:
        """The layer after its aggregation: one GEMM on ``[A H, H_dst]`` (``MiniBatch.aggregated``)."""
        if aggregated.shape[1] != 2 * self.neigh.in_features:
            raise ValueError(
                f"SAGELayer needs [A H, H_dst] ({2 * self.neigh.in_features} columns), got "
                f"{aggregated.shape[1]}: destinations must be a source prefix (dst_in_src)"
            )
        weight = torch.cat([self.neigh.weight, self.self_.weight], 1)
        return F.linear(aggregated, weight, self.self_.bias)

    def project(self, x: Tensor) -> Tensor:
        """``[X W_neigh, X W_self]`` for every row of ``X``, which may be a sparse CSR matrix (its
        product then costs its non-zeros, not its width): the inputs of ``from_projected``."""
        return unbiased_linear(x, torch.cat([self.neigh.weight, self.self_.weight]))

    def from_projected(self, block: Block, projected: Tensor, dst: Tensor) -> Tensor:
        """The layer's output for ``block``'s destinations, at rows ``dst`` of ``projected``, from
        ``project``'s rows of its sources: ``A (X W_neigh) + X_dst W_self + b``, the transform-first
        order of ``forward``."""
        width = self.neigh.out_features
        out = block.aggregate(projected[:, :width].contiguous())
        return out.add_(projected[dst, width:]).add_(self.self_.bias)


LAYERS = {"gcn": GCNLayer, "sage": SAGELayer}


def layer_dims(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[int]:
    """Widths of a stack of ``num_layers`` layers: ``in_dim``, ``hidden`` between them, ``out_dim``."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return [in_dim] + [hidden] * (num_layers - 1) + [out_dim]


def layer_stack(
    conv: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, glorot: bool | None = None
) -> list[nn.Module]:
    """``num_layers`` layers of ``LAYERS[conv]`` (GCN or SAGE) over ``layer_dims``;
    ``glorot``: the layers' ``glorot``, None for each layer kind's default."""
    if conv not in LAYERS:
        raise ValueError(f"unknown conv {conv!r}; expected one of {sorted(LAYERS)}")
    dims = layer_dims(in_dim, hidden, out_dim, num_layers)
    init = {} if glorot is None else {"glorot": glorot}
    return [LAYERS[conv](a, b, **init) for a, b in zip(dims[:-1], dims[1:])]
