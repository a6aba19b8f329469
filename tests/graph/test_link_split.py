"""random_link_split, check_link_split, load_link_split_files and save/load_link_split: sizes, determinism, no leakage,
negatives that are non-edges, and one-line errors naming the field and value."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.graphs import random_graph

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.link_split import (
    LinkSplit,
    check_link_split,
    load_link_split,
    load_link_split_files,
    random_link_split,
    save_link_split,
)


def dense(graph: CSRGraph) -> torch.Tensor:
    """``adj[u, v]``: ``u -> v`` is an edge (an oracle independent of the key search)."""
    adj = torch.zeros(graph.num_nodes, graph.num_nodes, dtype=torch.bool)
    adj[graph.indices, graph.row_ids()] = True
    return adj


def directed_graph(n: int = 200, m: int = 1500, seed: int = 0) -> CSRGraph:
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g)
    return CSRGraph.from_edges(src, dst, n)


@pytest.fixture(scope="module")
def graph() -> CSRGraph:
    return random_graph(300, 2400, seed=0)


@pytest.fixture(scope="module")
def split(graph):
    return random_link_split(graph, seed=0, neg_per_source=20)


def test_sizes_are_pyg_fractions_of_undirected_edges(graph, split):
    train_graph, s = split
    num_undirected = graph.num_edges // 2
    assert s.val_pos.shape == (2, int(0.05 * num_undirected))
    assert s.test_pos.shape == (2, int(0.10 * num_undirected))
    assert s.train.shape[1] + s.val_pos.shape[1] + s.test_pos.shape[1] == num_undirected
    assert (s.train[0] < s.train[1]).all()  # each undirected edge once
    assert s.val_neg.shape == s.val_pos.shape and s.test_neg.shape == s.test_pos.shape
    assert s.val_neg_per_source.shape == (s.val_pos.shape[1], 20)
    assert s.test_neg_per_source.shape == (s.test_pos.shape[1], 20)
    assert train_graph.num_edges == 2 * s.train.shape[1] and train_graph.is_symmetric()


def test_deterministic_per_seed(graph):
    a, b = random_link_split(graph, seed=4)[1], random_link_split(graph, seed=4)[1]
    c = random_link_split(graph, seed=5)[1]
    for f in ("train", "val_pos", "test_pos", "val_neg", "test_neg"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.val_pos, c.val_pos) and not torch.equal(a.val_neg, c.val_neg)


def test_no_held_out_edge_in_training_graph_either_direction(graph, split):
    train_graph, s = split
    full, train_adj = dense(graph), dense(train_graph)
    for pos in (s.val_pos, s.test_pos):
        assert full[pos[0], pos[1]].all() and full[pos[1], pos[0]].all()
        assert not train_adj[pos[0], pos[1]].any() and not train_adj[pos[1], pos[0]].any()
    expected = torch.zeros_like(full)
    expected[s.train[0], s.train[1]] = True
    expected[s.train[1], s.train[0]] = True
    assert torch.equal(train_adj, expected)  # exactly the train edges, both directions


def test_negatives_are_distinct_non_edges_of_the_full_graph(graph, split):
    _, s = split
    full = dense(graph)
    for neg in (s.val_neg, s.test_neg):
        assert not full[neg[0], neg[1]].any() and not full[neg[1], neg[0]].any()
        assert (neg[0] != neg[1]).all()
        assert torch.unique(torch.minimum(*neg) * 300 + torch.maximum(*neg)).numel() == neg.shape[1]
    for pos, dst in ((s.val_pos, s.val_neg_per_source), (s.test_pos, s.test_neg_per_source)):
        src = pos[0].unsqueeze(1).expand_as(dst)
        assert not full[src, dst].any() and (src != dst).all()


def test_negative_counts_are_honoured(graph):
    _, s = random_link_split(graph, num_val_neg=500, num_test_neg=7)
    assert s.val_neg.shape == (2, 500) and s.test_neg.shape == (2, 7)
    assert "num_val_neg must be a positive count" in one_line(random_link_split, graph, num_val_neg=0)
    non_edges = 300 * 299 // 2 - graph.num_edges // 2
    message = one_line(random_link_split, graph, num_test_neg=non_edges + 1)
    assert f"cannot draw {non_edges + 1} negatives: the graph has {non_edges} non-edges" in message


def test_directed_split_holds_out_one_direction():
    graph = directed_graph()
    train_graph, s = random_link_split(graph, undirected=False, seed=1)
    full, train_adj = dense(graph), dense(train_graph)
    assert s.train.shape[1] + s.val_pos.shape[1] + s.test_pos.shape[1] == graph.num_edges
    for pos in (s.val_pos, s.test_pos):
        assert full[pos[0], pos[1]].all() and not train_adj[pos[0], pos[1]].any()
    assert torch.equal(train_adj[s.train[0], s.train[1]], torch.ones(s.train.shape[1], dtype=torch.bool))
    assert not full[s.val_neg[0], s.val_neg[1]].any()
    check_link_split(s, graph.num_nodes, graph)


def test_self_loops_are_never_candidates():
    src = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3])
    dst = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 3])
    graph = CSRGraph.from_edges(src, dst, 10, symmetrize=True, remove_self_loops=False)
    _, s = random_link_split(graph, val=0.2, test=0.2)
    every = torch.cat([s.train, s.val_pos, s.test_pos], 1)
    assert every.shape[1] == 10 and (every[0] != every[1]).all()


def test_a_graph_too_small_to_split_is_one_line():
    graph = CSRGraph.from_edges(torch.tensor([0]), torch.tensor([1]), 3, symmetrize=True)
    with pytest.raises(ValueError, match=r"1 candidate edges; .* leave none to train on") as err:
        random_link_split(graph)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="val and test must be fractions"):
        random_link_split(random_graph(), val=0.6, test=0.5)


def one_line(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        fn(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_check_names_an_id_out_of_range(split):
    _, s = split
    bad = s.test_neg.clone()
    bad[1, 3] = 300
    message = one_line(check_link_split, dataclasses.replace(s, test_neg=bad), 300, source="mine.npz")
    assert "mine.npz" in message and "'test_neg'" in message and "300 outside [0, 300)" in message


def test_check_names_an_empty_split(split):
    _, s = split
    empty = torch.empty(2, 0, dtype=torch.int64)
    message = one_line(check_link_split, dataclasses.replace(s, val_pos=empty), 300)
    assert "'val_pos' has no edges" in message


def test_check_counts_positives_shared_by_two_splits(split):
    _, s = split
    leaked = torch.cat([s.test_pos, s.val_pos[:, :3].flip(0)], 1)  # the reverse direction leaks too
    message = one_line(
        check_link_split, dataclasses.replace(s, test_pos=leaked, test_neg_per_source=None), 300
    )
    assert "'val_pos' and 'test_pos' share 3 edges" in message


def test_check_counts_negatives_that_are_true_edges(graph, split):
    train_graph, s = split
    bad = torch.cat([s.val_neg, s.test_pos[:, :2]], 1)
    message = one_line(check_link_split, dataclasses.replace(s, val_neg=bad), 300, source="run-7")
    assert "run-7" in message and "'val_neg' holds 2 true edges" in message
    message = one_line(check_link_split, dataclasses.replace(s, test_neg=s.train[:, :1]), 300)
    assert "'test_neg' holds 1 true edges" in message
    per_source = s.val_neg_per_source.clone()
    per_source[0, 0] = s.val_pos[1, 0]
    message = one_line(check_link_split, dataclasses.replace(s, val_neg_per_source=per_source), 300)
    assert "'val_neg_per_source' holds 1 true edges" in message
    check_link_split(s, 300, graph)
    check_link_split(s, 300, train_graph)


def test_check_catches_a_negative_present_only_in_the_full_graph():
    graph = random_graph(50, 300, seed=2)
    _, s = random_link_split(graph)
    s = dataclasses.replace(s, train=s.train[:, 1:], test_neg=s.train[:, :1])  # an edge no split lists
    check_link_split(s, 50)
    message = one_line(check_link_split, s, 50, graph)
    assert "'test_neg' holds 1 true edges" in message


def test_check_rejects_per_source_rows_that_do_not_match(split):
    _, s = split
    message = one_line(
        check_link_split, dataclasses.replace(s, val_neg_per_source=s.val_neg_per_source[1:]), 300
    )
    assert "'val_neg_per_source' has shape" in message and f"expected [{s.val_pos.shape[1]}, k]" in message


def write_split(folder, s: LinkSplit, fmt: str) -> dict:
    paths = {}
    for field in ("train", "val_pos", "test_pos", "val_neg", "test_neg"):
        pairs = getattr(s, field).numpy()
        if fmt == "npy":
            path = folder / f"{field}.npy"
            np.save(path, pairs if field != "val_pos" else pairs.T)  # [2, E] and [E, 2] both read
        else:
            path = folder / f"{field}.{fmt}"
            sep = "," if fmt == "csv" else " "
            header = f"source{sep}target\n" if field == "train" else ""
            path.write_text(header + "".join(f"{u}{sep}{v}\n" for u, v in pairs.T))
        paths[field] = path
    return paths


@pytest.mark.parametrize("fmt", ["csv", "txt", "npy"])
def test_files_round_trip(tmp_path, split, fmt):
    train_graph, s = split
    paths = write_split(tmp_path, s, fmt)
    np.save(tmp_path / "val_ps.npy", s.val_neg_per_source.numpy())
    loaded_graph, loaded = load_link_split_files(
        **paths, num_nodes=300, val_neg_per_source=tmp_path / "val_ps.npy"
    )
    for f in ("train", "val_pos", "test_pos", "val_neg", "test_neg", "val_neg_per_source"):
        assert torch.equal(getattr(loaded, f), getattr(s, f)), f
    assert loaded.test_neg_per_source is None
    assert torch.equal(loaded_graph.indptr, train_graph.indptr)
    assert torch.equal(loaded_graph.indices, train_graph.indices)


def test_files_infer_num_nodes_and_name_a_bad_file(tmp_path, split):
    _, s = split
    paths = write_split(tmp_path, s, "csv")
    _, loaded = load_link_split_files(**paths)
    assert (
        loaded.num_nodes
        == int(torch.cat([s.train, s.val_pos, s.test_pos, s.val_neg, s.test_neg], 1).max()) + 1
    )
    paths["test_pos"].write_text("0,1\n2,900\n")
    message = one_line(load_link_split_files, **paths, num_nodes=300)
    assert str(paths["test_pos"]) in message and "'test_pos'" in message and "900 outside [0, 300)" in message
    paths["test_pos"].write_text(f"{int(s.val_pos[1, 0])},{int(s.val_pos[0, 0])}\n")
    message = one_line(load_link_split_files, **paths, num_nodes=300)
    assert "'val_pos'" in message and "'test_pos'" in message and "share 1 edges" in message
    assert str(paths["val_pos"]) in message
    paths["test_pos"].write_text("0,1\n1,x\n")
    message = one_line(load_link_split_files, **paths)
    assert str(paths["test_pos"]) in message and "line 2" in message


def test_a_saved_split_reads_back_whole_from_one_file(tmp_path, graph):
    train_graph, s = random_link_split(graph, seed=3, neg_per_source=5)
    path = save_link_split(s, tmp_path / "split.npz")
    loaded_graph, loaded = load_link_split(path, num_nodes=graph.num_nodes)
    for f in (
        "train",
        "val_pos",
        "test_pos",
        "val_neg",
        "test_neg",
        "val_neg_per_source",
        "test_neg_per_source",
    ):
        assert torch.equal(getattr(loaded, f), getattr(s, f)), f
    assert (loaded.num_nodes, loaded.undirected) == (s.num_nodes, s.undirected)
    assert torch.equal(loaded_graph.indptr, train_graph.indptr)
    assert torch.equal(loaded_graph.indices, train_graph.indices)
    _, plain = random_link_split(graph, seed=3)  # no per-source negatives: none read back
    _, loaded = load_link_split(save_link_split(plain, tmp_path / "plain.npz"))
    assert loaded.val_neg_per_source is None and loaded.test_neg_per_source is None


def test_a_split_file_of_another_graph_or_format_is_refused_in_one_line(tmp_path, graph):
    _, s = random_link_split(graph, seed=3)
    path = save_link_split(s, tmp_path / "split.npz")
    message = one_line(load_link_split, path, num_nodes=graph.num_nodes + 1)
    assert (
        str(path) in message
        and f"a split of {graph.num_nodes} nodes, the graph has {graph.num_nodes + 1}" in message
    )
    np.savez(tmp_path / "edges.npz", edges=s.train.numpy())
    message = one_line(load_link_split, tmp_path / "edges.npz")
    assert "no num_nodes, test_neg, test_pos, train, undirected, val_neg, val_pos" in message
    with pytest.raises(FileNotFoundError, match="link split file not found"):
        load_link_split(tmp_path / "missing.npz")
