"""A link-prediction dataset that comes with its own edge split (an OGB ``ogbl-*`` benchmark, or
your own split files), and the ``GraphDataset`` of a graph that has no node task.

A ``LinkDataset`` is what a data config returns when the data fix the split: the link task
(``sampling.edge_seeds.edge_seeds``) then trains on that split instead of drawing one, and scores
as the data's publisher does (``hits_k``, ``metric``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.link_split import LinkSplit
from lightning_mqgnn.graph.validate import validate_dataset

LINK_METRICS = ("hits", "mrr")


@dataclass
class LinkDataset:
    """``dataset`` over the training graph of ``split`` (no held-out edge in it) and the split.

    ``hits_k``: the K of Hits@K the data are scored at (ogbl-collab 50, ogbl-ppa 100, ogbl-ddi 20),
    None where they name none. ``metric``: ``"hits"`` (Hits@K over the shared negatives) or
    ``"mrr"`` (over each positive's own negatives, ``split.val_neg_per_source``; ogbl-citation2)."""

    dataset: GraphDataset
    split: LinkSplit
    hits_k: int | None = None
    metric: str = "hits"

    def __post_init__(self) -> None:
        if self.metric not in LINK_METRICS:
            raise ValueError(f"LinkDataset.metric must be one of {LINK_METRICS}, got {self.metric!r}")
        if self.metric == "mrr" and self.split.val_neg_per_source is None:
            raise ValueError(
                f"{self.dataset.name}: metric 'mrr' ranks each positive against its own negatives, "
                "but the split has no val_neg_per_source"
            )
        if self.dataset.num_nodes != self.split.num_nodes:
            raise ValueError(
                f"{self.dataset.name}: the dataset has {self.dataset.num_nodes} nodes, its link split "
                f"{self.split.num_nodes}"
            )

    @property
    def name(self) -> str:
        return self.dataset.name


def link_only_dataset(
    name: str, graph: CSRGraph, features: Tensor | None = None, source: str = ""
) -> GraphDataset:
    """The ``GraphDataset`` of a graph without node labels, for link prediction alone: no classes
    (``num_classes=0``, labels ``[N, 0]``), every node a training node (an endpoint a training
    edge may have), and without ``features`` a ``[N, 0]`` feature matrix: the model learns an
    input per node instead (``LinkPredictor(node_embedding=...)``)."""
    n = graph.num_nodes
    if features is None:
        features = torch.empty(n, 0, dtype=torch.float32)
    elif features.dim() == 2 and not features.is_complex():
        features = features.to(torch.float32)
    empty = torch.empty(0, dtype=torch.int64)
    ds = GraphDataset(
        name=name,
        graph=graph,
        features=features.contiguous(),
        labels=torch.empty(n, 0, dtype=torch.float32),
        train_idx=torch.arange(n),
        val_idx=empty,
        test_idx=empty.clone(),
        num_classes=0,
    )
    return validate_dataset(ds, source=source)
