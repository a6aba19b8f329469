"""A node-classification dataset: graph, features, labels, splits and how it is scored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.huge_pages import advise_huge_pages

METRICS = ("accuracy", "micro_f1", "rocauc")


@dataclass
class GraphDataset:
    """Everything a run needs about its data.

    ``labels`` is int64 ``[N]`` for single-label tasks, or float32 ``[N, T]`` (0/1, NaN where
    unknown is not allowed) for multi-label tasks such as ogbn-proteins, where ``num_classes``
    is the number of tasks. ``metric`` is one of ``METRICS``; a binary ``rocauc`` task scores
    the probability of class 1.
    """

    name: str
    graph: CSRGraph
    features: Tensor
    labels: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    num_classes: int
    metric: str = "accuracy"

    def __post_init__(self) -> None:
        # samplers and the feature gather read random rows of these: fewer TLB misses
        advise_huge_pages(self.graph.indptr, self.graph.indices, self.features)

    @classmethod
    def from_arrays(
        cls,
        edge_index: Any,
        features: Any,
        labels: Any,
        splits: Mapping[str, Any] | None = None,
        split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
        seed: int = 0,
        metric: str = "accuracy",
        name: str = "arrays",
        make_undirected: bool = True,
        num_classes: int | None = None,
    ) -> GraphDataset:
        """Your own graph from tensors or numpy arrays, validated like every loaded dataset: see
        ``graph.arrays.from_arrays``."""
        from lightning_mqgnn.graph.arrays import from_arrays

        return from_arrays(
            edge_index,
            features,
            labels,
            splits=splits,
            split_fractions=split_fractions,
            seed=seed,
            metric=metric,
            name=name,
            make_undirected=make_undirected,
            num_classes=num_classes,
        )

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def multilabel(self) -> bool:
        return self.labels.dim() == 2

    def share_memory_(self) -> GraphDataset:
        """Put the big arrays in shared memory: sampler workers then read them without copies."""
        self.graph.share_memory_()
        for t in (self.features, self.labels, self.train_idx, self.val_idx, self.test_idx):
            t.share_memory_()
        return self

    def summary(self) -> str:
        return (
            f"{self.name}: {self.num_nodes:,} nodes, {self.graph.num_edges:,} directed edges, "
            f"{self.num_features} features, {self.num_classes} "
            f"{'tasks' if self.multilabel else 'classes'}, metric {self.metric}, split "
            f"{self.train_idx.numel():,}/{self.val_idx.numel():,}/{self.test_idx.numel():,}"
        )


def split_mask(num_nodes: int, idx: Tensor) -> Tensor:
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[idx] = True
    return mask
