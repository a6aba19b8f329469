"""A node-classification dataset: graph, features, labels, splits and how it is scored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.fields import as_tensor, edge_pairs, given_splits, label_tensor, random_split
from lightning_mqgnn.graph.huge_pages import advise_huge_pages
from lightning_mqgnn.graph.validate import METRICS, validate_dataset

__all__ = ["METRICS", "GraphDataset", "converted_dataset", "split_mask"]


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
        source: str = "",
    ) -> GraphDataset:
        """Your own graph from plain arrays (torch tensors or numpy arrays), validated like every
        loaded dataset.

        ``edge_index``: integer ``[2, E]`` (or ``[E, 2]``), edge ``u -> v`` making ``u`` an
        in-neighbour of ``v``; symmetrised unless ``make_undirected=False``; self loops and
        duplicates are dropped. ``features``: ``[N, F]`` numbers (float32 in the dataset).
        ``labels``: ``[N]`` classes, or 0/1 ``[N, T]`` for a multi-label task (then
        ``metric="rocauc"``). ``splits``: ``{"train": ..., "val": ..., "test": ...}``, each node ids
        or a boolean mask; without it, a random split with ``split_fractions`` of the nodes, drawn
        with ``seed``. ``source`` (e.g. the files) is named in error messages beside ``name``.
        """
        who = f"{name} ({source})" if source else name
        features = as_tensor(who, "features", features)
        if features.dim() != 2:
            raise ValueError(f"{who}: field 'features' has shape {tuple(features.shape)}, expected [N, F]")
        num_nodes = int(features.shape[0])
        if num_nodes < 1:
            raise ValueError(f"{who}: field 'features' has no rows (an empty graph)")
        if not features.is_complex():  # validate_dataset rejects what cannot be float32
            features = features.to(torch.float32)
        labels = label_tensor(who, labels)
        if labels.dim() >= 1 and labels.shape[0] != num_nodes:
            raise ValueError(
                f"{who}: field 'labels' has {labels.shape[0]} entries, expected {num_nodes} (one per row of 'features')"
            )
        src, dst = edge_pairs(who, edge_index, num_nodes)
        graph = CSRGraph.from_edges(src, dst, num_nodes, symmetrize=make_undirected)
        if splits is None:
            split = random_split(num_nodes, split_fractions, seed)
        else:
            split = given_splits(who, splits, num_nodes)
        return converted_dataset(name, graph, features, labels, split, num_classes, metric, source)

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

    @property
    def has_node_task(self) -> bool:
        """Whether the nodes have labels to classify (a link-prediction dataset may have none)."""
        return self.num_classes > 0

    def summary(self) -> str:
        head = f"{self.name}: {self.num_nodes:,} nodes, {self.graph.num_edges:,} directed edges, "
        features = f"{self.num_features} features" if self.num_features else "no features"
        if not self.has_node_task:
            return f"{head}{features}, no node labels"
        return (
            f"{head}{features}, {self.num_classes} "
            f"{'tasks' if self.multilabel else 'classes'}, metric {self.metric}, split "
            f"{self.train_idx.numel():,}/{self.val_idx.numel():,}/{self.test_idx.numel():,}"
        )


def split_mask(num_nodes: int, idx: Tensor) -> Tensor:
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[idx] = True
    return mask


def converted_dataset(
    name: str,
    graph: CSRGraph,
    features: Tensor,
    labels: Tensor,
    splits: tuple[Tensor, Tensor, Tensor],
    num_classes: int | None,
    metric: str,
    source: str,
) -> GraphDataset:
    """A ``GraphDataset`` from arrays or another library's graph (DGL, PyG), checked like every
    loaded one.
    ``num_classes`` defaults to the label width of multi-label ``[N, T]`` labels, else ``max + 1``."""
    if num_classes is None:
        if labels.dim() == 2:
            num_classes = int(labels.shape[1])
        else:
            num_classes = int(labels.max()) + 1 if labels.numel() else 0
    train_idx, val_idx, test_idx = splits
    ds = GraphDataset(
        name=name,
        graph=graph,
        features=features.contiguous(),
        labels=labels.contiguous(),
        train_idx=train_idx,
        val_idx=val_idx,
        test_idx=test_idx,
        num_classes=int(num_classes),
        metric=metric,
    )
    return validate_dataset(ds, source=source)
