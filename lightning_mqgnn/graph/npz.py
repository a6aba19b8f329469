"""Load the project's pickle-free ``NAME.npz`` node-classification files (the keys below).

Keys: ``indptr``/``indices`` (CSR adjacency), ``x_indptr``/``x_indices``/``x_data``/``x_shape``
(sparse features), ``y`` (int64 class per node), ``train_idx``/``val_idx``/``test_idx`` and
``metric`` (``"accuracy"``, or ``"rocauc"``: binary task scored on the probability of class 1).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.features import sparse_to_dense_features
from lightning_mqgnn.graph.validate import check_csr_structure, validate_dataset

REQUIRED_KEYS = (
    "indptr",
    "indices",
    "x_indptr",
    "x_indices",
    "x_data",
    "x_shape",
    "y",
    "train_idx",
    "val_idx",
    "test_idx",
    "metric",
)
_METRICS = {"accuracy": "accuracy", "rocauc": "rocauc"}
_INT_KEYS = ("indptr", "indices", "x_indptr", "x_indices", "x_shape", "y", "train_idx", "val_idx", "test_idx")
_BAG_OF_WORDS_MIN_COLUMNS = 64


def load_npz(
    path: str | Path,
    name: str | None = None,
    max_features: int | None = None,
    make_undirected: bool = True,
    normalize_features: bool | None = None,
    feature_reduction: str = "frequent",
    num_classes: int | None = None,
    seed: int = 0,
) -> GraphDataset:
    """Read, clean and validate one ``.npz`` dataset.

    The graph is rebuilt as a simple graph (self loops dropped, duplicates merged) and, with
    ``make_undirected``, symmetrised. Features: densified when at most ``max_features`` columns
    wide (or ``max_features`` is None), otherwise reduced to ``max_features`` columns by keeping the
    most frequent columns (``feature_reduction="frequent"``, default) or by a seeded sparse random
    projection (``"projection"``, ``seed``); see ``graph.features``. ``normalize_features``: scale each row to sum 1
    before densifying or reducing; ``None`` (default) does so for non-negative bag-of-words-like
    features (all values >= 0 and more than 64 columns) and leaves dense attribute vectors
    (e.g. tolokers' 10 columns) alone. ``num_classes`` defaults to ``max(y) + 1`` (2 for rocauc).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    name = name or path.stem
    who = f"{name} ({path})"
    arrays = _read_arrays(path, who)

    metric_raw = str(arrays["metric"])
    if metric_raw not in _METRICS:
        raise ValueError(f"{who}: key 'metric' is {metric_raw!r}, expected one of {sorted(_METRICS)}")
    metric = _METRICS[metric_raw]

    t = {k: _as_int64(who, k, arrays[k]) for k in _INT_KEYS}
    num_nodes = t["indptr"].numel() - 1
    check_csr_structure(who, t["indptr"], t["indices"], num_nodes)
    rows = torch.repeat_interleave(torch.arange(num_nodes), t["indptr"][1:] - t["indptr"][:-1])
    graph = CSRGraph.from_edges(t["indices"], rows, num_nodes, symmetrize=make_undirected)

    features = _features(
        who,
        t,
        torch.from_numpy(np.asarray(arrays["x_data"])),
        num_nodes,
        max_features,
        normalize_features,
        feature_reduction,
        seed,
    )
    labels = t["y"]
    if num_classes is None:
        num_classes = 2 if metric == "rocauc" else int(labels.max()) + 1 if labels.numel() else 0
    ds = GraphDataset(
        name=name,
        graph=graph,
        features=features,
        labels=labels,
        train_idx=t["train_idx"],
        val_idx=t["val_idx"],
        test_idx=t["test_idx"],
        num_classes=int(num_classes),
        metric=metric,
    )
    return validate_dataset(ds, source=str(path))


def _read_arrays(path: Path, who: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            files = set(f.files)
            arrays = {k: f[k] for k in REQUIRED_KEYS if k in files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError) as err:
        raise ValueError(f"{who}: not a readable pickle-free .npz file ({err})") from err
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing:
        raise ValueError(f"{who}: missing key '{missing[0]}' (file has {sorted(files)})")
    return arrays


def _as_int64(who: str, key: str, a: np.ndarray) -> Tensor:
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{who}: key '{key}' must hold integers, got dtype {a.dtype}")
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).reshape(-1)


def _features(
    who: str,
    t: dict[str, Tensor],
    data: Tensor,
    num_nodes: int,
    max_features: int | None,
    normalize: bool | None,
    reduction: str,
    seed: int,
) -> Tensor:
    shape = t["x_shape"]
    if shape.numel() != 2 or int(shape[0]) != num_nodes or int(shape[1]) < 1:
        raise ValueError(f"{who}: key 'x_shape' is {shape.tolist()}, expected [{num_nodes}, F] with F >= 1")
    n_rows, n_cols = int(shape[0]), int(shape[1])
    check_csr_structure(who, t["x_indptr"], t["x_indices"], n_rows, n_cols, fields=("x_indptr", "x_indices"))
    if data.dim() != 1 or data.numel() != t["x_indices"].numel():
        raise ValueError(
            f"{who}: key 'x_data' has shape {tuple(data.shape)}, expected [{t['x_indices'].numel()}] "
            f"(one value per 'x_indices' entry)"
        )
    if not data.dtype.is_floating_point:
        data = data.to(torch.float32)
    bad = torch.nonzero(~torch.isfinite(data))
    if bad.numel():
        p = int(bad[0, 0])
        node = int(torch.searchsorted(t["x_indptr"], torch.tensor(p), right=True)) - 1
        raise ValueError(
            f"{who}: key 'x_data' has non-finite value {float(data[p])} at node {node}, "
            f"column {int(t['x_indices'][p])}"
        )
    if normalize is None:
        normalize = bool((data >= 0).all()) and n_cols > _BAG_OF_WORDS_MIN_COLUMNS
    return sparse_to_dense_features(
        t["x_indptr"],
        t["x_indices"],
        data,
        (n_rows, n_cols),
        max_features=max_features,
        normalize=normalize,
        reduction=reduction,
        seed=seed,
    )
