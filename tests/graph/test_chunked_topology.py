"""The chunked Chung-Lu topology: edges drawn in rounds and merged on disk by destination range
make a simple symmetric CSR of the requested degree and homophily, written to disk as generated
in memory, without the edge list in memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_mqgnn.graph import chung_lu, edge_buckets, generate_graph, generated
from lightning_mqgnn.graph.edge_buckets import EdgeBuckets
from lightning_mqgnn.graph.generated import write_generated_graph
from lightning_mqgnn.graph.ondisk import open_dataset


@pytest.fixture
def small_rounds(monkeypatch):
    """Rounds of 16k stubs and destination ranges of 32 KiB: many of both on a small graph."""
    monkeypatch.setattr(chung_lu, "STUBS_PER_CHUNK", 1 << 14)
    monkeypatch.setattr(edge_buckets, "BUCKET_BYTES", 1 << 15)


def _keys(graph) -> torch.Tensor:
    rows = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.indptr.diff())
    return rows * graph.num_nodes + graph.indices, rows


def test_a_chunked_graph_is_simple_symmetric_sorted_and_of_the_pairings_shape(small_rounds):
    chunked = generate_graph("arxiv", scale=0.05, seed=3, topology="chunked")
    paired = generate_graph("arxiv", scale=0.05, seed=3)
    g = chunked.graph
    keys, rows = _keys(g)
    assert bool((keys.diff() > 0).all())  # each row ascending, no duplicate
    assert bool((rows != g.indices).all())  # no self loop
    transposed = torch.sort(g.indices * g.num_nodes + rows).values
    assert torch.equal(transposed, keys)  # symmetric
    assert chunked.name == "generated-arxiv-x0.05-chunked"
    assert abs(g.num_edges / paired.graph.num_edges - 1) < 0.02  # the shortfall redrawn as in pairing
    homophily = (chunked.labels[rows] == chunked.labels[g.indices]).float().mean().item()
    paired_keys, paired_rows = _keys(paired.graph)
    paired_h = (paired.labels[paired_rows] == paired.labels[paired.graph.indices]).float().mean().item()
    assert abs(homophily - paired_h) < 0.02
    degrees = g.in_degrees().float()
    assert degrees.max() > 10 * degrees.mean()  # the power law survives the rounds
    assert not torch.equal(g.indptr, paired.graph.indptr)  # rounds pair other stubs: another graph


def test_one_round_and_one_range_is_the_pairing_bit_for_bit():
    paired = generate_graph("arxiv", scale=0.02, seed=4)
    chunked = generate_graph("arxiv", scale=0.02, seed=4, topology="chunked")
    assert torch.equal(chunked.graph.indptr, paired.graph.indptr)
    assert torch.equal(chunked.graph.indices, paired.graph.indices)
    assert torch.equal(chunked.features, paired.features)


def test_a_chunked_graph_written_as_drawn_is_generate_graphs_and_leaves_no_scratch(small_rounds, tmp_path):
    folder = write_generated_graph(
        tmp_path / "p", preset="papers100m", scale=2e-4, seed=2, topology="chunked"
    )
    in_memory = generate_graph("papers100m", scale=2e-4, seed=2, topology="chunked")
    on_disk = open_dataset(folder)
    for name in ("features", "labels", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(on_disk, name), getattr(in_memory, name)), name
    assert torch.equal(on_disk.graph.indptr, in_memory.graph.indptr)
    assert torch.equal(on_disk.graph.indices, in_memory.graph.indices)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == []  # the edge buckets are gone
    assert [p.name for p in tmp_path.iterdir()] == ["p"]


def test_buckets_merge_new_edges_into_merged_ones(tmp_path):
    buckets = EdgeBuckets(tmp_path, num_nodes=10, expected_entries=1)
    buckets.rows_per_bucket, buckets.num_buckets = 3, 4  # ranges 0-2, 3-5, 6-8, 9
    buckets.add_undirected(torch.tensor([0, 9, 4]), torch.tensor([5, 1, 0]))
    buckets.merge()
    buckets.add_undirected(torch.tensor([5, 2]), torch.tensor([0, 9]))  # 5-0 again, 2-9 new
    indptr = buckets.merge()
    columns = np.concatenate(list(buckets.column_chunks()))
    expected = {0: [4, 5], 1: [9], 2: [9], 4: [0], 5: [0], 9: [1, 2]}
    for node in range(10):
        assert columns[indptr[node] : indptr[node + 1]].tolist() == expected.get(node, []), node
    assert buckets.num_edges == 8 and list(tmp_path.iterdir()) == []


def test_an_unknown_topology_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"unknown topology 'stream'.*'pairing', 'chunked'"):
        generate_graph("arxiv", scale=0.01, topology="stream")
    assert generated.TOPOLOGIES == ("pairing", "chunked")
