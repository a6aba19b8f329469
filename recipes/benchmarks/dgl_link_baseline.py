"""DGL's link-prediction loop, a speed baseline of ``bench link``: ``as_edge_prediction_sampler``
over ``NeighborSampler`` with ``Uniform(1)`` negatives and a 2-layer ``dgl.nn`` encoder.

Batches of training edges (``--batch-size`` positives, one negative each: the source kept, a
uniform destination) sample the blocks of their endpoints with ``exclude="reverse_id"``: a
batch's positive edges, in both directions, carry no message (as the recipe's
``task.seeds.exclude=reverse``). GraphSAGE-mean or GCN (``GraphConv(norm="both")`` on the graph
with self loops), ReLU and dropout between layers, dot-product decoder, binary cross-entropy,
Adam. After every epoch exact full-graph inference scores the split's fixed pairs (Hits@K, MRR,
AUC: ``models.link_metrics``). Needs the DGL environment (``.ci/dgl_env.sh``).

    .venv-dgl/bin/python recipes/bench.py dgl_link_baseline --data cora --split split.npz --epochs 20
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from benchmarks._baseline import trimmed_mean
from benchmarks._link import LinkData, dot, finish, fit_link, link_arguments, load_link_data
from benchmarks.dgl_baseline import DGLNet
from lightning_mqgnn.graph.dgl_graph import import_dgl


def training_graph(data: LinkData, self_loops: bool):
    """The training graph as a ``DGLGraph`` with ``feat``, and each edge's reverse edge id: the
    train edges ``0..E-1``, their reverses ``E..2E-1`` (``LinkData.message_edges``), then one
    self loop per node (GCN), its own reverse."""
    dgl = import_dgl()
    src, dst = data.message_edges()
    n = data.split.num_nodes
    num = src.numel()
    half = data.split.train.shape[1]
    reverse = torch.arange(num).add(half).remainder(num) if data.split.undirected else torch.arange(num)
    if self_loops:
        loops = torch.arange(n)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
        reverse = torch.cat([reverse, torch.arange(num, num + n)])
    g = dgl.graph((src, dst), num_nodes=n, idtype=torch.int64)
    g.ndata["feat"] = data.features
    return g, reverse


def run_dgl_link(data: LinkData, args: argparse.Namespace) -> dict:
    """Train with DGL's edge loader and layers (see the module's doc); the curve and the scores at
    the best-validation epoch."""
    dgl = import_dgl()
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    g, reverse = training_graph(data, self_loops=args.model == "gcn")
    net = DGLNet(
        args.model, g.ndata["feat"].shape[1], args.hidden, args.hidden, len(args.fanouts), args.dropout
    )
    if args.model == "gcn":
        # a node whose sampled in-edges were all a batch's excluded positives receives no message
        # (its output is the bias), which GraphConv refuses unless allowed
        for layer in net.layers:
            layer.set_allow_zero_in_degree(True)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler(list(args.fanouts)),
        exclude="reverse_id" if data.split.undirected else "self",
        reverse_eids=reverse,
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(1),
    )
    loader = dgl.dataloading.DataLoader(
        g,
        torch.arange(data.split.train.shape[1]),
        sampler,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=False,
        num_workers=0,
    )
    batch_times: list[float] = []
    losses: list[float] = []

    def train_epoch() -> None:
        net.train()
        t_batch = time.perf_counter()
        for _input_nodes, pairs, negatives, blocks in loader:
            h = net(blocks, blocks[0].srcdata["feat"])
            pos, neg = dot(h, *pairs.edges()), dot(h, *negatives.edges())
            logits = torch.cat([pos, neg])
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            loss = F.binary_cross_entropy_with_logits(logits, labels)
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
        return net([g] * len(net.layers), g.ndata["feat"])

    t_start = time.perf_counter()
    result = fit_link(train_epoch, embed, data.split, args.hits_k, args.epochs, args.max_time_s)
    return {
        "system": "dgl",
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
        import_dgl()
    except ImportError as err:  # before the dataset loads: one line naming the cause, no traceback
        raise SystemExit(f"error: {err}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    return finish(run_dgl_link(load_link_data(args.data, args.split), args), args)


if __name__ == "__main__":
    main(sys.argv[1:])
