"""Load-time checks of a ``GraphDataset``: each failure is a ``ValueError`` naming the dataset,
the field and the offending value, so a bad file is diagnosed at load, not as a wrong gradient.

Policy on self loops and duplicate edges: the loaders (``from_edges``, ``load_npz``, ``load_ogb``,
``generate_graph``) remove them while building, so a ``CSRGraph`` handed over directly must not
contain them: GCN adds its own self loop (eq. 2) and a duplicate edge would double a neighbour's
weight in every aggregation (eq. 1, 17). Rows must be strictly increasing (sorted, no repeats).
Directed graphs are allowed; ``describe_graph`` reports whether the graph is symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.feature_dtypes import FEATURE_DTYPES, torch_dtype

METRICS = ("accuracy", "micro_f1", "rocauc")


class DatasetFields(Protocol):
    """What ``validate_dataset`` reads: the fields of a ``GraphDataset``."""

    name: str
    graph: CSRGraph
    features: Tensor
    labels: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    num_classes: int
    metric: str


Dataset = TypeVar("Dataset", bound=DatasetFields)


@dataclass(frozen=True)
class GraphReport:
    """Facts about a graph that are not errors but matter to a run (directed or not, skew)."""

    num_nodes: int
    num_edges: int
    symmetric: bool
    isolated_nodes: int
    max_degree: int
    mean_degree: float


def _where(name: str, source: str | None) -> str:
    return f"{name} ({source})" if source else name


def _check_index_tensor(who: str, field: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{who}: field '{field}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int64:
        raise ValueError(f"{who}: field '{field}' must be int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{who}: field '{field}' must be 1-D, got shape {tuple(t.shape)}")


def check_csr_structure(
    who: str,
    indptr: Tensor,
    indices: Tensor,
    num_rows: int,
    num_cols: int | None = None,
    *,
    fields: tuple[str, str] = ("indptr", "indices"),
) -> None:
    """indptr: int64, length rows + 1, starts at 0, non-decreasing, ends at nnz; indices in
    [0, num_cols) (``num_cols`` defaults to ``num_rows``: an adjacency matrix)."""
    f_ptr, f_idx = fields
    _check_index_tensor(who, f_ptr, indptr)
    _check_index_tensor(who, f_idx, indices)
    if num_rows < 1:
        raise ValueError(f"{who}: number of rows for '{f_ptr}' must be positive, got {num_rows}")
    if indptr.numel() != num_rows + 1:
        raise ValueError(
            f"{who}: field '{f_ptr}' has length {indptr.numel()}, expected {num_rows + 1} (rows + 1)"
        )
    if int(indptr[0]) != 0:
        raise ValueError(f"{who}: field '{f_ptr}' starts at {int(indptr[0])}, expected 0")
    step = indptr[1:] - indptr[:-1]
    bad = torch.nonzero(step < 0)
    if bad.numel():
        v = int(bad[0, 0])
        raise ValueError(
            f"{who}: field '{f_ptr}' decreases at row {v}: {f_ptr}[{v}] = {int(indptr[v])} > "
            f"{f_ptr}[{v + 1}] = {int(indptr[v + 1])}"
        )
    if int(indptr[-1]) != indices.numel():
        raise ValueError(
            f"{who}: field '{f_ptr}' ends at {int(indptr[-1])}, but '{f_idx}' holds {indices.numel()} entries"
        )
    bound = num_rows if num_cols is None else num_cols
    what = "node id" if num_cols is None else "column"
    if indices.numel():
        out = torch.nonzero((indices < 0) | (indices >= bound))
        if out.numel():
            value = int(indices[out[0, 0]])
            raise ValueError(f"{who}: field '{f_idx}' has {what} {value} outside [0, {bound})")


def check_simple_graph(who: str, graph: CSRGraph) -> None:
    """No self loops; each row strictly increasing (sorted, no duplicate edges)."""
    if graph.num_edges == 0:
        return
    rows = graph.row_ids()
    loops = torch.nonzero(rows == graph.indices)
    if loops.numel():
        v = int(rows[loops[0, 0]])
        raise ValueError(
            f"{who}: field 'indices' has a self loop at node {v} (loaders drop self loops; models add "
            f"their own)"
        )
    same_row = rows[1:] == rows[:-1]
    not_increasing = torch.nonzero(same_row & (graph.indices[1:] <= graph.indices[:-1]))
    if not_increasing.numel():
        i = int(not_increasing[0, 0])
        v, a, b = int(rows[i]), int(graph.indices[i]), int(graph.indices[i + 1])
        what = f"duplicate edge {b} -> {v}" if a == b else f"unsorted row: {a} before {b}"
        raise ValueError(f"{who}: field 'indices' in row {v} has a {what} (rows must be strictly increasing)")


def check_features(who: str, features: Tensor, num_nodes: int, featureless: bool = False) -> None:
    """``[N, F]`` float32 (or float16/bfloat16, as features on disk may be stored) with every
    value finite; names the first bad node and column. ``featureless``: ``[N, 0]`` is allowed too
    (a link-prediction dataset whose model learns its nodes' inputs)."""
    if not isinstance(features, Tensor):
        raise ValueError(f"{who}: field 'features' must be a torch.Tensor, got {type(features).__name__}")
    least = 0 if featureless else 1
    if features.dim() != 2 or features.shape[0] != num_nodes or features.shape[1] < least:
        raise ValueError(
            f"{who}: field 'features' has shape {tuple(features.shape)}, expected [{num_nodes}, F] with F >= {least}"
        )
    if features.dtype not in [torch_dtype(name) for name in FEATURE_DTYPES]:
        raise ValueError(
            f"{who}: field 'features' must be float32, float16 or bfloat16, got {features.dtype}"
        )
    bad = torch.nonzero(~torch.isfinite(features))
    if bad.numel():
        v, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(
            f"{who}: field 'features' has non-finite value {float(features[v, c])} at node {v}, column {c}"
        )


def check_labels(who: str, labels: Tensor, num_nodes: int, num_classes: int) -> None:
    """int64 ``[N]`` in ``[0, C)``, or float32 ``[N, C]`` multi-label with values in {0, 1}."""
    if not isinstance(labels, Tensor):
        raise ValueError(f"{who}: field 'labels' must be a torch.Tensor, got {type(labels).__name__}")
    if num_classes < 1:
        raise ValueError(f"{who}: field 'num_classes' must be positive, got {num_classes}")
    if labels.dim() == 1:
        if labels.dtype != torch.int64:
            raise ValueError(f"{who}: field 'labels' (single-label) must be int64, got {labels.dtype}")
        if labels.numel() != num_nodes:
            raise ValueError(f"{who}: field 'labels' has {labels.numel()} entries, expected {num_nodes}")
        out = torch.nonzero((labels < 0) | (labels >= num_classes))
        if out.numel():
            v = int(out[0, 0])
            raise ValueError(
                f"{who}: field 'labels' has class {int(labels[v])} at node {v}, outside [0, {num_classes})"
            )
        return
    if labels.dim() == 2:
        if labels.dtype != torch.float32:
            raise ValueError(f"{who}: field 'labels' (multi-label) must be float32, got {labels.dtype}")
        if tuple(labels.shape) != (num_nodes, num_classes):
            raise ValueError(
                f"{who}: field 'labels' has shape {tuple(labels.shape)}, expected [{num_nodes}, {num_classes}]"
            )
        bad = torch.nonzero((labels != 0) & (labels != 1))  # NaN fails both comparisons too
        if bad.numel():
            v, t = int(bad[0, 0]), int(bad[0, 1])
            raise ValueError(
                f"{who}: field 'labels' has value {float(labels[v, t])} at node {v}, task {t}; expected 0 or 1"
            )
        return
    raise ValueError(f"{who}: field 'labels' must be 1-D or 2-D, got shape {tuple(labels.shape)}")


def check_splits(who: str, splits: dict[str, Tensor], num_nodes: int) -> None:
    """Each split: int64 ids in ``[0, N)``, non-empty, no repeats; splits pairwise disjoint."""
    owner = torch.full((num_nodes,), -1, dtype=torch.int64)
    names = list(splits)
    for k, (field, idx) in enumerate(splits.items()):
        _check_index_tensor(who, field, idx)
        if idx.numel() == 0:
            raise ValueError(f"{who}: field '{field}' is empty")
        out = torch.nonzero((idx < 0) | (idx >= num_nodes))
        if out.numel():
            raise ValueError(
                f"{who}: field '{field}' has node id {int(idx[out[0, 0]])} outside [0, {num_nodes})"
            )
        sorted_idx = torch.sort(idx).values
        rep = torch.nonzero(sorted_idx[1:] == sorted_idx[:-1])
        if rep.numel():
            raise ValueError(f"{who}: field '{field}' lists node id {int(sorted_idx[rep[0, 0]])} twice")
        taken = torch.nonzero(owner[idx] >= 0)
        if taken.numel():
            node = int(idx[taken[0, 0]])
            other = names[int(owner[node])]
            raise ValueError(f"{who}: fields '{other}' and '{field}' overlap: node id {node} is in both")
        owner[idx] = k


def check_no_node_task(who: str, ds: DatasetFields, num_nodes: int) -> None:
    """A dataset without a node task (``num_classes == 0``, link prediction): float32 labels
    ``[N, 0]`` and every node in ``train_idx`` (each may be an endpoint of a training edge: what
    samplers and caches that weigh the training nodes read), ``val_idx`` and ``test_idx`` empty."""
    if (
        not isinstance(ds.labels, Tensor)
        or ds.labels.dtype != torch.float32
        or tuple(ds.labels.shape)
        != (
            num_nodes,
            0,
        )
    ):
        what = tuple(ds.labels.shape) if isinstance(ds.labels, Tensor) else type(ds.labels).__name__
        raise ValueError(
            f"{who}: field 'labels' is {what}; a dataset without node labels (num_classes=0) holds float32 [{num_nodes}, 0]"
        )
    for field in ("train_idx", "val_idx", "test_idx"):
        _check_index_tensor(who, field, getattr(ds, field))
    if not torch.equal(ds.train_idx, torch.arange(num_nodes)) or ds.val_idx.numel() or ds.test_idx.numel():
        raise ValueError(
            f"{who}: a dataset without node labels (num_classes=0) has every node in 'train_idx' and "
            "'val_idx', 'test_idx' empty"
        )


def validate_dataset(ds: Dataset, *, source: str | None = None, require_symmetric: bool = False) -> Dataset:
    """Check every field of ``ds`` (see the module docstring); return ``ds`` unchanged.

    ``source`` (e.g. the file path) is added to messages next to the dataset name.
    ``require_symmetric`` turns a directed graph into an error (off by default).
    """
    who = _where(ds.name, source)
    if ds.metric not in METRICS:
        raise ValueError(f"{who}: field 'metric' is {ds.metric!r}, expected one of {METRICS}")
    g = ds.graph
    check_csr_structure(who, g.indptr, g.indices, g.num_nodes)
    check_simple_graph(who, g)
    if ds.num_classes == 0:  # no node task: a link-prediction dataset
        check_features(who, ds.features, g.num_nodes, featureless=True)
        check_no_node_task(who, ds, g.num_nodes)
    else:
        check_features(who, ds.features, g.num_nodes)
        check_labels(who, ds.labels, g.num_nodes, ds.num_classes)
        if ds.labels.dim() == 1 and ds.num_classes < 2:
            raise ValueError(
                f"{who}: field 'num_classes' is {ds.num_classes}; a single-label task needs >= 2"
            )
        check_splits(
            who, {"train_idx": ds.train_idx, "val_idx": ds.val_idx, "test_idx": ds.test_idx}, g.num_nodes
        )
    if require_symmetric and not g.is_symmetric():
        raise ValueError(
            f"{who}: field 'graph' is directed (not symmetric) but a symmetric graph is required"
        )
    return ds


def describe_graph(graph: CSRGraph) -> GraphReport:
    """Symmetry and degree facts (not errors: directed graphs are allowed)."""
    deg = graph.in_degrees()
    return GraphReport(
        num_nodes=graph.num_nodes,
        num_edges=graph.num_edges,
        symmetric=graph.is_symmetric(),
        isolated_nodes=int((deg == 0).sum()),
        max_degree=int(deg.max()) if graph.num_nodes else 0,
        mean_degree=graph.num_edges / max(graph.num_nodes, 1),
    )
