"""Partition books: METIS and random owners, halo/send lists that match between peers, local
blocks that reproduce the full graph's aggregation, and refusal of books from other graphs."""

from __future__ import annotations

import sys

import pytest
import torch

from lightning_mqgnn.fullgraph import PartitionBook, partition_batch
from lightning_mqgnn.fullgraph.data import FullGraphDataModule
from lightning_mqgnn.graph.generated import generate_graph
from lightning_mqgnn.sampling.exact import exact_operator, full_block


def _dataset(seed: int = 3):
    return generate_graph("arxiv", num_nodes=300, mean_degree=6.0, num_features=8, num_classes=4, seed=seed)


@pytest.mark.parametrize("method", ["metis", "random"])
def test_halo_and_send_lists_match_between_peers(method):
    ds = _dataset()
    book = PartitionBook.build(ds.graph, 4, method)
    parts = [book.local(ds.graph, r, "gcn") for r in range(4)]
    assert sorted(torch.cat([p.inner for p in parts]).tolist()) == list(range(ds.num_nodes))
    for r, part in enumerate(parts):
        for p, peer in enumerate(parts):
            # what r receives from p is exactly what p sends to r, in the same order
            assert torch.equal(part.halo[p], peer.inner[peer.send_idx[r]])


def test_metis_cuts_fewer_edges_than_random():
    ds = _dataset()
    metis = PartitionBook.build(ds.graph, 4, "metis").edge_cut(ds.graph)
    random = PartitionBook.build(ds.graph, 4, "random").edge_cut(ds.graph)
    assert metis < 0.7 * random


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
def test_local_blocks_reproduce_the_full_graph_aggregation(aggregation):
    ds = _dataset()
    full, _ = full_block(ds.graph, torch.arange(ds.num_nodes), exact_operator(ds.graph, aggregation))
    expected = full.aggregate(ds.features)
    book = PartitionBook.build(ds.graph, 3, "metis")
    for r in range(3):
        batch = partition_batch(ds, book, r, aggregation)
        torch.testing.assert_close(batch.block.aggregate(batch.features), expected[batch.partition.inner])


def test_book_round_trip_and_refusal_of_another_graph(tmp_path):
    ds = _dataset()
    book = PartitionBook.build(ds.graph, 4, "metis")
    path = tmp_path / "book.pt"
    book.save(path)
    assert torch.equal(PartitionBook.load(path, ds.graph).parts, book.parts)
    other = _dataset(seed=4)
    with pytest.raises(ValueError, match="made for another graph"):
        PartitionBook.load(path, other.graph)


def test_datamodule_refuses_a_book_with_another_number_of_parts(tmp_path):
    ds = _dataset()
    path = tmp_path / "book.pt"
    PartitionBook.build(ds.graph, 2, "metis").save(path)
    dm = FullGraphDataModule(ds, book_path=str(path))
    with pytest.raises(ValueError, match="2 parts, the run needs 4"):
        dm.partition_book(4)


def test_more_ranks_than_nodes_is_refused():
    ds = _dataset()
    with pytest.raises(ValueError, match="only 300 nodes"):
        FullGraphDataModule(ds).partition_book(301)
    with pytest.raises(ValueError, match="cannot split a graph of 300 nodes into 400"):
        PartitionBook.build(ds.graph, 400)


def test_empty_partition_is_refused():
    ds = _dataset()
    parts = torch.zeros(ds.num_nodes, dtype=torch.int64)
    parts[:10] = 1
    book = PartitionBook(parts, 3, "x", "metis")
    with pytest.raises(ValueError, match=r"left parts \[2\] empty"):
        book.check_nonempty()


def test_missing_pymetis_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis now raises ImportError
    ds = _dataset()
    with pytest.raises(ImportError, match=r"pip install 'lightning_mqgnn\[fullgraph\]'"):
        FullGraphDataModule(ds).partition_book(2)
    assert FullGraphDataModule(ds, partitioner="random").partition_book(1).num_parts == 1


def test_batch_moves_its_tensors_and_keeps_the_partition():
    ds = _dataset()
    batch = partition_batch(ds, PartitionBook.build(ds.graph, 2, "metis"), 0, "gcn")
    moved = batch.to("meta")
    assert moved.features.device.type == "meta" and moved.block.weights.device.type == "meta"
    assert moved.partition is batch.partition and batch.features.device.type == "cpu"
    dm = FullGraphDataModule(ds)
    assert dm.transfer_batch_to_device(batch, torch.device("cpu"), 0) is batch
