"""Your own graph as files, for either task (``data=arrays``): with node labels a node
classification dataset (``arrays.load_arrays``); without them, or with link split files, a graph
for link prediction (``load_link_arrays``), whose features are optional: without them the model
learns an input per node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from lightning_mqgnn.graph.arrays import load_arrays, read_array
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.fields import as_tensor, edge_pairs
from lightning_mqgnn.graph.link_dataset import LinkDataset, link_only_dataset
from lightning_mqgnn.graph.link_split import largest_id, link_split_of, read_link_split_files, training_graph

PathLike = str | os.PathLike


def load_own_data(
    edges: PathLike | None = None,
    features: PathLike | None = None,
    labels: PathLike | None = None,
    splits: PathLike | Mapping[str, PathLike] | None = None,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    metric: str = "accuracy",
    name: str = "arrays",
    make_undirected: bool = True,
    num_classes: int | None = None,
    link_split: Mapping[str, PathLike | None] | None = None,
) -> GraphDataset | LinkDataset:
    """``load_arrays`` where ``labels`` are given and no ``link_split`` file is, else
    ``load_link_arrays`` (the link task reads no labels)."""
    split_files = {field: path for field, path in (link_split or {}).items() if path is not None}
    if labels is not None and not split_files:
        if edges is None or features is None:
            missing = " and ".join(f for f, v in (("edges", edges), ("features", features)) if v is None)
            raise ValueError(
                f"{name}: node classification reads edges, features and labels; no {missing} file given"
            )
        return load_arrays(
            edges, features, labels, splits, split_fractions, seed, metric, name, make_undirected, num_classes
        )
    return load_link_arrays(edges, features, split_files, name, make_undirected)


def load_link_arrays(
    edges: PathLike | None = None,
    features: PathLike | None = None,
    link_split: Mapping[str, PathLike] | None = None,
    name: str = "arrays",
    make_undirected: bool = True,
) -> GraphDataset | LinkDataset:
    """A graph for link prediction from files: an edge list (read as ``load_arrays`` reads one),
    optional ``[N, F]`` features, and optional split files (``link_split``: ``train``,
    ``val_pos``, ``test_pos``, ``val_neg``, ``test_neg``, and optionally ``val_neg_per_source``,
    ``test_neg_per_source``; read as ``link_split.load_link_split_files`` reads them).

    Without split files: the graph's ``GraphDataset`` (no node labels), whose edges the link task
    splits at random. With them: a ``LinkDataset`` over the training graph of that split, checked
    against the full graph ``edges`` where given (a negative that is an edge of it is an error).
    The nodes are the features' rows, else ids ``0 .. max id`` of every file."""
    split_files = dict(link_split or {})
    if edges is None and not split_files:
        raise ValueError(
            f"{name}: no edges: give an edge list (data.edges) or link split files (data.link_split)"
        )
    sources = {"edges": edges, "features": features}
    source = ", ".join(f"{field}={path}" for field, path in sources.items() if path is not None)
    x = None
    if features is not None:
        where = f"{name} (features={features})"
        x = as_tensor(where, "features", read_array(Path(features), "features"))
        if x.dim() != 2:
            raise ValueError(f"{where}: field 'features' has shape {tuple(x.shape)}, expected [N, F]")
    arrays, files = read_link_split_files(split_files) if split_files else ({}, {})
    edge_index = None
    if edges is not None:
        edge_index = torch.stack(
            edge_pairs(f"{name} (edges={edges})", read_array(Path(edges), "edges"), 1 << 62)
        )
    given = list(arrays.values()) + ([] if edge_index is None else [edge_index])
    num_nodes = int(x.shape[0]) if x is not None else largest_id(given) + 1
    if num_nodes < 1:
        raise ValueError(f"{name} ({source or 'link split files'}): no nodes")
    graph = None
    if edge_index is not None:
        src, dst = edge_pairs(f"{name} (edges={edges})", edge_index, num_nodes)
        graph = CSRGraph.from_edges(src, dst, num_nodes, symmetrize=make_undirected)
    if not arrays:
        return link_only_dataset(name, graph, x, source)
    split = link_split_of(arrays, num_nodes, make_undirected, files, graph=graph)
    source = ", ".join(filter(None, [source, *(f"{field}={path}" for field, path in files.items())]))
    return LinkDataset(link_only_dataset(name, training_graph(split), x, source), split)
