"""UniformNegatives and DegreeNegatives: k negatives per positive with the source kept,
seeded like the other samplers, strict rejection of true edges, and degree^0.75 frequencies."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.graphs import random_graph
from scipy import stats

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.negative import DegreeNegatives, UniformNegatives
from lightning_mqgnn.sampling.rng import batch_generator, drawing_from

SAMPLERS = [UniformNegatives, DegreeNegatives]


def dense(graph: CSRGraph) -> torch.Tensor:
    adj = torch.zeros(graph.num_nodes, graph.num_nodes, dtype=torch.bool)
    adj[graph.indices, graph.row_ids()] = True
    return adj


def star(n: int) -> CSRGraph:
    """Node 0 joined to nodes 1 .. n - 1 (degrees n - 1 and 1)."""
    leaves = torch.arange(1, n)
    return CSRGraph.from_edges(torch.zeros_like(leaves), leaves, n, symmetrize=True)


def positives(graph: CSRGraph, count: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return graph.indices[:count], graph.row_ids()[:count]


@pytest.mark.parametrize("cls", SAMPLERS)
def test_k_negatives_per_positive_keep_the_source(cls):
    graph = random_graph()
    src, dst = positives(graph)
    sampler = cls(k=5)
    sampler.prepare(graph)
    neg_src, neg_dst = sampler.sample(src, dst, graph)
    assert torch.equal(neg_src, src.repeat_interleave(5))
    assert neg_dst.shape == neg_src.shape and neg_dst.dtype == torch.int64
    assert ((neg_dst >= 0) & (neg_dst < graph.num_nodes)).all()
    assert torch.unique(neg_dst).numel() > 50  # drawn, not copied


@pytest.mark.parametrize("cls", SAMPLERS)
def test_seeded_per_batch_like_the_other_samplers(cls):
    graph = random_graph()
    src, dst = positives(graph)
    sampler = cls(k=3)
    draws = []
    for seed in (7, 7, 8):
        with drawing_from(batch_generator(seed)):
            draws.append(sampler.sample(src, dst, graph)[1])
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    torch.manual_seed(7)  # no generator set: torch's default generator, whose stream that is
    assert torch.equal(sampler.sample(src, dst, graph)[1], draws[0])


@pytest.mark.parametrize("cls", SAMPLERS)
def test_pickled_sampler_draws_the_same(cls):
    graph = random_graph()
    src, dst = positives(graph)
    sampler = cls(k=2, strict=True)
    sampler.prepare(graph)
    copy = pickle.loads(pickle.dumps(sampler))
    with drawing_from(batch_generator(3)):
        a = sampler.sample(src, dst, graph)[1]
    with drawing_from(batch_generator(3)):
        b = copy.sample(src, dst, graph)[1]
    assert torch.equal(a, b)


@pytest.mark.parametrize("cls", SAMPLERS)
def test_strict_never_returns_a_true_edge_or_a_self_pair(cls):
    graph = random_graph(40, 300, seed=1)  # a third of all pairs are edges: lax draws hit many
    adj = dense(graph)
    src, dst = positives(graph, 200)
    with drawing_from(batch_generator(0)):
        lax = cls(k=10).sample(src, dst, graph)
        strict = cls(k=10, strict=True).sample(src, dst, graph)
    assert adj[lax[0], lax[1]].any()  # the check below has something to reject
    assert not adj[strict[0], strict[1]].any() and (strict[0] != strict[1]).all()
    assert strict[0].numel() > 1980  # redrawn, so few dropped even this dense


def test_strict_drops_what_it_cannot_redraw():
    graph = star(30)  # the hub is joined to every other node: it has no negative
    src = torch.tensor([0, 0, 5])
    dst = torch.tensor([1, 2, 0])
    with drawing_from(batch_generator(0)):
        neg_src, neg_dst = UniformNegatives(k=4, strict=True).sample(src, dst, graph)
    assert torch.equal(neg_src, torch.full((4,), 5))  # the hub's 8 negatives dropped, leaf 5's kept
    assert ((neg_dst != 0) & (neg_dst != 5)).all()


def frequencies(sampler, graph: CSRGraph, draws: int) -> torch.Tensor:
    src = torch.zeros(draws, dtype=torch.int64)
    with drawing_from(batch_generator(11)):
        _, neg_dst = sampler.sample(src, src, graph)
    return torch.bincount(neg_dst, minlength=graph.num_nodes).to(torch.float64)


def chi_square(observed: torch.Tensor, weights: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic against ``weights`` and its 99.9% quantile (nodes of weight 0 excluded)."""
    keep = weights > 0
    expected = weights[keep] / weights[keep].sum() * observed.sum()
    statistic = float(((observed[keep] - expected) ** 2 / expected).sum())
    return statistic, float(stats.chi2.ppf(0.999, int(keep.sum()) - 1))


def test_degree_negatives_follow_degree_to_the_three_quarters():
    # degrees 1 .. 8 and 0: a path, a star and an isolated node
    src = torch.tensor([0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3])
    dst = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    graph = CSRGraph.from_edges(src, dst, 13, symmetrize=True)
    degree = graph.in_degrees().to(torch.float64)
    observed = frequencies(DegreeNegatives(k=1), graph, 200_000)
    assert observed[12] == 0  # isolated: never drawn
    statistic, bound = chi_square(observed, degree.pow(0.75))
    assert statistic < bound
    wrong, bound = chi_square(observed, degree)  # the test tells 0.75 from plain degree
    assert wrong > 10 * bound


def test_star_hub_frequency():
    graph = star(101)  # hub degree 100, leaves 1: P(hub) = 100^0.75 / (100^0.75 + 100)
    share = float(frequencies(DegreeNegatives(k=1), graph, 100_000)[0]) / 100_000
    expected = 100**0.75 / (100**0.75 + 100)
    assert abs(share - expected) < 5 * (expected * (1 - expected) / 100_000) ** 0.5
    uniform = float(frequencies(UniformNegatives(k=1), graph, 100_000)[0]) / 100_000
    assert abs(uniform - 1 / 101) < 0.003


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="k must be a positive count, got 0"):
        UniformNegatives(k=0)
    with pytest.raises(ValueError, match="src and dst must be 1-D of one length"):
        UniformNegatives().sample(
            torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), star(4)
        )
    empty = CSRGraph(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="DegreeNegatives: the graph has no edges"):
        DegreeNegatives().prepare(empty)
