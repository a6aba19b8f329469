"""GNS cache (eq. 14-16) and the cache-aware node-wise sampler: draws, in-place refresh,
unbiased Horvitz-Thompson aggregation, gathering only uncached rows, hit rate."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from helpers.devices import DEVICES, on_device
from helpers.estimators import assert_input_layer_unbiased
from helpers.graphs import random_graph

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.sampling.feature_cache import (
    GNSCache,
    choose_rule,
    draw_cache,
    merge_cached_rows,
    random_walk_distribution,
    resident_rows,
)
from lightning_mqgnn.sampling.gns import GNSSampler, bottom_k
from lightning_mqgnn.sampling.labor import CandidateEdges, hash_bits
from lightning_mqgnn.sampling.neighbor import NeighborSampler
from lightning_mqgnn.sampling.residency import copy_state_


def test_rule_follows_the_training_fraction():
    graph = random_graph(100, 300, 0)
    assert choose_rule(graph, torch.arange(60)) == "degree"  # most nodes train: eq. 14
    assert choose_rule(graph, torch.arange(10)) == "random_walk"  # few train: eq. 15-16
    assert GNSCache(graph, torch.arange(10)).rule == "random_walk"


@pytest.fixture(params=[None, 7], ids=["one_chunk", "chunks_of_7_edges"])
def row_chunk_edges(request, monkeypatch):
    """The per-edge passes over the whole graph in one chunk, and in chunks of a few edges."""
    from lightning_mqgnn.graph import csr

    if request.param is not None:
        monkeypatch.setattr(csr, "ROW_CHUNK_EDGES", request.param)


def test_random_walk_distribution_matches_dense_recursion(row_chunk_edges):
    graph = random_graph(40, 60, 1)
    train = torch.tensor([0, 5, 9])
    fanouts = [2, 3]
    a = torch.zeros(40, 40, dtype=torch.float64)  # a[v, u] = 1 if u is an in-neighbour of v
    a[graph.row_ids(), graph.indices] = 1.0
    deg = a.sum(1)
    mass = torch.zeros(40, dtype=torch.float64)
    mass[train] = 1 / 3
    for k in reversed(fanouts):
        d = torch.where(deg > 0, deg.clamp(max=k) / deg.clamp(min=1), torch.zeros_like(deg))
        mass = mass + a.T @ (d * mass)  # v's mass reaches its sampled in-neighbours
    torch.testing.assert_close(random_walk_distribution(graph, train, fanouts), mass / mass.sum())


def test_cache_inclusion_probabilities_match_their_frequency():
    graph = random_graph(200, 800, 2)
    train = torch.arange(150)
    trials = 2000
    freq = torch.zeros(200, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    for _ in range(trials):
        draw = draw_cache(graph, train, 0.05, gen)
        assert draw.nodes.unique().numel() == draw.nodes.numel() <= 10
        freq[draw.nodes] += 1
    inc = draw.inclusion
    tol = 5 * (inc * (1 - inc) / trials).sqrt() + 1e-3
    assert ((freq / trials - inc).abs() <= tol).all()


def test_refresh_is_in_place_periodic_and_consistent():
    graph = random_graph(500, 2000, 4)
    cache = GNSCache(graph, torch.arange(400), fraction=0.02, period=2, seed=1)
    ptrs = [t.data_ptr() for t in (cache.nodes, cache.slot, cache.inclusion)]
    assert all(t.is_shared() for t in (cache.nodes, cache.slot, cache.inclusion, cache.version))
    assert cache.capacity == 10 and int(cache.version) == 0
    assert not cache.refresh_(1)  # mid-period: unchanged
    assert cache.refresh_(2) and int(cache.version) == 2
    assert [t.data_ptr() for t in (cache.nodes, cache.slot, cache.inclusion)] == ptrs
    c = int(cache.num_cached)
    live = cache.nodes[:c]
    assert live.unique().numel() == c
    assert (cache.nodes[c:] == cache.nodes[0]).all()  # padding repeats a cached row
    assert torch.equal(cache.slot[live], torch.arange(c))
    assert int((cache.slot >= 0).sum()) == c
    # deterministic in (seed, epoch)
    other = GNSCache(graph, torch.arange(400), fraction=0.02, period=2, seed=1)
    other.refresh_(2)
    assert torch.equal(other.nodes, cache.nodes)


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize("device", DEVICES)
def test_cached_input_layer_aggregation_is_unbiased(aggregation, device):
    # Monte Carlo over 1500 (cache draw, sample) pairs: the mean of the input block's
    # aggregation is within 4.5 standard errors of the exact operator (P H for gcn, the neighbour
    # mean for mean), although each sample only reads cached neighbours
    graph = random_graph(80, 240, 5)
    train = torch.arange(80)
    cache = GNSCache(graph, train, fraction=0.15, seed=2)
    moved = on_device(GNSSampler(graph, [3], cache, aggregation=aggregation, rule="cached_only"), device)

    def draw(t, seeds):
        cache.refresh_(t + 1)
        copy_state_(moved.cache, cache)  # the device copy follows the host redraw, as in the loader
        b = moved.sample(seeds.to(device)).to("cpu")
        assert b.meta["cache_version"] == t + 1
        return b

    assert_input_layer_unbiased(graph, aggregation, draw, torch.tensor([0, 11, 42, 77]))


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
def test_hajek_weights_carry_each_rows_exact_mass(aggregation):
    """The self-normalised (Hajek) estimator rescales a row's HT weights so they sum to the exact
    Σ_u P_vu of that row: no 1/π spikes, at the price of a small bias (it is consistent, not
    unbiased). Rows without a sampled cached neighbour stay empty."""
    g = torch.Generator().manual_seed(11)
    src, dst = torch.randint(0, 200, (900,), generator=g), torch.randint(0, 200, (900,), generator=g)
    keep = src != dst  # no self edges: a destination's own source row is then only GCN's self loop
    graph = CSRGraph.from_edges(src[keep], dst[keep], 200, symmetrize=True)
    cache = GNSCache(graph, torch.arange(200), fraction=0.1, seed=4)
    sampler = GNSSampler(graph, [3], cache, aggregation=aggregation, estimator="hajek", rule="cached_only")
    ht = GNSSampler(graph, [3], cache, aggregation=aggregation, rule="cached_only")
    seeds = torch.arange(0, 200, 3)
    torch.manual_seed(1)
    block = sampler.sample(seeds).blocks[0]
    torch.manual_seed(1)
    plain = ht.sample(seeds).blocks[0]
    assert torch.equal(block.indices, plain.indices)  # same draw, other weights
    counts = block.indptr[1:] - block.indptr[:-1]
    rows = torch.repeat_interleave(torch.arange(seeds.numel()), counts)
    got = torch.zeros(seeds.numel(), dtype=torch.float64).index_add_(0, rows, block.weights.double())
    deg = graph.in_degrees().double()
    if aggregation == "gcn":  # each gcn row starts with the exact self loop 1/d̂_v: not estimated
        got -= 1.0 / (deg[seeds] + 1)
        counts = counts - 1
    mass = torch.zeros(seeds.numel(), dtype=torch.float64)
    for i, v in enumerate(seeds.tolist()):  # Σ_u P_vu over v's neighbours, from the definitions
        nbrs = graph.indices[graph.indptr[v] : graph.indptr[v + 1]]
        if aggregation == "mean":
            mass[i] = 1.0 if nbrs.numel() else 0.0
        else:
            mass[i] = ((deg[v] + 1) * (deg[nbrs] + 1)).rsqrt().sum()
    has = counts > 0
    assert has.sum() > 10 and (~has).sum() > 0
    assert torch.allclose(got[has], mass[has], rtol=1e-5)
    with pytest.raises(ValueError, match="estimator"):
        GNSSampler(graph, [3], cache, estimator="clipped")


def test_input_layer_reads_only_cached_neighbours_and_upper_layers_match_neighbor_sampler():
    graph = random_graph(300, 1500, 8)
    cache = GNSCache(graph, torch.arange(250), fraction=0.1, seed=3)
    sampler = GNSSampler(graph, [4, 5], cache, aggregation="mean", rule="cached_only")
    seeds = torch.arange(20)
    torch.manual_seed(9)
    batch = sampler.sample(seeds)
    torch.manual_seed(9)
    plain = NeighborSampler(graph, [5], aggregation="mean").sample(seeds)
    assert torch.equal(batch.blocks[1].indices, plain.blocks[0].indices)
    b0 = batch.blocks[0]
    frontier = plain.input_nodes
    assert b0.num_dst == frontier.numel() and torch.equal(batch.input_nodes[: b0.num_dst], frontier)
    extra = batch.input_nodes[b0.num_dst :]
    assert (cache.slot[extra] >= 0).all()  # every non-destination source is cached
    assert (b0.indptr[1:] - b0.indptr[:-1]).max() <= 4


def test_gather_with_cache_moves_only_uncached_rows_and_counts_hits():
    graph = random_graph(400, 3000, 10)
    feats = torch.randn(400, 16)
    labels = torch.randint(0, 3, (400,))
    cache = GNSCache(graph, torch.arange(300), fraction=0.05, seed=4)
    resident = resident_rows(cache, feats)
    sampler = GNSSampler(graph, [5, 5], cache, aggregation="gcn")
    total_hits = total_rows = 0
    for start in (0, 50, 100):
        batch = gather(sampler.sample(torch.arange(start, start + 50)), feats, labels, cache_slot=cache.slot)
        rows = batch.input_nodes.numel()
        hits = int(cache.slot[batch.input_nodes].ge(0).sum())
        assert batch.meta["cache_hits"] == hits > 0
        assert batch.cache_slots.numel() == rows and batch.features.shape[0] == rows - hits
        torch.testing.assert_close(batch.input_features(resident), feats[batch.input_nodes])
        merge_cached_rows(batch, resident)
        assert batch.cache_slots is None and torch.equal(batch.features, feats[batch.input_nodes])
        total_hits, total_rows = total_hits + hits, total_rows + rows
    assert 0.0 < total_hits / total_rows < 1.0


def _conditional_truth(graph, cache, seeds, aggregation, k, h):
    """What a cached_first row estimates given the cache: the exact aggregation when fewer than
    ``k`` neighbours are cached, else its cached neighbours' part (the stated bias); GCN's exact
    self loop in both."""
    deg = graph.in_degrees().to(torch.float64)
    out = torch.zeros(len(seeds), h.shape[1], dtype=torch.float64)
    full = []
    for i, v in enumerate(seeds.tolist()):
        nbrs = graph.indices[graph.indptr[v] : graph.indptr[v + 1]]
        cached = cache.slot[nbrs] >= 0
        full.append(int(cached.sum()) < k)
        use = nbrs if full[-1] else nbrs[cached]
        if aggregation == "mean":
            p = torch.full((use.numel(),), 1.0 / max(nbrs.numel(), 1), dtype=torch.float64)
        else:
            p = ((deg[v] + 1) * (deg[use] + 1)).rsqrt()
            out[i] += h[v] / (deg[v] + 1)
        out[i] += (p[:, None] * h[use]).sum(0)
    return out, torch.tensor(full)


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("sampling", "rounds", "fill_weight"),
    [
        ("neighbor", 0, None),
        ("labor", 0, None),
        ("labor", -1, None),
        ("neighbor", 0, 2.0),
        ("neighbor", 0, math.inf),
        ("labor", -1, math.inf),
    ],
)
def test_cached_first_is_unbiased_given_the_cache_where_it_fills_up(
    aggregation, device, sampling, rounds, fill_weight
):
    # one cache, 1500 samples: a row with fewer than k cached neighbours estimates its exact
    # aggregation (all cached taken, uncached filled in with weight (d - c) / m, or LABOR's 1/π_ts
    # at the row's shortfall); a row with k or more estimates its cached neighbours' part, within
    # 4.5 standard errors. With a fill_weight a row takes fewer uncached neighbours (one with an
    # infinite one), each weighted by all those it stands for, and stays unbiased
    graph = random_graph(120, 700, 5)
    cache = GNSCache(graph, torch.arange(120), fraction=0.2, seed=2)
    sampler = GNSSampler(
        graph,
        [3],
        cache,
        aggregation=aggregation,
        sampling=sampling,
        importance_sampling=rounds,
        fill_weight=fill_weight,
    )
    sampler = on_device(sampler, device)
    seeds = torch.tensor([0, 7, 11, 42, 77, 90, 101, 119])
    h = torch.randn(120, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    truth, full = _conditional_truth(graph, cache, seeds, aggregation, 3, h)
    assert full.any() and (~full).any()  # both kinds of rows are checked
    trials = 1500
    est = torch.zeros(trials, len(seeds), 2, dtype=torch.float64)
    torch.manual_seed(7)
    for t in range(trials):
        b = sampler.sample(seeds.to(device)).to("cpu")
        est[t] = b.blocks[0].aggregate(h[b.input_nodes].float()).double()
    se = est.std(0) / trials**0.5
    assert ((est.mean(0) - truth).abs() <= 4.5 * se + 1e-5).all()


def test_cached_first_takes_cached_neighbours_first_and_keeps_weights_small():
    graph = random_graph(400, 4000, 9)
    cache = GNSCache(graph, torch.arange(400), fraction=0.05, seed=1)
    k = 4
    sampler = GNSSampler(graph, [k], cache, aggregation="mean")
    seeds = torch.arange(0, 400, 2)
    batch = sampler.sample(seeds)
    block, sources = batch.blocks[0], batch.input_nodes
    assert block.num_dst == seeds.numel()
    counts = block.indptr[1:] - block.indptr[:-1]
    assert torch.equal(counts, graph.in_degrees()[seeds].clamp(max=k))  # the fan-out is always filled
    for i, v in enumerate(seeds.tolist()):
        nbrs = graph.indices[graph.indptr[v] : graph.indptr[v + 1]]
        cached = set(nbrs[cache.slot[nbrs] >= 0].tolist())
        got = sources[block.indices[block.indptr[i] : block.indptr[i + 1]]].tolist()
        assert len(set(got)) == len(got) and set(got) <= set(nbrs.tolist())
        taken = cached & set(got)
        assert len(taken) == min(len(cached), k), v  # cached neighbours first
    # mean aggregation: a weight is 1/d_v over a sampling probability of at least m/(d_v - c_v),
    # so never above 1 (node-wise sampling's own size); cached_only divides by π_u as well
    assert float(block.weights.max()) <= 1.0 + 1e-6
    only = GNSSampler(graph, [k], cache, aggregation="mean", rule="cached_only").sample(seeds).blocks[0]
    assert float(only.weights.max()) > 2.0  # 1/π_u > 1 for every cached neighbour
    with pytest.raises(ValueError, match="GNS rule must be one of"):
        GNSSampler(graph, [k], cache, rule="cached")
    assert GNSSampler(graph, [k], cache, sampling="labor").rule == "cached_first"
    for bad in (0.5, math.nan):
        with pytest.raises(ValueError, match="GNS fill_weight must be at least 1"):
            GNSSampler(graph, [k], cache, fill_weight=bad)
    deg = graph.in_degrees()[seeds]
    cached = torch.tensor(
        [int((cache.slot[graph.indices[graph.indptr[v] : graph.indptr[v + 1]]] >= 0).sum()) for v in seeds]
    )
    short = (cached < k) & (deg > cached)
    for weight, fill in [
        (math.inf, torch.ones_like(deg)),  # one uncached neighbour, standing for all of them
        (3.0, torch.div(deg - cached + 2, 3, rounding_mode="floor")),  # one per 3 uncached ones
    ]:
        block = GNSSampler(graph, [k], cache, aggregation="mean", fill_weight=weight).sample(seeds).blocks[0]
        fill = torch.minimum(fill.clamp(min=1), k - cached) * short
        assert torch.equal(block.indptr[1:] - block.indptr[:-1], cached.clamp(max=k) + fill), weight
        assert (fill < (k - cached).clamp(min=0) * short).any()  # the cap binds on some rows


def test_bottom_k_takes_each_rows_smallest_shared_variates_uniformly():
    # every row keeps the min(need, d) candidates of smallest r_t, one r_t per source for all rows;
    # so each row alone is uniform without replacement: each candidate's frequency is m / d
    g = torch.Generator().manual_seed(3)
    counts = torch.tensor([5, 0, 3, 8, 2])
    src = torch.cat([torch.randperm(20, generator=g)[: int(c)] for c in counts])
    cand = CandidateEdges(src, counts)
    need = torch.tensor([2, 1, 3, 4, 5])
    m = torch.minimum(need, counts)
    hits = torch.zeros(src.numel())
    trials = 4000
    for seed in range(trials):
        keep, rows, taken = bottom_k(cand, need, seed)
        assert torch.equal(torch.bincount(rows, minlength=5), m)
        torch.testing.assert_close(taken, (m / counts.clamp(min=1)).double()[rows])
        bits = hash_bits(seed, src)
        for r in range(5):
            row = torch.nonzero(cand.rows == r).reshape(-1)
            kept = keep[rows == r]
            if kept.numel() and kept.numel() < row.numel():
                rest = row[~torch.isin(row, kept)]
                assert bits[kept].max() < bits[rest].min()  # the smallest variates of the row
        hits[keep] += 1
    p = (m / counts.clamp(min=1)).double()[cand.rows]
    se = (p * (1 - p) / trials).sqrt()
    assert ((hits / trials - p).abs() <= 4.5 * se + 1e-9).all()


def test_sampler_pickles_with_shared_cache_and_validates_arguments():
    graph = random_graph(100, 300, 11)
    cache = GNSCache(graph, torch.arange(10), fraction=0.1)
    sampler = GNSSampler(graph, [3, 3], cache)
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone.sample(torch.arange(5)).num_layers == 2
    with pytest.raises(ValueError, match="fraction must be in"):
        GNSCache(graph, torch.arange(10), fraction=0.0)
    with pytest.raises(ValueError, match="fanouts must be positive"):
        GNSSampler(graph, [0], cache)
    with pytest.raises(ValueError, match="period must be"):
        GNSCache(graph, torch.arange(10), period=0)
    with pytest.raises(ValueError, match="built on another graph"):
        GNSSampler(random_graph(100, 300, 12), [3, 3], cache)


def test_cached_edge_index_lists_exactly_the_in_edges_from_cached_nodes(row_chunk_edges):
    # after each redraw, every node's indexed edges are its in-edges whose source is cached, in
    # CSR order: what scanning all in-edges against the slot table gives
    from lightning_mqgnn.sampling.gns import cached_edges

    graph = random_graph(300, 1500, 21)
    cache = GNSCache(graph, torch.arange(300), fraction=0.05, period=1, seed=8)
    dst = torch.tensor([5, 0, 299, 17, 5, 140])
    found = 0
    for epoch in range(3):
        assert epoch == 0 or cache.refresh_(epoch)
        sub = cached_edges(cache, dst)
        for row, v in enumerate(dst.tolist()):
            nbrs = graph.indices[int(graph.indptr[v]) : int(graph.indptr[v + 1])]
            expect = nbrs[cache.slot[nbrs] >= 0]
            got = sub.indices[int(sub.indptr[row]) : int(sub.indptr[row + 1])]
            assert torch.equal(got, expect), (epoch, v)
            found += got.numel()
        assert int(cache.edge_indptr[-1]) <= cache.edge_src.numel()
    assert cache.edge_src.dtype == torch.int32  # node ids fit: half the bytes
    assert found > 0
