"""PyTorch Geometric graphs as input: a ``torch_geometric.data.Data`` (or one of PyG's dataset
classes) to a validated ``GraphDataset``, and back.

PyG is an optional extra (``pip install lightning_mqgnn[pyg]``): it is imported inside the
functions, so nothing else in the library needs it. ``from_pyg`` itself reads only tensors.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset, converted_dataset, split_mask
from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.graph.fields import SPLITS, edge_pairs, given_splits, label_tensor, split_ids
from lightning_mqgnn.graph.registry import data_root


def import_pyg() -> Any:
    """``import torch_geometric`` with an error that says how to get it."""
    try:
        import torch_geometric
    except ImportError as err:
        raise ImportError(
            f"this needs PyTorch Geometric, which failed to import ({err}); install the `pyg` extra: "
            "pip install lightning_mqgnn[pyg]"
        ) from err
    return torch_geometric


def _field(data: Any, key: str) -> Any:
    """``data[key]`` or None; ``Data`` and plain attribute holders alike."""
    return getattr(data, key, None)


def _splits(who: str, data: Any, splits: Mapping[str, Tensor] | None, num_nodes: int) -> list[Tensor]:
    if splits is not None:
        return list(given_splits(who, splits, num_nodes))
    out = []
    for s in SPLITS:
        key = next((k for k in (f"{s}_mask", f"{s}_idx") if _field(data, k) is not None), None)
        if key is None:
            raise ValueError(
                f"{who}: field '{s}_mask' (or '{s}_idx') is missing; pass splits={{'train': ..., 'val': ..., "
                "'test': ...}} for a graph without a split"
            )
        out.append(split_ids(who, key, _field(data, key), num_nodes))
    return out


def from_pyg(
    data: Any,
    name: str = "pyg",
    splits: Mapping[str, Tensor] | None = None,
    make_undirected: bool = False,
    metric: str = "accuracy",
    num_classes: int | None = None,
) -> GraphDataset:
    """Convert a homogeneous ``torch_geometric.data.Data`` with ``edge_index``, ``x`` and ``y``.

    An edge ``edge_index[:, e] = (u, v)`` makes ``u`` an in-neighbour of ``v``: PyG's default
    ``source_to_target`` flow, where ``v`` aggregates the messages of ``u``. Directed graphs stay
    directed unless ``make_undirected``. Self loops and duplicate edges are dropped (models add
    their own self loop, eq. 2). Splits come from ``splits`` (``train``/``val``/``test`` to a mask
    or node ids) or else from the fields ``train_mask``/``val_mask``/``test_mask`` (or
    ``*_idx``). ``y``: int64 ``[N]`` (or ``[N, 1]``) classes, or float 0/1 ``[N, T]`` multi-label;
    ``num_classes`` defaults to ``max(y) + 1`` or ``T``. Features are taken as they are (normalise
    with PyG's transforms). The result is checked by ``validate_dataset``, as every loader's is.
    """
    who = f"{name} (torch_geometric Data)"
    for key in ("edge_index", "x", "y"):
        if _field(data, key) is None:
            raise ValueError(f"{who}: field '{key}' is missing")
    x = _field(data, "x")
    if not isinstance(x, Tensor):
        raise ValueError(f"{who}: field 'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{who}: field 'x' has shape {tuple(x.shape)}, expected [N, F]")
    num_nodes = int(x.shape[0])
    declared = _field(data, "num_nodes")
    if declared is not None and int(declared) != num_nodes:
        raise ValueError(f"{who}: field 'x' has {num_nodes} rows but the graph has num_nodes={int(declared)}")
    if num_nodes < 1:
        raise ValueError(f"{who}: field 'x' has no rows (an empty graph)")
    src, dst = edge_pairs(who, _field(data, "edge_index"), num_nodes)
    graph = CSRGraph.from_edges(src, dst, num_nodes, symmetrize=make_undirected)
    features = x.detach().cpu()
    if not features.is_complex():  # validate_dataset rejects what cannot be float32
        features = features.to(torch.float32)
    labels = label_tensor(who, _field(data, "y"))
    train_idx, val_idx, test_idx = _splits(who, data, splits, num_nodes)
    splits_idx = (train_idx, val_idx, test_idx)
    return converted_dataset(
        name, graph, features, labels, splits_idx, num_classes, metric, "torch_geometric Data"
    )


def to_pyg_data(dataset: GraphDataset) -> Any:
    """The dataset as a ``torch_geometric.data.Data``: ``edge_index`` (source row 0, target
    row 1: one edge ``u -> v`` per in-neighbour ``u`` of ``v``), ``x``, ``y`` and the three split
    masks."""
    import_pyg()
    from torch_geometric.data import Data

    graph = dataset.graph
    masks = {
        f"{s}_mask": split_mask(graph.num_nodes, idx)
        for s, idx in zip(SPLITS, (dataset.train_idx, dataset.val_idx, dataset.test_idx))
    }
    return Data(
        x=dataset.features.to(compute_dtype(dataset.features.dtype)),
        edge_index=torch.stack([graph.indices, graph.row_ids()]),
        y=dataset.labels,
        num_nodes=graph.num_nodes,
        **masks,
    )


def _resolve_class(dataset: str | type) -> type:
    if isinstance(dataset, type):
        return dataset
    module_name, _, attr = str(dataset).rpartition(".")
    if not module_name:
        raise ValueError(
            f"PyG dataset class {dataset!r} must be a dotted path, e.g. torch_geometric.datasets.Planetoid"
        )
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"PyG dataset class {dataset!r} not found ({err})") from err


def load_pyg_dataset(
    dataset: str | type,
    root: str | Path | None = None,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    index: int = 0,
    splits: Mapping[str, Tensor] | None = None,
    make_undirected: bool = False,
    metric: str = "accuracy",
) -> GraphDataset:
    """Graph ``index`` of a PyG dataset class (e.g. ``torch_geometric.datasets.Planetoid`` with
    ``kwargs={"name": "Cora"}``), converted by ``from_pyg``.

    PyG downloads into ``root`` (default ``<data root>/pyg``, see ``graph.registry``) when the
    files are missing; when that fails (no network) this raises a one-line ``FileNotFoundError``
    saying where the files are expected.
    """
    import_pyg()
    cls = _resolve_class(dataset)
    kwargs = dict(kwargs or {})
    label = f"{cls.__name__}(name={kwargs['name']!r})" if "name" in kwargs else cls.__name__
    root = Path(root) if root is not None else data_root() / "pyg"
    try:
        pyg_dataset = cls(root=str(root), **kwargs)
    except OSError as err:  # URLError, aiohttp's connection errors and socket errors are OSErrors
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FileNotFoundError(
            f"PyG dataset {label}: files not found under {root} and the download failed ({reason}); "
            f"run once with network access or copy PyG's raw files under {root}"
        ) from err
    return from_pyg(
        pyg_dataset[index],
        name=name or str(kwargs.get("name", cls.__name__)).lower(),
        splits=splits,
        make_undirected=make_undirected,
        metric=metric,
    )
