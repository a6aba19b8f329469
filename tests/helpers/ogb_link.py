"""Tiny OGB link-prediction datasets in OGB's published layout (``raw/`` CSVs, ``split/<type>/``
``train.pt``/``valid.pt``/``test.pt``), zipped as OGB serves them and served by a local HTTP server."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import http.server
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch


@dataclass
class TinyLink:
    """What a tiny layout holds: its nodes, features (None: none) and split, as ``[E, 2]`` pairs
    (citation2: directed, with ``[E, k]`` per-source negatives)."""

    num_nodes: int
    features: np.ndarray | None
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    valid_neg: np.ndarray
    test_neg: np.ndarray


def _csv(path: Path, rows: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows.reshape(len(rows), -1), fmt=fmt, delimiter=",")


def _pairs(n: int, m: int, rng, directed: bool) -> np.ndarray:
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if not directed:
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
    return rng.permutation(np.unique(np.stack([src, dst], 1), axis=0))


def _non_edges(n: int, count: int, taken: set, rng, directed: bool) -> np.ndarray:
    out = []
    while len(out) < count:
        u, v = (int(x) for x in rng.integers(0, n, 2))
        key = (u, v) if directed else (min(u, v), max(u, v))
        if u != v and key not in taken:
            taken.add(key)
            out.append(key)
    return np.asarray(out, dtype=np.int64)


# name -> (zip folder, split type, directed, node features, additional raw files)
LAYOUTS = {
    "ogbl-collab": ("collab", "time", False, True, ("edge_weight", "edge_year")),
    "ogbl-ddi": ("ddi", "target", False, False, ()),
    "ogbl-citation2": ("citation-v2", "time", True, True, ("node_year",)),
}


def write_tiny_ogb_link(
    root: Path, name: str, n: int = 60, seed: int = 0, folder: str | None = None
) -> TinyLink:
    """``name``'s layout in ``root/<folder>`` (default OGB's folder, ``ogbl_collab``)."""
    download, split_type, directed, has_features, extra = LAYOUTS[name]
    rng = np.random.default_rng(seed)
    edges = _pairs(n, 6 * n, rng, directed)
    n_val = n_test = len(edges) // 10
    valid, test, train = edges[:n_val], edges[n_val : n_val + n_test], edges[n_val + n_test :]
    taken = {tuple(e) for e in edges.tolist()}
    k = 5 if directed else 1
    valid_neg = _non_edges(n, n_val * k, taken, rng, directed)
    test_neg = _non_edges(n, n_test * k, taken, rng, directed)
    d = root / (folder or name.replace("-", "_"))
    _csv(d / "raw" / "edge.csv.gz", train, "%d")
    _csv(d / "raw" / "num-node-list.csv.gz", np.array([n]), "%d")
    _csv(d / "raw" / "num-edge-list.csv.gz", np.array([len(train)]), "%d")
    features = rng.standard_normal((n, 3)).astype(np.float32) if has_features else None
    if features is not None:
        _csv(d / "raw" / "node-feat.csv.gz", features, "%.6f")
    for file in extra:
        _csv(
            d / "raw" / f"{file}.csv.gz",
            rng.integers(1, 3, n if file.startswith("node") else len(train)),
            "%d",
        )
    split = d / "split" / split_type
    split.mkdir(parents=True)
    if directed:  # citation2: numpy arrays of sources and targets, [E, k] negative targets
        parts = {
            "train": {"source_node": train[:, 0], "target_node": train[:, 1]},
            "valid": {
                "source_node": valid[:, 0],
                "target_node": valid[:, 1],
                "target_node_neg": valid_neg[:, 1].reshape(-1, k),
            },
            "test": {
                "source_node": test[:, 0],
                "target_node": test[:, 1],
                "target_node_neg": test_neg[:, 1].reshape(-1, k),
            },
        }
        # the per-source negatives must corrupt each positive's own source
        valid_neg = np.stack([np.repeat(valid[:, 0], k), valid_neg[:, 1]], 1)
        test_neg = np.stack([np.repeat(test[:, 0], k), test_neg[:, 1]], 1)
    else:
        t = torch.from_numpy
        parts = {
            "train": {"edge": t(train), "weight": torch.ones(len(train))},
            "valid": {"edge": t(valid), "edge_neg": t(valid_neg)},
            "test": {"edge": t(test), "edge_neg": t(test_neg)},
        }
    for part, content in parts.items():
        torch.save(content, split / f"{part}.pt")
    return TinyLink(n, features, train, valid, test, valid_neg, test_neg)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def served_ogb_link(tmp: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TinyLink]:
    """``name``'s tiny layout zipped as OGB publishes it (``<download>/raw/...``) and served locally,
    the registry's entry pointing at it while the context lasts."""
    from lightning_mqgnn.graph import ogb_link

    download = LAYOUTS[name][0]
    served = tmp / "served"
    tiny = write_tiny_ogb_link(served / "build", name, folder=download)
    shutil.make_archive(str(served / download), "zip", served / "build", download)
    handler = functools.partial(_QuietHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        entry = ogb_link.OGB_LINK_DATASETS[name]
        url = f"http://127.0.0.1:{server.server_port}/{download}.zip"
        local = dataclasses.replace(entry, spec=dataclasses.replace(entry.spec, url=url))
        monkeypatch.setitem(ogb_link.OGB_LINK_DATASETS, name, local)
        try:
            yield tiny
        finally:
            server.shutdown()
