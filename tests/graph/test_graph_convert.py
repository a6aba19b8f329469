"""The converters of published formats on small hand-made files: Planetoid's pickles (with
citeseer's gaps in the test index), and the seeded random split."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from lightning_mqgnn.graph import convert


def _write_planetoid(folder, name: str, test_index: list[int], n_allx: int = 6, n_train: int = 3) -> dict:
    """Planetoid's eight files: ``allx``/``ally`` rows are nodes 0..n_allx-1, ``tx``/``ty`` row i is
    node ``test_index[i]`` (the file's order, not sorted)."""
    rng = np.random.default_rng(0)
    width, classes = 5, 3
    allx = sp.csr_matrix(rng.integers(0, 2, (n_allx, width)).astype(np.float32))
    tx = sp.csr_matrix(rng.integers(1, 3, (len(test_index), width)).astype(np.float32))
    ally = np.eye(classes)[rng.integers(0, classes, n_allx)]
    ty = np.eye(classes)[rng.integers(0, classes, len(test_index))]
    graph = collections.defaultdict(list, {0: [1, 2], 1: [0], 2: [0, max(test_index)], max(test_index): [2]})
    parts = {
        "x": allx[:n_train],
        "y": ally[:n_train],
        "allx": allx,
        "ally": ally,
        "tx": tx,
        "ty": ty,
        "graph": graph,
    }
    files = {}
    for part, value in parts.items():
        path = folder / f"ind.{name}.{part}"
        path.write_bytes(pickle.dumps(value, protocol=2))
        files[path.name] = path
    path = folder / f"ind.{name}.test.index"
    path.write_text("".join(f"{i}\n" for i in test_index))
    files[path.name] = path
    return {"files": files, "allx": allx, "tx": tx, "ally": ally, "ty": ty}


def test_planetoid_places_test_rows_by_index_and_fills_gaps(tmp_path):
    test_index = [9, 6, 8]  # node 7 has no published row (as 15 of citeseer's ids have none)
    made = _write_planetoid(tmp_path, "tiny", test_index)
    arrays = convert.planetoid(made["files"], "tiny")
    x = sp.csr_matrix(
        (arrays["x_data"], arrays["x_indices"], arrays["x_indptr"]), shape=tuple(arrays["x_shape"])
    )
    assert x.shape == (10, 5)
    dense, tx = x.toarray(), made["tx"].toarray()
    assert np.array_equal(dense[:6], made["allx"].toarray())
    for row, node in enumerate(test_index):
        assert np.array_equal(dense[node], tx[row]), node
        assert arrays["y"][node] == made["ty"][row].argmax()
    assert not dense[7].any() and arrays["y"][7] == 0
    assert np.array_equal(arrays["train_idx"], [0, 1, 2]) and np.array_equal(arrays["test_idx"], [6, 8, 9])
    assert np.array_equal(arrays["val_idx"], np.arange(3, 503)[:500])  # the next 500 ids, by convention
    adj = sp.csr_matrix(
        (np.ones(arrays["indices"].size), arrays["indices"], arrays["indptr"]), shape=(10, 10)
    )
    assert (adj != adj.T).nnz == 0 and adj[2, 9] == 1 and adj.diagonal().sum() == 0


def test_planetoid_graph_beyond_the_nodes_is_named(tmp_path):
    made = _write_planetoid(tmp_path, "tiny", [6, 7, 8])
    bad = collections.defaultdict(list, {0: [42]})
    made["files"]["ind.tiny.graph"].write_bytes(pickle.dumps(bad, protocol=2))
    with pytest.raises(ValueError, match=r"ind\.tiny\.graph: node id 42 outside \[0, 9\)"):
        convert.planetoid(made["files"], "tiny")


def test_random_split_sizes_and_seed():
    a = convert.random_split(101, seed=0)
    assert [len(p) for p in a] == [60, 20, 21]
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(101))
    b = convert.random_split(101, seed=1)
    assert not np.array_equal(a[0], b[0])
