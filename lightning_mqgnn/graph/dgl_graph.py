"""DGL graphs as input: a ``dgl.DGLGraph`` (or one of DGL's built-in datasets) to a ``GraphDataset``.

DGL is an optional extra (its newest Linux wheel loads only with torch <= 2.2.1; see
``.ci/dgl_env.sh``), so it is imported inside the functions and nothing else in the library
depends on this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset, converted_dataset, split_mask
from lightning_mqgnn.graph.download import check_download
from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.graph.registry import data_root

# name -> (dgl.data class, metric). Only datasets with a single graph and train/val/test masks.
# Reddit is scored by micro-F1 as in the paper (Table 1); for single-label tasks micro-F1 equals accuracy.
DGL_BUILTINS: dict[str, tuple[str, str]] = {
    "reddit": ("RedditDataset", "micro_f1"),
    "cora": ("CoraGraphDataset", "accuracy"),
    "citeseer": ("CiteseerGraphDataset", "accuracy"),
    "pubmed": ("PubmedGraphDataset", "accuracy"),
    "flickr": ("FlickrDataset", "accuracy"),
}


def import_dgl() -> Any:
    """``import dgl`` with an error that says how to get it."""
    try:
        import dgl
    except ImportError as err:  # also raised when dgl's C library does not match torch
        raise ImportError(
            f"this needs DGL, which failed to import ({err}). Install the `dgl` extra "
            "(`pip install lightning_mqgnn[dgl]`) in an environment with torch <= 2.2.1, "
            "e.g. the one .ci/dgl_env.sh builds"
        ) from err
    return dgl


def _mask_to_idx(name: str, g: Any, key: str) -> Tensor:
    if key not in g.ndata:
        raise ValueError(f"{name}: node data field '{key}' is missing (have {sorted(g.ndata.keys())})")
    mask = g.ndata[key]
    if mask.dim() != 1:
        raise ValueError(f"{name}: node data field '{key}' must be a 1-D mask, got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        bad = mask[(mask != 0) & (mask != 1)]
        if bad.numel():
            raise ValueError(f"{name}: node data field '{key}' is not a 0/1 mask: has value {bad[0].item()}")
    return torch.nonzero(mask.bool()).reshape(-1).to(torch.int64)


def from_dgl(
    g: Any,
    name: str = "dgl",
    feature_key: str = "feat",
    label_key: str = "label",
    masks: tuple[str, str, str] = ("train_mask", "val_mask", "test_mask"),
    metric: str = "accuracy",
    num_classes: int | None = None,
    symmetrize: bool = False,
) -> GraphDataset:
    """Convert a homogeneous ``DGLGraph`` whose ``ndata`` holds features, labels and split masks.

    An edge ``u -> v`` makes ``u`` an in-neighbour of ``v`` (the node ``v`` aggregates, as in DGL's
    message passing). Self loops and duplicate edges are dropped (models add their own self loop,
    eq. 2). ``num_classes`` defaults to ``max(label) + 1`` (single-label) or the label width
    (multi-label, float 0/1 ``[N, T]``). The result is checked by ``validate_dataset``.
    """
    import_dgl()
    if len(g.ntypes) != 1 or len(g.canonical_etypes) != 1:
        raise ValueError(
            f"{name}: a homogeneous graph is needed, got node types {g.ntypes} and edge types "
            f"{g.canonical_etypes}"
        )
    for key in (feature_key, label_key):
        if key not in g.ndata:
            raise ValueError(f"{name}: node data field '{key}' is missing (have {sorted(g.ndata.keys())})")
    num_nodes = int(g.num_nodes())
    src, dst = g.edges()
    graph = CSRGraph.from_edges(
        src.cpu(), dst.cpu(), num_nodes, symmetrize=symmetrize, remove_self_loops=True
    )
    features = g.ndata[feature_key].cpu()
    if features.is_floating_point():
        features = features.to(torch.float32)
    labels = g.ndata[label_key].cpu()
    if labels.dim() == 2 and labels.shape[1] == 1 and not labels.is_floating_point():
        labels = labels.reshape(-1)  # OGB-style [N, 1] class ids
    if labels.dim() == 1 and not labels.is_floating_point():
        labels = labels.to(torch.int64)
    elif labels.dim() == 2 and not labels.is_floating_point():
        labels = labels.to(torch.float32)  # multi-label 0/1 stored as integers
    train_idx, val_idx, test_idx = (_mask_to_idx(name, g, key) for key in masks)
    splits_idx = (train_idx, val_idx, test_idx)
    return converted_dataset(name, graph, features, labels, splits_idx, num_classes, metric, "DGLGraph")


def load_dgl_builtin(name: str, raw_dir: str | None = None, download: bool = True) -> GraphDataset:
    """One of DGL's built-in datasets (``DGL_BUILTINS``), downloaded into ``raw_dir`` by DGL the
    first time (``raw_dir=None``: ``<data root>/dgl``, see ``graph.registry``) unless ``download``
    is False or DGL's server cannot be reached; both of those end in a ``FileNotFoundError`` saying
    where the files go."""
    key = name.lower()
    if key not in DGL_BUILTINS:
        raise ValueError(f"unknown DGL dataset name {name!r}; expected one of {sorted(DGL_BUILTINS)}")
    dgl = import_dgl()
    cls_name, metric = DGL_BUILTINS[key]

    class GuardedDownload(getattr(dgl.data, cls_name)):
        # DGL calls download() exactly when raw_path is missing: decide there, before it tries
        def download(self) -> None:
            manual = f"unpack {self.url} so that {self.raw_path} exists"
            check_download(key, self.url, Path(self.raw_path), download, manual)
            super().download()

    raw_dir = str(raw_dir) if raw_dir is not None else str(data_root() / "dgl")
    data = GuardedDownload(raw_dir=raw_dir, verbose=False)
    num_classes = getattr(data, "num_classes", None)
    return from_dgl(data[0], name=key, metric=metric, num_classes=num_classes)


def to_dgl(dataset: GraphDataset, add_self_loops: bool = False) -> Any:
    """The dataset as a ``DGLGraph`` (edge ``u -> v`` for each in-neighbour ``u`` of ``v``) with
    ``feat``, ``label`` and ``train_mask``/``val_mask``/``test_mask`` in ``ndata``.

    ``add_self_loops`` adds one ``v -> v`` per node, as DGL's GCN examples (and the paper's
    baselines) do before ``GraphConv``: Â = A + I of eq. 2.
    """
    dgl = import_dgl()
    graph = dataset.graph
    g = dgl.graph((graph.indices, graph.row_ids()), num_nodes=graph.num_nodes, idtype=torch.int64)
    if add_self_loops:
        g = dgl.add_self_loop(g)
    g.ndata["feat"] = dataset.features.to(compute_dtype(dataset.features.dtype))
    g.ndata["label"] = dataset.labels
    splits = {"train_mask": dataset.train_idx, "val_mask": dataset.val_idx, "test_mask": dataset.test_idx}
    for key, idx in splits.items():
        g.ndata[key] = split_mask(graph.num_nodes, idx)
    return g
