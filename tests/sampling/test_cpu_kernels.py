"""The CPU samplers' compiled loops against plain references: Floyd's subsets against the
algorithm written out in Python on the same uniforms, the relabelling against ``torch.unique``,
LABOR-0's fused pass and LABOR-*'s row-by-row fixed point against the vectorised forms a GPU
runs (``labor.labor_sample``, ``labor.importance_probabilities_vectorised``)."""

from __future__ import annotations

import pytest
import torch
from helpers.graphs import random_graph

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling import cpu_kernels
from lightning_mqgnn.sampling.aggregate import transpose_of
from lightning_mqgnn.sampling.labor import (
    MAX_ROUNDS,
    SourceIndex,
    importance_probabilities_compiled,
    importance_probabilities_vectorised,
    in_edge_candidates,
    labor_sample,
)
from lightning_mqgnn.sampling.neighbor import sample_neighbor_edges
from lightning_mqgnn.sampling.rng import drawing_from


def _floyd_reference(indptr: list[int], nodes: list[int], k: int, draws: list[list[float]]):
    counts, positions, p = [], [], 0
    for v in nodes:
        start, d = indptr[v], indptr[v + 1] - indptr[v]
        if d <= k:
            counts.append(d)
            positions += [start + i for i in range(d)]
            continue
        chosen: list[int] = []
        for step in range(k):
            j = d - k + step
            t = int(draws[step][p] * (j + 1))
            chosen.append(j if t in chosen else t)
        counts.append(k)
        positions += [start + t for t in chosen]
        p += 1
    return counts, positions


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_floyd_positions_follow_the_algorithm_on_the_generators_uniforms(k):
    graph = random_graph(n=400, m=3000, seed=k, isolate_last=True)  # degrees 0 .. ~30
    nodes = torch.cat(
        [torch.randperm(400, generator=torch.Generator().manual_seed(k))[:250], torch.tensor([399])]
    )
    counts, positions = cpu_kernels.floyd_positions(graph.indptr, nodes, k, torch.Generator().manual_seed(9))
    over = int(((graph.indptr[nodes + 1] - graph.indptr[nodes]) > k).sum())
    draws = torch.rand(k, over, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    expect_counts, expect_positions = _floyd_reference(
        graph.indptr.tolist(), nodes.tolist(), k, draws.tolist()
    )
    assert over > 0 and counts.tolist() == expect_counts and positions.tolist() == expect_positions


def test_floyd_subsets_from_sample_neighbor_edges_are_uniform_over_all_subsets():
    # a node with 6 neighbours, fan-out 3: each of the 20 subsets equally often
    from itertools import combinations

    star = CSRGraph.from_edges(torch.arange(1, 7), torch.zeros(6, dtype=torch.int64), 7)
    trials = 40_000
    with drawing_from(torch.Generator().manual_seed(5)):
        counts, pos = sample_neighbor_edges(star, torch.zeros(trials, dtype=torch.int64), 3, replace=False)
    assert counts.tolist() == [3] * trials
    subsets = pos.view(trials, 3).sort(1).values
    index = {c: i for i, c in enumerate(combinations(range(6), 3))}
    freq = torch.bincount(torch.tensor([index[tuple(r)] for r in subsets.tolist()]), minlength=20) / trials
    assert (freq - 1 / 20).abs().max() < 5 * ((1 / 20) * (19 / 20) / trials) ** 0.5


@pytest.mark.parametrize("ratio", [0, 10**9])  # always sort, always scan
def test_relabel_puts_new_ids_after_the_prefix_in_ascending_order(ratio, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "SCAN_PER_SORTED_ID", ratio)
    g = torch.Generator().manual_seed(ratio % 7)
    slot = torch.full((500,), -1, dtype=torch.int64)
    for size in (0, 1, 40, 3000):
        prefix = torch.randperm(500, generator=g)[:60]
        others = torch.randint(0, 500, (size,), generator=g)
        nodes, local = cpu_kernels.relabel(prefix, others, slot)
        assert torch.equal(nodes[:60], prefix)
        assert torch.equal(nodes[60:], torch.unique(others[~torch.isin(others, prefix)]))
        assert torch.equal(nodes[local], others)
        assert bool((slot == -1).all())


@pytest.mark.parametrize("fanout", [1, 4, 10])
def test_labor0_fused_pass_keeps_the_edges_of_the_vectorised_chain(fanout):
    graph = random_graph(n=600, m=9000, seed=fanout, isolate_last=True)
    index = SourceIndex(graph.num_nodes)
    for seed in (0, 1, 2**31 - 1, 2**40 + 17, 2**62 - 1):
        nodes = torch.randperm(600, generator=torch.Generator().manual_seed(seed % 1000))[:300]
        nodes[0] = 599  # an isolated row
        cand, _ = in_edge_candidates(graph, nodes)
        keep, rows, _ = labor_sample(cand, fanout, 0, index, seed)
        src, counts, degrees = cpu_kernels.labor0_kept(graph.indptr, graph.indices, nodes, fanout, seed)
        assert keep.numel() > 0
        assert torch.equal(src, cand.src[keep])
        assert torch.equal(counts, torch.bincount(rows, minlength=nodes.numel()))
        assert torch.equal(degrees.to(torch.float64), cand.deg)


@pytest.mark.parametrize("rounds", [1, 3, MAX_ROUNDS])
def test_importance_probabilities_row_by_row_equal_the_vectorised_fixed_point(rounds):
    # LABOR-i / LABOR-*: the same π_ts to rounding (sums in another order), on a graph whose
    # sources are shared by many rows
    graph = random_graph(n=300, m=6000, seed=rounds, isolate_last=True)
    index = SourceIndex(graph.num_nodes)
    for fanout in (2, 5):
        nodes = torch.cat([torch.arange(0, 300, 2), torch.tensor([299])])
        cand, _ = in_edge_candidates(graph, nodes)
        expect = importance_probabilities_vectorised(cand, fanout, rounds, index)
        got = importance_probabilities_compiled(cand, fanout, rounds, index)
        assert bool((expect < 1).any()) and torch.allclose(got, expect, rtol=1e-12, atol=0)
        assert bool((index.scratch(cand.src.device) == -1).all())


def test_transpose_by_counting_sort_equals_the_stable_sort():
    # the block's CSC: entries by source, each source's entries in row order (float64 weights
    # take the vectorised stable sort)
    g = torch.Generator().manual_seed(4)
    for rows, num_src in ((1, 1), (50, 7), (300, 2000)):
        counts = torch.randint(0, 9, (rows,), generator=g)
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        indices = torch.randint(0, num_src, (int(indptr[-1]),), generator=g)
        weights = torch.rand(indices.numel(), generator=g, dtype=torch.float64)
        expect = transpose_of(indptr, indices, weights, num_src)
        got = cpu_kernels.transpose(indptr, indices, weights.float(), num_src)
        assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])
        assert torch.equal(got[2], expect[2].float())
