"""Your own graph as arrays: ``from_arrays`` takes tensors or numpy arrays, ``load_arrays`` takes
files (``.npy``, ``.npz``, ``.pt``, or a CSV edge list). Both end in ``validate_dataset``, as every
loader does, so a bad input gets the same one-line ``ValueError`` naming the field and value.

The field checks here (edges, split ids or masks, labels) are shared with ``from_pyg``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.validate import converted_dataset

SPLITS = ("train", "val", "test")


def as_tensor(who: str, key: str, value: Any) -> Tensor:
    """A tensor or numpy array as a CPU tensor; anything else is named in the error."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise ValueError(f"{who}: field '{key}' is a numpy object array; expected numbers")
        return torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, Tensor):
        raise ValueError(
            f"{who}: field '{key}' must be a torch.Tensor or numpy array, got {type(value).__name__}"
        )
    return value.detach().cpu()


def edge_pairs(who: str, edge_index: Any, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``edge_index`` as (source, target): integers ``[2, E]`` (or ``[E, 2]``, one edge a row) with
    ids in ``[0, N)``."""
    edge_index = as_tensor(who, "edge_index", edge_index)
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise ValueError(f"{who}: field 'edge_index' must hold integers, got dtype {edge_index.dtype}")
    if edge_index.dim() == 2 and edge_index.shape[0] != 2 and edge_index.shape[1] == 2:
        edge_index = edge_index.T
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"{who}: field 'edge_index' has shape {tuple(edge_index.shape)}, expected [2, E]")
    edge_index = edge_index.to(torch.int64)
    if edge_index.numel():
        out = torch.nonzero((edge_index < 0) | (edge_index >= num_nodes))
        if out.numel():
            r, e = int(out[0, 0]), int(out[0, 1])
            raise ValueError(
                f"{who}: field 'edge_index' has node id {int(edge_index[r, e])} outside [0, {num_nodes}) "
                f"(edge {e}, row {r})"
            )
    return edge_index[0], edge_index[1]


def split_ids(who: str, key: str, value: Any, num_nodes: int) -> Tensor:
    """A boolean (or 0/1) mask of length N, or a 1-D array of node ids, as int64 ids. A bool array
    is a mask whatever its name; an integer one is a mask only under a ``*_mask`` name."""
    value = as_tensor(who, key, value)
    if value.dim() != 1:
        raise ValueError(
            f"{who}: field '{key}' has shape {tuple(value.shape)}, expected 1-D (several split columns: "
            "pick one and pass it in splits=)"
        )
    if key.endswith("_mask") or value.dtype == torch.bool:
        if value.numel() != num_nodes:
            raise ValueError(f"{who}: field '{key}' has {value.numel()} entries, expected {num_nodes}")
        if value.dtype != torch.bool:
            bad = value[(value != 0) & (value != 1)]
            if bad.numel():
                raise ValueError(f"{who}: field '{key}' is not a 0/1 mask: has value {bad[0].item()}")
        return torch.nonzero(value.bool()).reshape(-1)
    if value.dtype.is_floating_point or value.is_complex():
        raise ValueError(f"{who}: field '{key}' must hold integer node ids, got dtype {value.dtype}")
    return value.to(torch.int64)


def label_tensor(who: str, y: Any) -> Tensor:
    """int64 ``[N]`` classes (``[N, 1]`` accepted), or float32 0/1 ``[N, T]`` multi-label;
    anything else is passed on for ``validate_dataset`` to name."""
    y = as_tensor(who, "labels", y)
    if y.dim() == 2 and y.shape[1] == 1 and not y.is_floating_point():
        y = y.reshape(-1)  # [N, 1] class ids (OGB's layout)
    if y.dim() == 1 and not y.is_floating_point() and y.dtype != torch.bool:
        return y.to(torch.int64)
    if y.dim() == 2:
        return y.to(torch.float32)
    return y


def random_split(num_nodes: int, fractions: Sequence[float], seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """A seeded random (train, val, test) split with the given fractions of the nodes; fractions
    that sum below 1 leave the rest out of every split."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(
            f"split_fractions must be three non-negative fractions (train, val, test) summing to at most 1, "
            f"got {list(fractions)}"
        )
    perm = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))
    n_train, n_val = int(fractions[0] * num_nodes), int(fractions[1] * num_nodes)
    n_test = min(int(round(fractions[2] * num_nodes)), num_nodes - n_train - n_val)
    parts = perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val : n_train + n_val + n_test]
    return tuple(p.sort().values for p in parts)


def from_arrays(
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
    """A validated ``GraphDataset`` from plain arrays (torch tensors or numpy arrays).

    ``edge_index``: integer ``[2, E]`` (or ``[E, 2]``), edge ``u -> v`` making ``u`` an
    in-neighbour of ``v``; symmetrised unless ``make_undirected=False``; self loops and duplicates
    are dropped. ``features``: ``[N, F]`` numbers (float32 in the dataset). ``labels``: ``[N]``
    classes, or 0/1 ``[N, T]`` for a multi-label task (then ``metric="rocauc"``). ``splits``:
    ``{"train": ..., "val": ..., "test": ...}``, each node ids or a boolean mask; without it, a
    random split with ``split_fractions`` of the nodes, drawn with ``seed``. ``source`` (e.g. the
    files) is named in error messages beside ``name``.
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
        if sorted(splits) != sorted(SPLITS):
            raise ValueError(f"{who}: splits needs keys {list(SPLITS)}, got {sorted(splits)}")
        split = tuple(split_ids(who, f"{s}_idx", splits[s], num_nodes) for s in SPLITS)
    return converted_dataset(name, graph, features, labels, split, num_classes, metric, source)


def load_arrays(
    edges: str | Path,
    features: str | Path,
    labels: str | Path,
    splits: str | Path | Mapping[str, str | Path] | None = None,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    metric: str = "accuracy",
    name: str = "arrays",
    make_undirected: bool = True,
    num_classes: int | None = None,
) -> GraphDataset:
    """``from_arrays`` on files. Each of ``edges``, ``features`` and ``labels`` is a ``.npy``, a
    ``.pt`` (a tensor), or a ``.npz``/``.pt`` dict holding one array (or one under the field's
    name); ``edges`` may also be a ``.csv``/``.txt`` edge list, two integer columns a line (a header
    line and ``#`` comments are skipped). ``splits``: one ``.npz``/``.pt`` holding ``train``,
    ``val`` and ``test`` (ids or boolean masks), or a mapping of the three to files."""
    paths = {"edges": Path(edges), "features": Path(features), "labels": Path(labels)}
    arrays = {field: read_array(path, field) for field, path in paths.items()}
    split_arrays = None
    if isinstance(splits, Mapping):
        split_arrays = {s: read_array(Path(p), s) for s, p in splits.items()}
    elif splits is not None:
        split_arrays = _read_splits(Path(splits))
    source = ", ".join(f"{field}={path}" for field, path in paths.items())
    return from_arrays(
        arrays["edges"],
        arrays["features"],
        arrays["labels"],
        splits=split_arrays,
        split_fractions=split_fractions,
        seed=seed,
        metric=metric,
        name=name,
        make_undirected=make_undirected,
        num_classes=num_classes,
        source=source,
    )


_FIELD_KEYS = {
    "edges": ("edges", "edge_index"),
    "features": ("features", "x"),
    "labels": ("labels", "y"),
}


def read_array(path: Path, field: str) -> Any:
    """One array from ``path`` for ``field`` (see ``load_arrays`` for the formats)."""
    if not path.is_file():
        raise FileNotFoundError(f"{field} file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".txt", ".tsv"):
        if field != "edges":
            raise ValueError(
                f"{path}: a {suffix} file is read as an edge list; give {field} as .npy, .npz or .pt"
            )
        return read_edge_list(path)
    if suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a readable pickle-free .npy file ({err})") from err
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                return _pick(path, field, {k: f[k] for k in f.files})
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a readable pickle-free .npz file ({err})") from err
    if suffix == ".pt":
        try:
            value = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a foreign or truncated file: whatever the unpickler raises
            raise ValueError(
                f"{path}: not a readable .pt file of tensors ({str(err).splitlines()[0]})"
            ) from err
        return _pick(path, field, value) if isinstance(value, Mapping) else value
    raise ValueError(
        f"{path}: unknown file type {suffix!r} for {field}; expected .npy, .npz, .pt (or .csv for edges)"
    )


def _pick(path: Path, field: str, arrays: Mapping[str, Any]) -> Any:
    """The array of a multi-array file meant for ``field``: the only one, or the one under its name."""
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    for key in _FIELD_KEYS.get(field, (field,)):
        if key in arrays:
            return arrays[key]
    raise ValueError(
        f"{path}: holds {sorted(arrays)}; expected one array or one named {' or '.join(_FIELD_KEYS.get(field, (field,)))}"
    )


def _read_splits(path: Path) -> dict[str, Any]:
    if path.suffix.lower() not in (".npz", ".pt"):
        raise ValueError(f"{path}: splits are read from an .npz or .pt file holding train, val and test")
    held = (
        read_array(path, "splits")
        if path.suffix.lower() == ".pt"
        else dict(np.load(path, allow_pickle=False))
    )
    if not isinstance(held, Mapping):
        raise ValueError(f"{path}: expected a dict of train, val and test, got {type(held).__name__}")
    out = {}
    for s in SPLITS:
        key = next((k for k in (s, f"{s}_idx", f"{s}_mask") if k in held), None)
        if key is None:
            raise ValueError(f"{path}: no '{s}' (or '{s}_idx', '{s}_mask') in {sorted(held)}")
        out[s] = held[key]
    return out


def read_edge_list(path: Path) -> np.ndarray:
    """A text edge list, ``src,dst`` (comma, tab or spaces) a line, as int64 ``[E, 2]``; a bad line
    is named by its number."""
    delimiter = "," if path.suffix.lower() == ".csv" else None
    try:
        return np.loadtxt(path, dtype=np.int64, delimiter=delimiter, comments="#", ndmin=2)
    except ValueError:
        pass  # a header line, or a malformed one: find which
    edges = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            cells = [c.strip() for c in (text.split(delimiter) if delimiter else text.split())]
            try:
                if len(cells) != 2:
                    raise ValueError
                edges.append((int(cells[0]), int(cells[1])))
            except ValueError:
                if not edges and not any(c.lstrip("-").isdigit() for c in cells):
                    continue  # a header
                raise ValueError(
                    f"{path}: line {number} is {text!r}; expected two integer node ids (source, target)"
                ) from None
    if not edges:
        raise ValueError(f"{path}: no edges found (expected lines of two integer node ids)")
    return np.asarray(edges, dtype=np.int64)
