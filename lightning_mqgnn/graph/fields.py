"""The checks of a dataset's fields given as plain arrays (tensors or numpy): edges, split ids or
masks, labels, and a seeded random split. Shared by ``GraphDataset.from_arrays``, ``load_arrays``
and ``from_pyg``; each failure is a one-line ``ValueError`` naming the field and the value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

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


def given_splits(who: str, splits: Mapping[str, Any], num_nodes: int) -> tuple[Tensor, Tensor, Tensor]:
    """``splits`` (``train``, ``val`` and ``test``, each node ids or a mask) as int64 ids, in that
    order."""
    if sorted(splits) != sorted(SPLITS):
        raise ValueError(f"{who}: splits= needs keys {list(SPLITS)}, got {sorted(splits)}")
    train, val, test = (split_ids(who, f"{s}_idx", splits[s], num_nodes) for s in SPLITS)
    return train, val, test


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
