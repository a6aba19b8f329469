"""The exact operator from node-sized factors: its blocks carry the weights of the normalised
adjacency written out densely, for any set and order of destinations."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.exact import edge_weights, exact_operator, full_block


def dense_operator(graph: CSRGraph, aggregation: str) -> torch.Tensor:
    """P as a dense matrix, built from the adjacency alone: D̂^-1/2 (A + I) D̂^-1/2 (eq. 2) or
    D^-1 A (eq. 17)."""
    n = graph.num_nodes
    a = torch.zeros(n, n, dtype=torch.float64)
    a[graph.row_ids(), graph.indices] = 1.0
    if aggregation == "gcn":
        a_hat = a + torch.eye(n, dtype=torch.float64)
        d = a_hat.sum(1).rsqrt()
        return d[:, None] * a_hat * d[None, :]
    return a / a.sum(1, keepdim=True).clamp(min=1)


@pytest.fixture(scope="module")
def graph():
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, 50, (300,), generator=gen)
    dst = torch.randint(0, 50, (300,), generator=gen)
    return CSRGraph.from_edges(src, dst, 52, symmetrize=True)  # nodes 50 and 51 have no edges


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize(
    "dst",
    [
        torch.arange(52),
        torch.arange(10, 30),
        torch.tensor([7, 51, 3, 3, 40]),
        torch.tensor([], dtype=torch.int64),
    ],
)
def test_a_full_block_weighs_its_edges_as_the_dense_operator(graph, aggregation, dst):
    block, _ = full_block(graph, dst, exact_operator(graph, aggregation))
    want = dense_operator(graph, aggregation)[dst].to(torch.float32)
    assert torch.allclose(block.adjacency().to_dense(), want, atol=1e-7)
    assert block.dst_in_src == torch.equal(dst, torch.arange(dst.numel()))


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
def test_the_weights_of_every_edge_are_the_operators(graph, aggregation):
    weights, self_weights = edge_weights(graph, aggregation)
    dense = dense_operator(graph, aggregation).to(torch.float32)
    assert torch.allclose(weights, dense[graph.row_ids(), graph.indices], atol=1e-7)
    want_self = dense.diagonal() if aggregation == "gcn" else torch.zeros(graph.num_nodes)
    assert torch.allclose(self_weights, want_self, atol=1e-7)


def test_an_unknown_aggregation_is_refused(graph):
    with pytest.raises(ValueError, match="unknown aggregation 'max'"):
        exact_operator(graph, "max")
