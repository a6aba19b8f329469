"""The paper's DGL baseline: DGL's ``DataLoader`` + ``NeighborSampler`` and a 2-layer ``dgl.nn`` model.

Every speed-up of this project is reported as a ratio against this loop on the same graph, model,
fan-out, batch size and epochs (BENCHMARKS.md). It mirrors the authors' baseline trainer:
GraphSAGE-mean (eq. 17) or GCN (eq. 1-2, self loops added to the graph), hidden 256, Adam lr 1e-3,
cross-entropy; the model of the best-validation epoch is scored on the test split with exact
full-neighbour inference. Needs the DGL environment (``.ci/dgl_env.sh``).

    .venv-dgl/bin/python recipes/bench.py dgl_baseline --data cora --model sage --epochs 20

``--lr``, ``--batch-size`` and ``--max-time-s`` set the loop up as ``bench tta`` tunes and bounds it;
the JSON it writes carries the validation curve against wall time (``wall_s``) and the peak RSS.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

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
from lightning_mqgnn.graph.dgl_graph import import_dgl, to_dgl
from lightning_mqgnn.models.metrics import node_loss

__all__ = ["load_dataset", "run_dgl_baseline", "trimmed_mean"]


class DGLNet(nn.Module):
    """Two (or more) ``dgl.nn`` layers with ReLU and dropout between them."""

    def __init__(self, model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float):
        super().__init__()
        dglnn = import_dgl().nn
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        if model == "sage":
            self.layers = nn.ModuleList(
                dglnn.SAGEConv(a, b, aggregator_type="mean") for a, b in zip(dims, dims[1:])
            )
        elif model == "gcn":
            # norm="both": D^-1/2 Â D^-1/2 on the (sampled) graph with self loops, eq. 2
            self.layers = nn.ModuleList(dglnn.GraphConv(a, b, norm="both") for a, b in zip(dims, dims[1:]))
        else:
            raise ValueError(f"unknown model {model!r}; expected 'sage' or 'gcn'")
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, h: Tensor) -> Tensor:
        """``blocks``: one DGL block per layer (input layer first), or the same full graph repeated."""
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(torch.relu(h))
        return h


@torch.no_grad()
def evaluate(net: DGLNet, g, dataset: GraphDataset, splits: Sequence[Tensor]) -> list[float]:
    """Exact full-neighbour inference: every layer over the whole graph (no sampling), then the
    dataset's metric on each split."""
    net.eval()
    logits = net([g] * len(net.layers), g.ndata["feat"])
    return split_scores(logits, dataset, splits)


def run_dgl_baseline(
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
    bf16: bool = False,
    max_time_s: float | None = None,
) -> dict:
    """Train with DGL's own loader and layers; return timings and the best-validation test score.

    ``batch_times`` (seconds, every batch of every epoch, in order) cover sampling, slicing,
    forward, backward and the optimiser step, so a caller can drop the first and last 20 as the
    paper does; ``epoch_times`` are the training loops only, without evaluation. With
    ``max_time_s`` the fit ends at the first epoch's end past that many seconds (``fit_epochs``).
    """
    dgl = import_dgl()
    if epochs < 1 or batch_size < 1 or hidden < 1 or not fanouts:
        raise ValueError(
            f"epochs, batch_size and hidden must be positive and fanouts non-empty, got epochs={epochs}, "
            f"batch_size={batch_size}, hidden={hidden}, fanouts={list(fanouts)}"
        )
    torch.manual_seed(seed)
    dgl.seed(seed)
    g = to_dgl(dataset, add_self_loops=(model == "gcn"))
    net = DGLNet(model, dataset.num_features, hidden, dataset.num_classes, len(fanouts), dropout)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    loader = dgl.dataloading.DataLoader(
        g,
        dataset.train_idx,
        sampler,
        batch_size=batch_size,
        shuffle=True,
        drop_last=False,
        num_workers=num_workers,
    )
    batch_times: list[float] = []
    losses: list[float] = []

    def train_epoch() -> None:
        net.train()
        t_batch = time.perf_counter()
        for _input_nodes, _output_nodes, blocks in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # as bf16-mixed
                logits = net(blocks, blocks[0].srcdata["feat"])
            loss = node_loss(logits.float(), blocks[-1].dstdata["label"], dataset.multilabel)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            now = time.perf_counter()
            batch_times.append(now - t_batch)
            t_batch = now

    t_start = time.perf_counter()
    curve = fit_epochs(
        train_epoch,
        lambda: evaluate(net, g, dataset, (dataset.val_idx, dataset.test_idx)),
        epochs,
        max_time_s,
    )
    return {
        "system": "dgl",
        "dataset": dataset.name,
        "model": model,
        "fanouts": list(fanouts),
        "batch_size": batch_size,
        "hidden": hidden,
        "seed": seed,
        "lr": lr,
        "num_workers": num_workers,
        "bf16": bf16,
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
    parser.add_argument(
        "--bf16", action="store_true", help="forward under CPU autocast to bfloat16 (as precision=bf16-mixed)"
    )
    args = parser.parse_args(argv)
    try:
        import_dgl()
    except ImportError as err:  # before the dataset loads: one line naming the cause, no traceback
        raise SystemExit(f"error: {err}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = load_dataset(args.data, args.scale, args.seed)
    result = run_dgl_baseline(
        dataset,
        model=args.model,
        fanouts=args.fanouts,
        batch_size=args.batch_size,
        epochs=args.epochs,
        hidden=args.hidden,
        seed=args.seed,
        num_workers=args.num_workers,
        bf16=args.bf16,
        lr=args.lr,
        max_time_s=args.max_time_s,
    )
    report(result, dataset, args.json)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
