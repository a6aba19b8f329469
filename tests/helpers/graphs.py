"""Small, hand-checkable graph datasets and npz files for the graph-layer tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset


def random_graph(n: int = 300, m: int = 2400, seed: int = 0, *, isolate_last: bool = False) -> CSRGraph:
    """``m`` uniformly random edges (symmetrized) among ``n`` nodes, seeded; ``isolate_last`` drops
    the edges touching node ``n - 1``, which then stays isolated on purpose."""
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g)
    if isolate_last:
        keep = (src != n - 1) & (dst != n - 1)
        src, dst = src[keep], dst[keep]
    return CSRGraph.from_edges(src, dst, n, symmetrize=True)


def ring_dataset(num_nodes: int = 12, num_features: int = 4, num_classes: int = 3) -> GraphDataset:
    """An undirected ring with valid features, labels and a 6/3/3-style split."""
    src = torch.arange(num_nodes)
    graph = CSRGraph.from_edges(src, (src + 1) % num_nodes, num_nodes, symmetrize=True)
    ids = torch.arange(num_nodes)
    return GraphDataset(
        name="ring",
        graph=graph,
        features=torch.randn(num_nodes, num_features, generator=torch.Generator().manual_seed(0)),
        labels=ids % num_classes,
        train_idx=ids[: num_nodes // 2],
        val_idx=ids[num_nodes // 2 : 3 * num_nodes // 4],
        test_idx=ids[3 * num_nodes // 4 :],
        num_classes=num_classes,
    )


def valid_npz_arrays(num_nodes: int = 10, num_cols: int = 6) -> dict[str, np.ndarray]:
    """A ring graph in the shared npz layout, with 2 non-zero features per node."""
    ds = ring_dataset(num_nodes)
    rows = np.repeat(np.arange(num_nodes), 2)
    cols = np.stack([np.arange(num_nodes) % num_cols, (np.arange(num_nodes) + 1) % num_cols], 1).reshape(-1)
    return {
        "indptr": ds.graph.indptr.numpy(),
        "indices": ds.graph.indices.numpy(),
        "x_indptr": np.arange(0, 2 * num_nodes + 1, 2, dtype=np.int64),
        "x_indices": cols.astype(np.int64),
        "x_data": np.ones(rows.size, dtype=np.float32),
        "x_shape": np.array([num_nodes, num_cols], dtype=np.int64),
        "y": (np.arange(num_nodes) % 3).astype(np.int64),
        "train_idx": np.arange(0, 5, dtype=np.int64),
        "val_idx": np.arange(5, 7, dtype=np.int64),
        "test_idx": np.arange(7, num_nodes, dtype=np.int64),
        "metric": np.array("accuracy"),
    }


def write_npz(path: Path, **changes: np.ndarray | None) -> Path:
    """Write ``valid_npz_arrays`` with some keys replaced (or dropped when given ``None``)."""
    arrays = valid_npz_arrays()
    for key, value in changes.items():
        if value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    np.savez(path, **arrays)
    return path
