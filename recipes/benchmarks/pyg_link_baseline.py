"""PyG's link-prediction loop, a speed baseline of ``bench link``: ``LinkNeighborLoader`` with
binary negative sampling and a 2-layer ``torch_geometric.nn`` encoder.

Batches of training edges (``--batch-size`` positives, one negative each: ``neg_sampling_ratio=1``,
PyG drawing both endpoints of a negative uniformly) sample their endpoints' neighbourhoods over
the training graph. ``LinkNeighborLoader`` has no ``exclude``: the loop drops a batch's positive
edges, both directions, from its sampled subgraph itself, so no message carries the label it is
scored on (as DGL's ``exclude="reverse_id"`` and the recipe's ``exclude=reverse``). GraphSAGE-mean
or GCN (``GCNConv`` normalising each subgraph with self loops), ReLU and dropout between layers,
dot-product decoder, binary cross-entropy, Adam; after every epoch exact full-graph inference
(``transposed_adjacency``) scores the split's fixed pairs. ``LinkNeighborLoader`` samples with
pyg-lib or torch-sparse: the PyG environment (``bash .ci/pyg_env.sh``).

    .venv-pyg/bin/python recipes/bench.py pyg_link_baseline --data cora --split split.npz --epochs 20
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from benchmarks._baseline import trimmed_mean
from benchmarks._link import LinkData, dot, finish, fit_link, link_arguments, load_link_data
from benchmarks.pyg_baseline import PyGNet, require_neighbor_sampling, transposed_adjacency


def without_positives(edge_index: Tensor, pairs: Tensor, labels: Tensor, num_nodes: int) -> Tensor:
    """``edge_index`` of a sampled subgraph (local ids) without the edges of its positive
    ``pairs`` (``labels`` 1), in either direction."""
    src, dst = pairs[:, labels > 0]
    seeds = torch.cat([src * num_nodes + dst, dst * num_nodes + src])
    return edge_index[:, ~torch.isin(edge_index[0] * num_nodes + edge_index[1], seeds)]


def run_pyg_link(data: LinkData, args: argparse.Namespace) -> dict:
    """Train with PyG's edge loader and layers (see the module's doc); the curve and the scores
    at the best-validation epoch."""
    require_neighbor_sampling()
    from torch_geometric.data import Data
    from torch_geometric.loader import LinkNeighborLoader

    torch.manual_seed(args.seed)  # the loader's shuffle, its negatives and its sampling draw from it
    src, dst = data.message_edges()
    graph = Data(x=data.features, edge_index=torch.stack([src, dst]), num_nodes=data.split.num_nodes)
    adjacency = transposed_adjacency(graph)
    net = PyGNet(args.model, graph.x.shape[1], args.hidden, args.hidden, len(args.fanouts), args.dropout)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    with warnings.catch_warnings():
        # without pyg-lib PyG warns that torch-sparse sampling is deprecated: it is the one backend here
        warnings.filterwarnings("ignore", message=r".*without a 'pyg-lib' installation is deprecated")
        loader = LinkNeighborLoader(
            graph,
            num_neighbors=list(args.fanouts),
            edge_label_index=data.split.train,
            neg_sampling_ratio=1.0,
            batch_size=args.batch_size,
            shuffle=True,
        )
    batch_times: list[float] = []
    losses: list[float] = []

    def train_epoch() -> None:
        net.train()
        t_batch = time.perf_counter()
        for batch in loader:
            edges = without_positives(
                batch.edge_index, batch.edge_label_index, batch.edge_label, batch.num_nodes
            )
            h = net(batch.x, edges)
            logits = dot(h, *batch.edge_label_index)
            loss = F.binary_cross_entropy_with_logits(logits, batch.edge_label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            now = time.perf_counter()
            batch_times.append(now - t_batch)
            t_batch = now

    @torch.no_grad()
    def embed() -> Tensor:
        net.eval()
        return net(graph.x, adjacency)

    t_start = time.perf_counter()
    result = fit_link(train_epoch, embed, data.split, args.hits_k, args.epochs, args.max_time_s)
    return {
        "system": "pyg",
        "fanouts": list(args.fanouts),
        "batch_size": args.batch_size,
        "batches_per_epoch": len(loader),
        "batch_time_trimmed": trimmed_mean(batch_times),
        "total_time": time.perf_counter() - t_start,
        "losses": losses,
        **result,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    link_arguments(parser)
    args = parser.parse_args(argv)
    try:
        require_neighbor_sampling()
    except ImportError as err:  # before the dataset loads: one line, no traceback
        raise SystemExit(f"error: {err}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    return finish(run_pyg_link(load_link_data(args.data, args.split), args), args)


if __name__ == "__main__":
    main(sys.argv[1:])
