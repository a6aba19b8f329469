"""CSRGraph.row_chunks: consecutive row ranges that cover every edge once, in order, each within
its edge budget unless one row alone is over it, on in-memory and memory-mapped graphs."""

from __future__ import annotations

import pytest
import torch
from helpers.graphs import random_graph

from lightning_mqgnn.graph import generate_graph
from lightning_mqgnn.graph.ondisk import open_dataset, write_dataset


def _check(graph, max_edges):
    chunks = list(graph.row_chunks(max_edges))
    assert chunks[0].lo == 0 and chunks[-1].hi == graph.num_nodes
    for a, b in zip(chunks, chunks[1:]):
        assert a.hi == b.lo and a.end == b.start
    for c in chunks:
        assert c.end - c.start <= max_edges or c.hi - c.lo == 1
        assert torch.equal(c.indptr, graph.indptr[c.lo : c.hi + 1] - c.start)
        assert torch.equal(c.sources, graph.indices[c.start : c.end])
    rows = torch.cat([torch.repeat_interleave(torch.arange(c.lo, c.hi), c.indptr.diff()) for c in chunks])
    assert torch.equal(rows, graph.row_ids())
    return chunks


@pytest.mark.parametrize("max_edges", [1, 5, 64, 10**9])
def test_row_chunks_cover_every_edge_once_in_order(max_edges):
    graph = random_graph(50, 400, 3)
    chunks = _check(graph, max_edges)
    if max_edges == 10**9:
        assert len(chunks) == 1


def test_row_chunks_of_a_mapped_graph_read_its_files(tmp_path):
    ds = generate_graph("arxiv", scale=0.01, seed=2)
    mapped = open_dataset(write_dataset(ds, tmp_path / "d"))
    chunks = _check(mapped.graph, 1000)
    assert len(chunks) > 3
    assert torch.equal(torch.cat([c.sources for c in chunks]), ds.graph.indices)
