"""A full-batch graph auto-encoder in plain torch: the accuracy reference of ``bench link``.

Kipf & Welling's GAE (2016) with its encoder either GCN (``D^-1/2 (A+I) D^-1/2``, eq. 1-2) or
GraphSAGE-mean (``W_1 h_v + W_2 mean(h_u)``), two layers over the whole training graph as one
torch sparse matrix, ReLU and dropout between them; the dot-product decoder; per epoch one Adam
step on binary cross-entropy over every training edge and one negative per edge (its source
kept, its destination uniform, drawn anew each epoch). After every epoch the exact embeddings are
scored on the split's fixed pairs; the best validation Hits@K's epoch gives the test scores. No
sampling, no library beyond torch: what a sampled model of the same width should at least reach.

    python recipes/bench.py gae_reference --data cora --split split.npz --model gcn --epochs 300
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from benchmarks._link import LinkData, dot, finish, fit_link, link_arguments, load_link_data


def normalized_adjacency(data: LinkData, model: str) -> Tensor:
    """The training graph as a sparse CSR matrix whose row ``v`` aggregates ``v``'s neighbours:
    ``D^-1/2 (A+I) D^-1/2`` for GCN, ``D^-1 A`` (the mean) for SAGE."""
    src, dst = data.message_edges()
    n = data.split.num_nodes
    if model == "gcn":
        loops = torch.arange(n)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    degree = torch.zeros(n).index_add_(0, dst, torch.ones(dst.numel()))
    weight = degree.rsqrt()[src] * degree.rsqrt()[dst] if model == "gcn" else 1.0 / degree.clamp(min=1)[dst]
    coo = torch.sparse_coo_tensor(torch.stack([dst, src]), weight, (n, n), check_invariants=True).coalesce()
    return coo.to_sparse_csr()


class GAEEncoder(nn.Module):
    """Two (or more) full-graph GCN or SAGE layers, Glorot-initialised as the GAE's."""

    def __init__(self, model: str, in_dim: int, hidden: int, num_layers: int, dropout: float):
        super().__init__()
        dims = [in_dim] + [hidden] * num_layers
        self.model = model
        self.neigh = nn.ModuleList(nn.Linear(a, b, bias=model == "gcn") for a, b in zip(dims, dims[1:]))
        self.root = (
            nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:])) if model == "sage" else None
        )
        for layer in [*self.neigh, *(self.root or [])]:
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, adjacency: Tensor) -> Tensor:
        h = x
        for i, neigh in enumerate(self.neigh):
            # the linear map before the aggregation: it commutes with it, and narrows the rows first
            out = (
                adjacency @ neigh(h)
                if self.model == "sage"
                else adjacency @ (h @ neigh.weight.T) + neigh.bias
            )
            h = out + self.root[i](h) if self.root is not None else out
            if i < len(self.neigh) - 1:
                h = self.dropout(torch.relu(h))
        return h


def run_gae(data: LinkData, args: argparse.Namespace) -> dict:
    """Train and score the GAE (see the module's doc); the curve and the scores at its best epoch."""
    torch.manual_seed(args.seed)
    adjacency = normalized_adjacency(data, args.model)
    x = data.features
    net = GAEEncoder(args.model, x.shape[1], args.hidden, 2, args.dropout)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    src, dst = data.split.train
    n = data.split.num_nodes
    labels = torch.cat([torch.ones(src.numel()), torch.zeros(src.numel())])
    losses: list[float] = []

    def train_epoch() -> None:
        net.train()
        h = net(x, adjacency)
        neg_dst = torch.randint(0, n, (src.numel(),))
        logits = torch.cat([dot(h, src, dst), dot(h, src, neg_dst)])
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())

    @torch.no_grad()
    def embed() -> Tensor:
        net.eval()
        return net(x, adjacency)

    t_start = time.perf_counter()
    result = fit_link(train_epoch, embed, data.split, args.hits_k, args.epochs, args.max_time_s)
    return {"system": "gae", "total_time": time.perf_counter() - t_start, "losses": losses, **result}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    link_arguments(parser, batch=False)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return finish(run_gae(load_link_data(args.data, args.split), args), args)


if __name__ == "__main__":
    main(sys.argv[1:])
