"""load_ogb on tiny datasets written in OGB's exact on-disk layout (no network): first load
parses the CSVs, second load reads OGB's torch cache (the torch>=2.6 weights_only trap)."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_mqgnn.graph.ogb import OGB_DATASETS, OgbSpec, load_ogb


def _csv(path: Path, rows: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, np.atleast_2d(rows.T).T if rows.ndim == 1 else rows, fmt=fmt, delimiter=",")


def _write_layout(root: Path, folder: str, split: str, n: int, edges: np.ndarray, rng) -> Path:
    d = root / folder
    _csv(d / "raw" / "edge.csv.gz", edges, "%d")
    _csv(d / "raw" / "num-node-list.csv.gz", np.array([n]), "%d")
    _csv(d / "raw" / "num-edge-list.csv.gz", np.array([len(edges)]), "%d")
    perm = rng.permutation(n)
    for part, ids in zip(("train", "valid", "test"), np.split(perm, [n // 2, 3 * n // 4])):
        _csv(d / "split" / split / f"{part}.csv.gz", np.sort(ids), "%d")
    return d


def _tiny_edges(n: int, m: int, rng) -> np.ndarray:
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    pairs = np.unique(np.stack([np.minimum(src, dst), np.maximum(src, dst)], 1)[keep], axis=0)
    return pairs


def write_tiny_arxiv(root: Path, n: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    edges = _tiny_edges(n, 150, rng)
    d = _write_layout(root, "ogbn_arxiv", "time", n, edges, rng)
    feat = rng.standard_normal((n, 4)).astype(np.float32)
    labels = rng.integers(0, 40, n)
    _csv(d / "raw" / "node-feat.csv.gz", feat, "%.6f")
    _csv(d / "raw" / "node-label.csv.gz", labels, "%d")
    _csv(d / "raw" / "node_year.csv.gz", rng.integers(2010, 2020, n), "%d")
    return edges, feat, labels


def _edge_set(graph) -> set[tuple[int, int]]:
    rows = graph.row_ids()
    return set(zip(graph.indices.tolist(), rows.tolist()))


def test_arxiv_layout_loads_twice(tmp_path):
    edges, feat, labels = write_tiny_arxiv(tmp_path)
    folder = tmp_path / "ogbn_arxiv"
    assert not (folder / "RELEASE_v1.txt").exists() and not (folder / "processed").exists()
    first = load_ogb("ogbn-arxiv", tmp_path)
    assert (folder / "processed" / "data_processed").is_file() and (folder / "RELEASE_v1.txt").is_file()
    (folder / "raw" / "edge.csv.gz").unlink()  # the second load can only come from OGB's cache
    second = load_ogb("arxiv", tmp_path)
    for ds in (first, second):
        assert ds.name == "ogbn-arxiv" and ds.num_nodes == 50 and ds.num_classes == 40
        assert ds.metric == "accuracy" and ds.graph.is_symmetric()
        expected = {(int(a), int(b)) for a, b in edges} | {(int(b), int(a)) for a, b in edges}
        assert _edge_set(ds.graph) == expected  # reverse edges added, nothing else
        assert torch.allclose(ds.features, torch.from_numpy(feat), atol=1e-6)
        assert torch.equal(ds.labels, torch.from_numpy(labels))
        assert ds.train_idx.numel() == 25 and ds.val_idx.numel() == 12 and ds.test_idx.numel() == 13
    directed = load_ogb("arxiv", tmp_path, make_undirected=False)
    assert directed.graph.num_edges == len(edges)


def test_proteins_layout_multilabel_and_edge_feature_mean(tmp_path):
    rng = np.random.default_rng(1)
    n = 40
    edges = _tiny_edges(n, 120, rng)
    d = _write_layout(tmp_path, "ogbn_proteins", "species", n, edges, rng)
    efeat = rng.random((len(edges), 8)).astype(np.float32)
    labels = rng.integers(0, 2, (n, 112))
    _csv(d / "raw" / "edge-feat.csv.gz", efeat, "%.6f")
    _csv(d / "raw" / "node-label.csv.gz", labels, "%d")
    _csv(d / "raw" / "node_species.csv.gz", rng.integers(0, 3, n), "%d")
    for _ in range(2):  # second round reads the cache
        ds = load_ogb("ogbn-proteins", tmp_path)
        assert ds.multilabel and ds.labels.dtype == torch.float32 and ds.labels.shape == (n, 112)
        assert torch.equal(ds.labels, torch.from_numpy(labels.astype(np.float32)))
        assert ds.num_classes == 112 and ds.metric == "rocauc" and ds.num_features == 8
        for v in range(n):
            incident = (edges[:, 0] == v) | (edges[:, 1] == v)
            want = efeat[incident].mean(0) if incident.any() else np.zeros(8, np.float32)
            assert np.allclose(ds.features[v].numpy(), want, atol=1e-5), v


def test_products_layout(tmp_path):
    rng = np.random.default_rng(2)
    n = 30
    edges = _tiny_edges(n, 80, rng)
    d = _write_layout(tmp_path, "ogbn_products", "sales_ranking", n, edges, rng)
    _csv(d / "raw" / "node-feat.csv.gz", rng.standard_normal((n, 3)), "%.6f")
    _csv(d / "raw" / "node-label.csv.gz", rng.integers(0, 47, n), "%d")
    ds = load_ogb("products", tmp_path)
    assert ds.num_classes == 47 and ds.graph.num_edges == 2 * len(edges) and ds.graph.is_symmetric()


def test_missing_files_raise_when_downloads_are_off_or_impossible(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"ogbn-arxiv: not found under .*nowhere.*downloads are off"):
        load_ogb("arxiv", tmp_path / "nowhere", download=False)
    # offline: the host does not resolve; one clear error, quickly, and nothing written
    monkeypatch.setitem(OGB_DATASETS, "ogbn-arxiv", _spec_at("http://nohost.invalid/ogb"))
    with pytest.raises(FileNotFoundError, match=r"nohost.invalid/ogb/arxiv.zip cannot be reached"):
        load_ogb("arxiv", tmp_path)
    assert not (tmp_path / "ogbn_arxiv").exists()
    write_tiny_arxiv(tmp_path)
    for f in (tmp_path / "ogbn_arxiv" / "split" / "time").iterdir():
        f.unlink()
    with pytest.raises(FileNotFoundError, match=r"split files not found"):
        load_ogb("arxiv", tmp_path)
    with pytest.raises(ValueError, match="unknown OGB dataset 'ogbn-mag'"):
        load_ogb("ogbn-mag", tmp_path)


def _spec_at(base: str) -> OgbSpec:
    return dataclasses.replace(OGB_DATASETS["ogbn-arxiv"], url=f"{base}/arxiv.zip")


def test_missing_files_are_downloaded_with_ogbs_downloader(tmp_path, monkeypatch):
    """A real HTTP download of a zip in OGB's published layout (``arxiv/raw/...``), served locally."""
    served = tmp_path / "served"
    edges, feat, labels = write_tiny_arxiv(served / "build")
    (served / "build" / "ogbn_arxiv").rename(served / "build" / "arxiv")
    shutil.make_archive(str(served / "arxiv"), "zip", served / "build", "arxiv")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setitem(OGB_DATASETS, "ogbn-arxiv", _spec_at(f"http://127.0.0.1:{server.server_port}"))
        root = tmp_path / "fresh" / "ogb"  # not there yet: created
        ds = load_ogb("arxiv", root)
        server.shutdown()
    assert ds.num_nodes == 50 and torch.equal(ds.labels, torch.from_numpy(labels))
    assert torch.allclose(ds.features, torch.from_numpy(feat), atol=1e-6)
    assert (root / "ogbn_arxiv" / "raw" / "edge.csv.gz").is_file() and not (root / "arxiv.zip").exists()
    assert load_ogb("arxiv", root, download=False).num_nodes == 50  # now local


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_torch_load_is_not_patched_globally(tmp_path):
    write_tiny_arxiv(tmp_path)
    load_ogb("arxiv", tmp_path)
    load_ogb("arxiv", tmp_path)
    import ogb.nodeproppred.dataset as ogb_dataset

    assert ogb_dataset.torch is torch
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        torch.load(tmp_path / "ogbn_arxiv" / "processed" / "data_processed")  # the default stays safe
