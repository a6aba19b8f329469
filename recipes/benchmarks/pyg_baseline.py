"""PyG's own loop: ``NeighborLoader`` and a 2-layer ``torch_geometric.nn`` model, the second baseline.

The same run as ``dgl_baseline`` with PyTorch Geometric's loader and layers: GraphSAGE-mean or GCN
(``GCNConv`` adds the self loops and normalises on each sampled subgraph), hidden 256, ReLU and
dropout, Adam, cross-entropy on the seed nodes of each batch; after every epoch exact full-graph
inference scores val and test, its layers on the sparse adjacency (``transposed_adjacency``). As
in PyG's examples, every layer runs on the whole sampled subgraph (no per-hop trimming). The
layers keep PyG's initialisation, whose weights are about a third of DGL's (Xavier with the ReLU
gain), so at lr 1e-3 the first epochs learn slower than in ``dgl_baseline``. ``NeighborLoader``
samples with pyg-lib or torch-sparse; neither is part of the `pyg` extra, so this needs the PyG
environment (``bash .ci/pyg_env.sh``).

    .venv-pyg/bin/python recipes/bench.py pyg_baseline --data cora --model sage --epochs 20

The JSON it writes has the keys of ``dgl_baseline``'s, so both read the same (no ``--bf16`` here).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks._baseline import (
    fit_epochs,
    load_dataset,
    loop_arguments,
    peak_rss_mb,
    report,
    split_scores,
    trimmed_mean,
)
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.pyg import import_pyg, to_pyg_data
from lightning_mqgnn.models.metrics import node_loss

__all__ = ["require_neighbor_sampling", "run_pyg_baseline"]

NO_SAMPLER = (
    "PyG's NeighborLoader needs pyg-lib or torch-sparse, and neither imports in this environment; "
    "build the PyG environment with `bash .ci/pyg_env.sh` and run this with .venv-pyg/bin/python"
)


def require_neighbor_sampling() -> Any:
    """``torch_geometric``, once a sampling backend imports: without one ``NeighborLoader`` fails only
    at its first batch, inside a worker process when ``num_workers > 0``."""
    pyg = import_pyg()
    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        raise ImportError(NO_SAMPLER)
    return pyg


class PyGNet(nn.Module):
    """Two (or more) ``torch_geometric.nn`` layers with ReLU and dropout between them."""

    def __init__(self, model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float):
        super().__init__()
        pygnn = import_pyg().nn
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        if model == "sage":
            self.layers = nn.ModuleList(pygnn.SAGEConv(a, b, aggr="mean") for a, b in zip(dims, dims[1:]))
        elif model == "gcn":
            self.layers = nn.ModuleList(pygnn.GCNConv(a, b) for a, b in zip(dims, dims[1:]))
        else:
            raise ValueError(f"unknown model {model!r}; expected 'sage' or 'gcn'")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, edge_index)
            if i < len(self.layers) - 1:
                x = self.dropout(torch.relu(x))
        return x


def transposed_adjacency(data: Any) -> Tensor:
    """``data``'s edges as the sparse CSR matrix whose row ``v`` holds ``v``'s in-neighbours, which
    PyG's layers take in place of ``edge_index`` (the layout ``T.ToSparseTensor`` gives, in torch's
    own sparse format): they then aggregate with one sparse product per layer instead of a
    message per edge, ``E x width`` floats, which on products_like_200k took 6.5 GB at hidden 256
    and on products_like_1m would take more than the 2-core VM's 24 GiB."""
    from torch_geometric.utils import to_torch_csr_tensor

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Sparse CSR tensor support is in beta state")
        return to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, data.num_nodes))


@torch.no_grad()
def evaluate(
    net: PyGNet, x: Tensor, adjacency: Tensor, dataset: GraphDataset, splits: Sequence[Tensor]
) -> list[float]:
    """Exact full-neighbour inference: every layer over the whole graph (no sampling) with the
    ``transposed_adjacency``, then the dataset's metric on each split."""
    net.eval()
    return split_scores(net(x, adjacency), dataset, splits)


def run_pyg_baseline(
    dataset: GraphDataset,
    model: str = "sage",
    fanouts: Sequence[int] = (5, 5),
    batch_size: int = 1024,
    epochs: int = 10,
    hidden: int = 256,
    seed: int = 0,
    num_workers: int = 0,
    lr: float = 1e-3,
    dropout: float = 0.5,
    max_time_s: float | None = None,
) -> dict:
    """Train with PyG's own loader and layers; return timings and the best-validation test score.

    ``batch_times`` (seconds, every batch of every epoch, in order) cover sampling, slicing,
    forward, backward and the optimiser step; ``epoch_times`` are the training loops only, without
    evaluation. With ``max_time_s`` the fit ends at the first epoch's end past that many seconds.
    """
    require_neighbor_sampling()
    from torch_geometric.loader import NeighborLoader

    if epochs < 1 or batch_size < 1 or hidden < 1 or not fanouts:
        raise ValueError(
            f"epochs, batch_size and hidden must be positive and fanouts non-empty, got epochs={epochs}, "
            f"batch_size={batch_size}, hidden={hidden}, fanouts={list(fanouts)}"
        )
    torch.manual_seed(seed)  # the loader's shuffle and torch-sparse's sampling draw from it
    data = to_pyg_data(dataset)
    adjacency = transposed_adjacency(data)
    net = PyGNet(model, dataset.num_features, hidden, dataset.num_classes, len(fanouts), dropout)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    with warnings.catch_warnings():
        # without pyg-lib PyG warns that torch-sparse sampling is deprecated: it is the one backend here
        warnings.filterwarnings("ignore", message=r".*without a 'pyg-lib' installation is deprecated")
        loader = NeighborLoader(
            data,
            num_neighbors=list(fanouts),
            batch_size=batch_size,
            input_nodes=dataset.train_idx,
            shuffle=True,
            num_workers=num_workers,
        )
    batch_times: list[float] = []
    losses: list[float] = []

    def train_epoch() -> None:
        net.train()
        t_batch = time.perf_counter()
        for batch in loader:
            # the seed nodes come first in every sampled subgraph
            logits = net(batch.x, batch.edge_index)[: batch.batch_size]
            loss = node_loss(logits, batch.y[: batch.batch_size], dataset.multilabel)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            now = time.perf_counter()
            batch_times.append(now - t_batch)
            t_batch = now

    t_start = time.perf_counter()
    curve = fit_epochs(
        train_epoch,
        lambda: evaluate(net, data.x, adjacency, dataset, (dataset.val_idx, dataset.test_idx)),
        epochs,
        max_time_s,
    )
    return {
        "system": "pyg",
        "dataset": dataset.name,
        "model": model,
        "fanouts": list(fanouts),
        "batch_size": batch_size,
        "hidden": hidden,
        "seed": seed,
        "lr": lr,
        "num_workers": num_workers,
        "metric": dataset.metric,
        "batches_per_epoch": len(loader),
        "batch_times": batch_times,
        "batch_time_trimmed": trimmed_mean(batch_times),
        "total_time": time.perf_counter() - t_start,
        "losses": losses,
        **curve.summary(),
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    loop_arguments(parser)
    args = parser.parse_args(argv)
    try:
        require_neighbor_sampling()
    except ImportError as err:  # before the dataset loads: one line, no traceback
        raise SystemExit(f"error: {err}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = load_dataset(args.data, args.scale, args.seed)
    result = run_pyg_baseline(
        dataset,
        model=args.model,
        fanouts=args.fanouts,
        batch_size=args.batch_size,
        epochs=args.epochs,
        hidden=args.hidden,
        seed=args.seed,
        num_workers=args.num_workers,
        lr=args.lr,
        max_time_s=args.max_time_s,
    )
    report(result, dataset, args.json)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
