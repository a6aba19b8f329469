"""Node-wise sampling: structure of the blocks and unbiasedness of the weighted aggregation."""

import pytest
import torch
from helpers.devices import DEVICES, on_device
from helpers.graphs import random_graph
from helpers.recipe import recipe_config

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.exact import exact_operator, full_block
from lightning_mqgnn.sampling.neighbor import NeighborSampler, sample_neighbor_edges


def exact_aggregate(graph, seeds, aggregation, h):
    block, _ = full_block(graph, seeds, exact_operator(graph, aggregation))
    return block.aggregate(h)


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_monte_carlo_mean_matches_exact_aggregation(aggregation, replace, device):
    torch.manual_seed(1)
    graph = random_graph(isolate_last=True)
    h = torch.randn(graph.num_nodes, 4, dtype=torch.float64)
    seeds = torch.arange(0, graph.num_nodes, 7)
    exact = exact_aggregate(graph, seeds, aggregation, h.float()).double()
    sampler = on_device(NeighborSampler(graph, [3], aggregation, replace), device)
    estimates = []
    for _ in range(800):
        batch = sampler.sample(seeds.to(device)).to("cpu")
        block = batch.blocks[0]
        estimates.append(torch.sparse.mm(block.adjacency().to(torch.float64), h[batch.input_nodes]))
    est = torch.stack(estimates)
    stderr = est.std(0) / est.shape[0] ** 0.5
    # within 5 standard errors everywhere (+ float32 weight rounding); a biased estimator, e.g.
    # one missing the deg/s factor of eq. 3, misses by many standard errors
    assert ((est.mean(0) - exact).abs() <= 5 * stderr + 1e-4).all()
    assert float(stderr.max()) < 0.1 * float(exact.abs().max())  # the check has resolving power


def test_blocks_keep_destinations_as_source_prefix_and_respect_fanout():
    torch.manual_seed(0)
    graph = random_graph(isolate_last=True)
    sampler = NeighborSampler(graph, [4, 2], "mean", replace=False)
    seeds = torch.tensor([5, 17, 42, graph.num_nodes - 1])
    batch = sampler.sample(seeds)
    assert torch.equal(batch.output_nodes, seeds)
    assert len(batch.blocks) == 2
    top, bottom = batch.blocks[1], batch.blocks[0]
    assert top.num_dst == 4 and bottom.num_dst == top.num_src
    assert bottom.num_src == batch.input_nodes.numel()
    # destinations are the first sources at every layer
    layer1_nodes = batch.input_nodes[: bottom.num_dst]
    assert torch.equal(layer1_nodes[:4], seeds)
    counts = top.indptr[1:] - top.indptr[:-1]
    assert int(counts.max()) <= 2
    assert int(counts[-1]) == 0  # the isolated node has no neighbours and no crash
    # without replacement a row never repeats a source, and every source is a true neighbour
    for row in range(top.num_dst):
        local = top.indices[top.indptr[row] : top.indptr[row + 1]]
        assert local.unique().numel() == local.numel()
        v = int(seeds[row])
        nbrs = set(graph.indices[graph.indptr[v] : graph.indptr[v + 1]].tolist())
        assert set(layer1_nodes[local].tolist()) <= nbrs


def test_without_replacement_takes_every_neighbour_of_low_degree_nodes():
    graph = CSRGraph.from_edges(torch.tensor([0, 0, 1]), torch.tensor([1, 2, 2]), 3, symmetrize=True)
    counts, pos = sample_neighbor_edges(graph, torch.tensor([0, 1, 2]), 5, replace=False)
    assert counts.tolist() == [2, 2, 2]
    assert sorted(graph.indices[pos].tolist()) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("leaves", [4, 10, 40])
def test_uniform_subset_frequencies(leaves):
    # a star: node 0 with `leaves` neighbours, fan-out 3 -> each kept with probability 3/leaves
    star = CSRGraph.from_edges(torch.arange(1, leaves + 1), torch.zeros(leaves, dtype=torch.long), leaves + 1)
    torch.manual_seed(3)
    seeds = torch.zeros(4000, dtype=torch.long)  # 4000 independent rows in one call
    counts, pos = sample_neighbor_edges(star, seeds, 3, replace=False)
    assert counts.tolist() == [3] * 4000
    picked = star.indices[pos].view(4000, 3)
    assert (picked.sort(1).values.diff(dim=1) > 0).all()  # distinct within every row
    freq = torch.bincount(picked.reshape(-1), minlength=leaves + 1)[1:] / 4000
    p = 3 / leaves
    assert (freq - p).abs().max() < 5 * (p * (1 - p) / 4000) ** 0.5


def test_floyd_subsets_are_uniform_over_all_subsets():
    # every 3-subset of 6 offsets (20 of them) equally often, and a row with n == k takes all
    from itertools import combinations

    from lightning_mqgnn.sampling.neighbor import uniform_subsets

    torch.manual_seed(5)
    trials = 40_000
    subsets = uniform_subsets(torch.full((trials,), 6), 3).sort(1).values
    index = {c: i for i, c in enumerate(combinations(range(6), 3))}
    freq = torch.bincount(torch.tensor([index[tuple(r)] for r in subsets.tolist()]), minlength=20) / trials
    assert (freq - 1 / 20).abs().max() < 5 * ((1 / 20) * (19 / 20) / trials) ** 0.5
    rows = uniform_subsets(torch.tensor([3, 3, 1000]), 3).sort(1).values
    assert rows[:2].tolist() == [[0, 1, 2], [0, 1, 2]] and rows[2].unique().numel() == 3


def test_invalid_fanouts_are_rejected():
    graph = random_graph(isolate_last=True)
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(graph, [5, 0])
    with pytest.raises(ValueError, match="aggregation"):
        NeighborSampler(graph, [5], aggregation="max")


def test_block_normalization_is_eq2_on_the_sampled_block_and_only_for_gcn():
    torch.manual_seed(2)
    graph = random_graph(isolate_last=True)
    batch = NeighborSampler(graph, [3, 3], "gcn", normalization="block").sample(torch.arange(0, 40, 3))
    for block in batch.blocks:
        rows = block.dst_ids()
        a = torch.zeros(block.num_dst, block.num_src, dtype=torch.float64)
        a.index_put_((rows, block.indices), torch.ones(block.num_edges, dtype=torch.float64), accumulate=True)
        d_dst, d_src = a.sum(1), a.sum(0)
        assert torch.all(a.diagonal() == 1)  # every destination keeps its self loop
        expected = (a / d_dst.sqrt().unsqueeze(1) / d_src.clamp(min=1).sqrt())[rows, block.indices]
        torch.testing.assert_close(block.weights.double(), expected, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="normalization='block' is GCN's"):
        NeighborSampler(graph, [3], "mean", normalization="block")
    with pytest.raises(ValueError, match="unknown normalization"):
        NeighborSampler(graph, [3], "gcn", normalization="row")


@pytest.mark.parametrize(("model", "normalization"), [("gcn", "graph"), ("gcn_block", "block")])
def test_gcn_model_configs_choose_their_normalization(model, normalization):
    from hydra.utils import instantiate

    cfg = recipe_config(f"model={model}")
    sampler = instantiate(cfg.model.sampler)(graph=random_graph(isolate_last=True))
    assert (cfg.model.name, sampler.aggregation, sampler.normalization) == (model, "gcn", normalization)


def test_row_positions_concatenates_the_rows_ranges_with_empty_rows_anywhere():
    from lightning_mqgnn.sampling.base import row_positions

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(0, 12, (1,), generator=g))
        starts = torch.randint(0, 50, (n,), generator=g)
        counts = torch.randint(0, 4, (n,), generator=g)  # zeros included, first and last too
        want = [torch.arange(int(s), int(s + c)) for s, c in zip(starts, counts)]
        expect = torch.cat(want) if want else torch.zeros(0, dtype=torch.int64)
        assert torch.equal(row_positions(starts, counts), expect)


def test_row_positions_by_repeat_equals_the_cumulative_form():
    from lightning_mqgnn.sampling.base import row_positions, row_positions_by_repeat

    g = torch.Generator().manual_seed(3)
    starts = torch.randint(0, 1000, (200,), generator=g)
    counts = torch.randint(0, 4, (200,), generator=g)  # many empty rows
    assert torch.equal(row_positions_by_repeat(starts, counts), row_positions(starts, counts))
    empty = torch.zeros(3, dtype=torch.int64)
    assert row_positions_by_repeat(empty, empty).numel() == 0


def test_padded_subsets_keep_the_cpu_paths_rows_and_law():
    # the GPU layout (one host read): run on the CPU here, rows of every degree, empty ones too
    from lightning_mqgnn.sampling.neighbor import subset_positions_padded

    graph = random_graph(isolate_last=True)
    torch.manual_seed(7)
    nodes = torch.randint(0, graph.num_nodes, (500,))
    starts = graph.indptr[nodes]
    deg = graph.indptr[nodes + 1] - starts
    k = 4
    counts = deg.clamp(max=k)
    pos = subset_positions_padded(starts, deg, counts, k)
    assert pos.numel() == int(counts.sum())
    for s, d, row in zip(starts.tolist(), deg.tolist(), pos.split(counts.tolist())):
        assert row.unique().numel() == row.numel() == min(d, k)
        assert ((row >= s) & (row < s + d)).all()
        if d <= k:
            assert row.tolist() == list(range(s, s + d))
    # a star's rows draw each of its 10 leaves with probability k / 10, as the CPU path does
    star = CSRGraph.from_edges(torch.arange(1, 11), torch.zeros(10, dtype=torch.long), 11)
    rows = 4000
    starts, deg = torch.zeros(rows, dtype=torch.long), torch.full((rows,), 10)
    picked = star.indices[subset_positions_padded(starts, deg, deg.clamp(max=k), k)]
    freq = torch.bincount(picked, minlength=11)[1:] / rows
    p = k / 10
    assert (freq - p).abs().max() < 5 * (p * (1 - p) / rows) ** 0.5


def test_distinct_where_is_unique_of_the_kept_ids():
    from lightning_mqgnn.sampling.base import distinct_where

    g = torch.Generator().manual_seed(2)
    for n in (0, 1, 50, 3000):
        ids = torch.randint(0, 100, (n,), generator=g)
        keep = torch.rand(n, generator=g) < 0.5
        assert torch.equal(distinct_where(ids, keep, 100), torch.unique(ids[keep]))
    everything = torch.tensor([5, 99, 5])
    assert distinct_where(everything, torch.ones(3, dtype=torch.bool), 100).tolist() == [5, 99]


def test_row_positions_with_a_known_total_equal_the_counted_ones():
    from lightning_mqgnn.sampling.base import row_positions, row_positions_by_repeat

    g = torch.Generator().manual_seed(4)
    starts = torch.randint(0, 1000, (100,), generator=g)
    counts = torch.randint(0, 4, (100,), generator=g)
    total = int(counts.sum())
    assert torch.equal(row_positions(starts, counts, total=total), row_positions(starts, counts))
    assert torch.equal(row_positions_by_repeat(starts, counts, total=total), row_positions(starts, counts))
