"""load_npz: malformed files fail with named fields; the real datasets load with their documented
sizes (cora as the registry converts its committed files; every dataset of the mirror with -m mirror)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import valid_npz_arrays, write_npz
from helpers.paths import MIRROR

from lightning_mqgnn.graph.npz import load_npz


def test_valid_file_loads(tmp_path):
    ds = load_npz(write_npz(tmp_path / "tiny.npz"))
    assert ds.name == "tiny" and ds.num_nodes == 10 and ds.graph.num_edges == 20
    assert ds.features.shape == (10, 6) and ds.features.dtype == torch.float32
    # 6 columns is not bag-of-words wide (> 64), so rows are not normalised by default
    assert torch.equal(ds.features.sum(1), torch.full((10,), 2.0))
    assert ds.num_classes == 3 and ds.metric == "accuracy"


def test_missing_file_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.npz"):
        load_npz(tmp_path / "nothere.npz")


def test_missing_key_names_file_and_key(tmp_path):
    path = write_npz(tmp_path / "cora.npz", x_data=None)
    with pytest.raises(ValueError, match=r"cora \(.*cora.npz\): missing key 'x_data'"):
        load_npz(path)


def test_out_of_range_neighbour(tmp_path):
    a = valid_npz_arrays()
    a["indices"][3] = 10
    path = write_npz(tmp_path / "cora.npz", indices=a["indices"])
    with pytest.raises(ValueError, match=r"cora \(.*\): field 'indices' has node id 10 outside \[0, 10\)"):
        load_npz(path)


def test_out_of_range_feature_column(tmp_path):
    a = valid_npz_arrays()
    a["x_indices"][5] = 6
    with pytest.raises(ValueError, match=r"field 'x_indices' has column 6 outside \[0, 6\)"):
        load_npz(write_npz(tmp_path / "d.npz", x_indices=a["x_indices"]))


def test_nan_feature_names_node_and_column(tmp_path):
    a = valid_npz_arrays()
    a["x_data"][7] = np.nan  # entry 7 = node 3, second non-zero, column (3 + 1) % 6 = 4
    with pytest.raises(ValueError, match=r"key 'x_data' has non-finite value nan at node 3, column 4"):
        load_npz(write_npz(tmp_path / "d.npz", x_data=a["x_data"]))


def test_label_out_of_range(tmp_path):
    y = valid_npz_arrays()["y"]
    y[2] = -1
    with pytest.raises(ValueError, match=r"field 'labels' has class -1 at node 2"):
        load_npz(write_npz(tmp_path / "d.npz", y=y))
    y[2] = 5
    with pytest.raises(ValueError, match=r"field 'labels' has class 5 at node 2, outside \[0, 3\)"):
        load_npz(write_npz(tmp_path / "d.npz", y=y), num_classes=3)
    binary = write_npz(tmp_path / "b.npz", metric=np.array("rocauc"))  # y holds class 2
    with pytest.raises(ValueError, match=r"field 'labels' has class 2 at node 2, outside \[0, 2\)"):
        load_npz(binary)


def test_overlapping_and_empty_splits(tmp_path):
    path = write_npz(tmp_path / "d.npz", val_idx=np.array([4, 5, 6]))
    with pytest.raises(ValueError, match=r"fields 'train_idx' and 'val_idx' overlap: node id 4 is in both"):
        load_npz(path)
    path = write_npz(tmp_path / "d.npz", test_idx=np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match=r"field 'test_idx' is empty"):
        load_npz(path)


def test_wrong_dtype_and_metric(tmp_path):
    with pytest.raises(ValueError, match=r"key 'train_idx' must hold integers, got dtype float64"):
        load_npz(write_npz(tmp_path / "d.npz", train_idx=np.arange(5.0)))
    with pytest.raises(ValueError, match=r"key 'metric' is 'f1'"):
        load_npz(write_npz(tmp_path / "d.npz", metric=np.array("f1")))


def test_not_an_npz(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"definitely not a zip")
    with pytest.raises(ValueError, match=r"junk \(.*junk.npz\): not a readable"):
        load_npz(path)


def test_graph_is_cleaned_and_symmetrised(tmp_path):
    # a directed 10-cycle (row v lists v-1) plus a self loop at node 0
    indptr = np.arange(11, dtype=np.int64)
    indptr[1:] += 1
    indices = np.concatenate([[0, 9], (np.arange(1, 10) - 1)]).astype(np.int64)
    path = write_npz(tmp_path / "d.npz", indptr=indptr, indices=indices)
    directed = load_npz(path, make_undirected=False)
    assert directed.graph.num_edges == 10 and not directed.graph.is_symmetric()
    undirected = load_npz(path)
    assert undirected.graph.num_edges == 20 and undirected.graph.is_symmetric()


def test_feature_reduction_and_normalisation(tmp_path):
    rng = np.random.default_rng(0)
    n, f = 10, 100
    dense = (rng.random((n, f)) < 0.2).astype(np.float32) * rng.integers(1, 4, (n, f)).astype(np.float32)
    dense[:, 7] = 1.0  # the most frequent column
    rows, cols = np.nonzero(dense)
    arrays = dict(
        x_indptr=np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(np.int64),
        x_indices=cols.astype(np.int64),
        x_data=dense[rows, cols],
        x_shape=np.array([n, f], dtype=np.int64),
    )
    path = write_npz(tmp_path / "bow.npz", **arrays)
    full = load_npz(path)  # non-negative and wider than 64 columns: rows normalised
    assert torch.allclose(full.features.sum(1), torch.ones(n))
    assert torch.allclose(full.features, torch.from_numpy(dense / dense.sum(1, keepdims=True)))
    raw = load_npz(path, normalize_features=False)
    assert torch.equal(raw.features, torch.from_numpy(dense))
    top = load_npz(path, max_features=5, normalize_features=False)
    counts = (dense != 0).sum(0)
    keep = np.sort(np.argsort(-counts, kind="stable")[:5])
    assert 7 in keep and torch.equal(top.features, torch.from_numpy(dense[:, keep]))
    proj = load_npz(path, max_features=16, feature_reduction="projection")
    again = load_npz(path, max_features=16, feature_reduction="projection")
    assert proj.features.shape == (n, 16) and torch.equal(proj.features, again.features)
    assert proj.features.abs().sum() > 0


# name: (nodes, undirected edges, features, classes, metric, split sizes) from data/README.md
REAL = {
    "cora": (2708, 5278, 1433, 7, "accuracy", (140, 500, 1000)),
    "citeseer": (3327, 4552, 3703, 6, "accuracy", (120, 500, 1000)),
    "amazon_photo": (7650, 119081, 745, 8, "accuracy", None),
    "amazon_computers": (13752, 245861, 767, 10, "accuracy", None),
    "coauthor_cs": (18333, 81894, 6805, 15, "accuracy", None),
    "coauthor_physics": (34493, 247962, 8415, 5, "accuracy", None),
    "dblp": (17716, 52867, 1639, 4, "accuracy", None),
    "tolokers": (11758, 519000, 10, 2, "rocauc", None),
}


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("cora", "served"),  # converted from tests/fixtures/planetoid
        *(pytest.param(name, "mirror", marks=pytest.mark.mirror) for name in sorted(REAL)),
    ],
)
def test_real_dataset_matches_readme(name, source, request):
    nodes, edges, feats, classes, metric, split = REAL[name]
    max_features = 1024 if feats > 3000 else None  # as conf/data/{citeseer,coauthor_*}.yaml
    folder = request.getfixturevalue("served_data_root") if source == "served" else MIRROR
    ds = load_npz(folder / f"{name}.npz", max_features=max_features)
    assert ds.num_nodes == nodes
    assert ds.graph.num_edges == 2 * edges and ds.graph.is_symmetric()
    assert ds.num_features == min(feats, max_features or feats)
    assert ds.num_classes == classes and ds.metric == metric
    assert int(ds.labels.max()) == classes - 1
    sizes = (ds.train_idx.numel(), ds.val_idx.numel(), ds.test_idx.numel())
    if split is not None:
        assert sizes == split
    else:  # random 60/20/20 or 50/25/25
        frac = sizes[0] / nodes
        assert 0.49 < frac < 0.61 and sum(sizes) == nodes
