"""What the link-prediction loops of ``bench link`` share (the plain-torch GAE reference, DGL's and
PyG's loops): the split every system reads from one file, OGB's scores of full-graph embeddings
on its fixed pairs, and the epoch loop that validates after every epoch and records
``(wall s, val Hits@K)``, so their curves read as the recipe's.

Nothing here imports DGL or PyG: each environment runs its own loop on top.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from benchmarks._baseline import Curve, fit_epochs, load_dataset, peak_rss_mb
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.graph.link_split import LinkSplit, load_link_split
from lightning_mqgnn.models.link_metrics import hits_at_k, mrr, roc_auc

SCORES = ("hits", "mrr", "auc")


@dataclass
class LinkData:
    """A dataset's features and the split of ``--split``: ``graph`` is the training graph (no
    held-out edge), ``split.train`` its positives, each undirected edge once."""

    dataset: GraphDataset
    graph: CSRGraph
    split: LinkSplit

    @property
    def features(self) -> Tensor:
        return self.dataset.features.to(compute_dtype(self.dataset.features.dtype))

    def message_edges(self) -> tuple[Tensor, Tensor]:
        """``(src, dst)`` of the training graph: ``split.train`` (ids ``0..E-1``), then the same
        edges reversed (``E..2E-1``), so edge ``i``'s reverse is ``(i + E) % 2E``."""
        src, dst = self.split.train
        if not self.split.undirected:
            return src, dst
        return torch.cat([src, dst]), torch.cat([dst, src])


def load_link_data(data: str, split: Path) -> LinkData:
    """``data`` as ``bench tta``'s baselines load it (the recipe's data config: identical
    features) and the split file ``bench link`` wrote for it."""
    dataset = load_dataset(data)
    graph, link_split = load_link_split(split, num_nodes=dataset.num_nodes)
    return LinkData(dataset, graph, link_split)


def dot(h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
    """The graph auto-encoder's decoder: ``<h_u, h_v>`` per pair."""
    return (h.index_select(0, src) * h.index_select(0, dst)).sum(-1)


@torch.no_grad()
def link_scores(h: Tensor, split: LinkSplit, which: str, k: int) -> dict[str, float]:
    """Hits@``k`` over the shared negatives, MRR over each positive's own negatives (where the
    split has them) and ROC-AUC, of embeddings ``h`` on split ``which`` ("val" or "test")."""
    pos_pairs, neg_pairs = getattr(split, f"{which}_pos"), getattr(split, f"{which}_neg")
    pos, neg = dot(h, *pos_pairs), dot(h, *neg_pairs)
    scores = {"hits": hits_at_k(pos, neg, k), "auc": roc_auc(pos, neg)}
    per_source = getattr(split, f"{which}_neg_per_source")
    if per_source is not None:
        sources = pos_pairs[0].unsqueeze(1).expand_as(per_source)
        rows = dot(h, sources.reshape(-1), per_source.reshape(-1)).view(per_source.shape)
        scores["mrr"] = mrr(pos, rows)
    return scores


def fit_link(
    train_epoch: Callable[[], None],
    embed: Callable[[], Tensor],
    split: LinkSplit,
    k: int,
    epochs: int,
    max_time_s: float | None,
) -> dict:
    """``fit_epochs`` with exact full-graph embeddings (``embed``) scored on val and test after
    every epoch; the curve of val Hits@K and, at the best-validation epoch, every score of both."""
    scores: list[dict[str, dict[str, float]]] = []

    def validate() -> tuple[float, float]:
        h = embed()
        scores.append({which: link_scores(h, split, which, k) for which in ("val", "test")})
        return scores[-1]["val"]["hits"], scores[-1]["test"]["hits"]

    curve: Curve = fit_epochs(train_epoch, validate, epochs, max_time_s)
    summary = curve.summary()
    best = scores[summary["best_epoch"]]
    return {**summary, "val": best["val"], "test": best["test"]}


def link_arguments(parser: argparse.ArgumentParser, batch: bool = True) -> None:
    """The options of every link loop: data, split file, network, budget and output."""
    parser.add_argument("--data", default="cora", help="shared dataset name (the recipe's data=NAME)")
    parser.add_argument("--split", type=Path, required=True, help="the split file (save_link_split)")
    parser.add_argument("--model", choices=("sage", "gcn"), default="sage")
    if batch:
        parser.add_argument("--fanouts", type=int, nargs="+", default=[5, 5])
        parser.add_argument("--batch-size", type=int, default=512, help="positive edges per batch")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument(
        "--max-time-s", type=float, help="end at the first epoch's end past this (validation in)"
    )
    parser.add_argument("--hidden", type=int, default=128, help="hidden and embedding width")
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--hits-k", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, help="write the full result here")


def finish(result: dict, args: argparse.Namespace) -> dict:
    """The run's settings and peak RSS added to ``result``; its summary line printed and the
    result written to ``--json``."""
    result = {
        **result,
        "dataset": args.data,
        "model": args.model,
        "lr": args.lr,
        "hidden": args.hidden,
        "seed": args.seed,
        "hits_k": args.hits_k,
        "peak_rss_mb": peak_rss_mb(),
    }
    epoch = sum(result["epoch_times"]) / len(result["epoch_times"])
    test = " ".join(f"{key} {value:.4f}" for key, value in result["test"].items())
    print(
        f"{result['system']}-{args.model} {args.data}: {result['epochs']} epochs of {epoch:.3f} s, best epoch "
        f"{result['best_epoch']}: val hits@{args.hits_k} {result['best_val']:.4f}, test {test}",
        flush=True,
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result
