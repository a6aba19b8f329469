"""Your own data for either task (``load_own_data``, ``data=arrays``): an edge list alone is a graph
for link prediction, without features or labels; split files make a ``LinkDataset``; labels make
a node classification dataset as before. Bad input is one line naming the file and field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.link_dataset import LinkDataset, link_only_dataset
from lightning_mqgnn.graph.own_data import load_own_data
from lightning_mqgnn.graph.validate import validate_dataset


def one_line(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        fn(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.fixture
def files(tmp_path):
    """A 40-node graph's edges (CSV), features, labels and a split of its undirected edges into
    files: train (CSV), val/test positives (.npy, [E, 2] and [2, E]), negatives (CSV, .npy)."""
    rng = np.random.default_rng(0)
    n = 40
    src = rng.integers(0, n, 300)
    dst = (src + rng.integers(1, 6, 300)) % n
    edges = np.unique(np.sort(np.stack([src, dst], 1), 1), axis=0)
    np.savetxt(tmp_path / "edges.csv", edges, fmt="%d", delimiter=",", header="src,dst", comments="")
    np.save(tmp_path / "x.npy", rng.standard_normal((n, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, n))
    perm = rng.permutation(edges)
    val, test, train = perm[:10], perm[10:20], perm[20:]
    taken = {tuple(e) for e in edges.tolist()}
    neg = []
    while len(neg) < 20:
        u, v = sorted(int(x) for x in rng.integers(0, n, 2))
        if u != v and (u, v) not in taken:
            taken.add((u, v))
            neg.append((u, v))
    neg = np.asarray(neg)
    np.savetxt(tmp_path / "train.csv", train, fmt="%d", delimiter=",")
    np.save(tmp_path / "val_pos.npy", val)
    np.save(tmp_path / "test_pos.npy", test.T)
    np.savetxt(tmp_path / "val_neg.txt", neg[:10], fmt="%d")
    np.save(tmp_path / "test_neg.npy", neg[10:])
    split = {f: tmp_path / name for f, name in [
        ("train", "train.csv"), ("val_pos", "val_pos.npy"), ("test_pos", "test_pos.npy"),
        ("val_neg", "val_neg.txt"), ("test_neg", "test_neg.npy"),
    ]}  # fmt: skip
    return {"dir": tmp_path, "edges": edges, "train": train, "val": val, "neg": neg, "split": split}


def test_an_edge_list_alone_is_a_graph_without_features_or_labels(files):
    ds = load_own_data(edges=files["dir"] / "edges.csv")
    assert isinstance(ds, GraphDataset) and ds.num_nodes == 40 and ds.graph.is_symmetric()
    assert ds.num_features == 0 and not ds.has_node_task and ds.labels.shape == (40, 0)
    assert torch.equal(ds.train_idx, torch.arange(40)) and ds.val_idx.numel() == 0
    assert ds.summary().endswith("no features, no node labels")
    with_features = load_own_data(edges=files["dir"] / "edges.csv", features=files["dir"] / "x.npy")
    assert with_features.num_features == 3 and not with_features.has_node_task


def test_labels_make_a_node_classification_dataset(files):
    d = files["dir"]
    ds = load_own_data(edges=d / "edges.csv", features=d / "x.npy", labels=d / "y.npy")
    assert ds.has_node_task and ds.num_classes == 3 and ds.val_idx.numel() > 0
    message = one_line(load_own_data, edges=d / "edges.csv", labels=d / "y.npy")
    assert "node classification reads edges, features and labels; no features file given" in message


def test_split_files_make_a_link_dataset_over_the_training_graph(files):
    d = files["dir"]
    data = load_own_data(edges=d / "edges.csv", link_split=files["split"])
    assert isinstance(data, LinkDataset) and data.hits_k is None and data.metric == "hits"
    s = data.split
    assert {tuple(p) for p in s.train.T.tolist()} == {tuple(p) for p in files["train"].tolist()}
    assert torch.equal(s.val_pos, torch.from_numpy(files["val"].T))
    assert torch.equal(s.val_neg, torch.from_numpy(files["neg"][:10].T))
    g = data.dataset.graph
    assert g.num_edges == 2 * len(files["train"]) and data.dataset.num_features == 0
    # without the full edge list, or with features: the same split
    alone = load_own_data(link_split={**files["split"], "val_neg_per_source": None})
    assert torch.equal(alone.split.test_neg, s.test_neg)
    featured = load_own_data(features=d / "x.npy", link_split=files["split"])
    assert featured.dataset.num_features == 3


def test_per_source_negatives_from_a_file(files):
    d = files["dir"]
    np.save(d / "val_ps.npy", np.tile(files["neg"][:10, 1:], (1, 4)))
    data = load_own_data(link_split={**files["split"], "val_neg_per_source": d / "val_ps.npy"})
    assert data.split.val_neg_per_source.shape == (10, 4) and data.split.test_neg_per_source is None


def test_bad_split_files_are_one_line_naming_the_file(files):
    d, split = files["dir"], files["split"]
    # a negative that is a true edge of the full graph (not in any split file): counted, file named
    bad = files["neg"][10:].copy()
    bad[:2] = files["train"][:2]
    np.save(d / "bad_neg.npy", bad)
    message = one_line(
        load_own_data, edges=d / "edges.csv", link_split={**split, "test_neg": d / "bad_neg.npy"}
    )
    assert f"'test_neg' ({d / 'bad_neg.npy'}) holds 2 true edges" in message
    # positives in two splits
    np.save(d / "overlap.npy", files["train"][:3])
    message = one_line(load_own_data, link_split={**split, "test_pos": d / "overlap.npy"})
    assert (
        "'train'" in message and f"'test_pos' ({d / 'overlap.npy'})" in message and "share 3 edges" in message
    )
    # an id outside the features' rows
    np.save(d / "x_small.npy", np.zeros((30, 2), np.float32))
    message = one_line(load_own_data, features=d / "x_small.npy", link_split=split)
    assert "outside [0, 30)" in message and str(d) in message
    # a split without edges
    (d / "loops.csv").write_text("3,3\n5,5\n")
    message = one_line(load_own_data, link_split={**split, "train": d / "loops.csv"})
    assert f"'train' ({d / 'loops.csv'}) has no edges" in message
    # a split missing a part
    message = one_line(load_own_data, link_split={"train": split["train"], "val_pos": split["val_pos"]})
    assert "no 'test_pos', 'val_neg', 'test_neg' given" in message
    assert "no edges: give an edge list" in one_line(load_own_data)


def test_edge_ids_beyond_the_features_name_the_edge_file(files):
    d = files["dir"]
    np.save(d / "x_small.npy", np.zeros((30, 2), np.float32))
    message = one_line(load_own_data, edges=d / "edges.csv", features=d / "x_small.npy")
    assert f"edges={d / 'edges.csv'}" in message and "outside [0, 30)" in message


def test_a_dataset_without_node_labels_is_validated_as_such(files):
    ds = load_own_data(edges=files["dir"] / "edges.csv")
    ds.val_idx = torch.tensor([1])
    assert "has every node in 'train_idx'" in one_line(validate_dataset, ds)
    graph = ds.graph
    assert link_only_dataset("g", graph).num_features == 0
