"""LABOR sampling: unbiased and normalised estimators, k neighbours per destination in
expectation, one shared variate per source, fewer distinct vertices than node-wise sampling, and the
pipeline and GNS paths."""

from __future__ import annotations

import pickle

import lightning.pytorch as pl
import pytest
import torch
from helpers.estimators import assert_input_layer_unbiased
from helpers.graphs import random_graph
from helpers.pipeline import make_trainer, seeded_module, small_dataset
from helpers.recipe import recipe_config

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import Workspace
from lightning_mqgnn.sampling.exact import exact_operator, full_block
from lightning_mqgnn.sampling.gns import GNSCache, GNSSampler
from lightning_mqgnn.sampling.labor import (
    MAX_ROUNDS,
    CandidateEdges,
    LaborSampler,
    SourceIndex,
    below,
    hash_bits,
    importance_probabilities_vectorised,
    in_edge_candidates,
    labor_probabilities,
    labor_sample,
    shared_uniforms,
    threshold,
)
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def community_graph(groups=20, size=40, p_in=0.5, extra=400, seed=0) -> CSRGraph:
    """Dense communities plus a few random edges: destinations in a community share most of their
    neighbours, where LABOR's shared variates pay off."""
    g = torch.Generator().manual_seed(seed)
    n = groups * size
    a = torch.arange(n)
    same = (a.unsqueeze(1) // size) == (a.unsqueeze(0) // size)
    mask = same & (torch.rand(n, n, generator=g) < p_in)
    src, dst = mask.nonzero().unbind(1)
    src = torch.cat([src, torch.randint(0, n, (extra,), generator=g)])
    dst = torch.cat([dst, torch.randint(0, n, (extra,), generator=g)])
    keep = src != dst
    return CSRGraph.from_edges(src[keep], dst[keep], n, symmetrize=True)


def row_counts(block) -> torch.Tensor:
    return block.indptr[1:] - block.indptr[:-1]


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize("importance_sampling", [0, -1])
def test_monte_carlo_mean_of_ht_weights_matches_exact_aggregation(aggregation, importance_sampling):
    torch.manual_seed(1)
    graph = random_graph(isolate_last=True)
    h = torch.randn(graph.num_nodes, 4, dtype=torch.float64)
    seeds = torch.arange(0, graph.num_nodes, 7)
    exact_block, _ = full_block(graph, seeds, exact_operator(graph, aggregation))
    exact = exact_block.aggregate(h.float()).double()
    sampler = LaborSampler(graph, [3], aggregation, importance_sampling=importance_sampling, estimator="ht")
    estimates = []
    for _ in range(600):
        batch = sampler.sample(seeds)
        estimates.append(torch.sparse.mm(batch.blocks[0].adjacency().to(torch.float64), h[batch.input_nodes]))
    est = torch.stack(estimates)
    stderr = est.std(0) / est.shape[0] ** 0.5
    # within 5 standard errors everywhere (+ float32 weight rounding); dropping the 1/π_ts factor
    # (or sharing no variates with LABOR-*'s unequal π) misses by many standard errors
    assert ((est.mean(0) - exact).abs() <= 5 * stderr + 1e-4).all()
    assert float(stderr.max()) < 0.1 * float(exact.abs().max())  # the check has resolving power


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize("importance_sampling", [0, 2])
def test_hajek_weights_are_the_ht_weights_normalised_to_each_rows_exact_mass(
    aggregation, importance_sampling
):
    graph = random_graph(isolate_last=True)
    seeds = torch.arange(0, graph.num_nodes, 3)
    ht = LaborSampler(graph, [4], aggregation, importance_sampling, estimator="ht")
    hajek = LaborSampler(graph, [4], aggregation, importance_sampling, estimator="hajek")
    torch.manual_seed(4)
    a = ht.sample(seeds).blocks[0]
    torch.manual_seed(4)
    b = hajek.sample(seeds).blocks[0]
    assert torch.equal(a.indices, b.indices) and torch.equal(a.indptr, b.indptr)  # same draw
    rows = b.dst_ids()
    deg = graph.in_degrees().double()
    nbr = torch.ones(b.num_edges, dtype=torch.bool)
    if aggregation == "gcn":  # the self loop leads every row with its exact weight 1/d̂_v
        nbr[b.indptr[:-1]] = False
        torch.testing.assert_close(b.weights[~nbr].double(), 1.0 / (deg[seeds] + 1), rtol=1e-6, atol=0)
    got = torch.zeros(b.num_dst, dtype=torch.float64).index_add_(0, rows[nbr], b.weights[nbr].double())
    mass = torch.zeros(b.num_dst, dtype=torch.float64)
    for i, v in enumerate(seeds.tolist()):  # Σ_u P_vu from the definitions
        nbrs = graph.indices[graph.indptr[v] : graph.indptr[v + 1]]
        if aggregation == "mean":
            mass[i] = float(nbrs.numel() > 0)
        else:
            mass[i] = ((deg[v] + 1) * (deg[nbrs] + 1)).rsqrt().sum()
    has = torch.zeros(b.num_dst, dtype=torch.bool).index_fill_(0, rows[nbr], True)
    assert has.sum() > 50
    torch.testing.assert_close(got[has], mass[has], rtol=1e-5, atol=0)
    # within a row the weights stay proportional to the HT weights (1/π_ts up to the row's factor)
    ratio = b.weights[nbr].double() / a.weights[nbr].double()
    first = torch.zeros(b.num_dst, dtype=torch.float64).scatter_reduce_(
        0, rows[nbr], ratio, "amax", include_self=False
    )
    torch.testing.assert_close(ratio, first[rows[nbr]], rtol=1e-5, atol=0)


@pytest.mark.parametrize("importance_sampling", [0, -1])
def test_each_destination_gets_k_neighbours_in_expectation(importance_sampling):
    graph = community_graph()
    k = 5
    deg = graph.in_degrees()
    seeds = torch.nonzero(deg >= 2 * k).squeeze(1)[:200]
    low = torch.nonzero((deg > 0) & (deg <= k)).squeeze(1)
    sampler = LaborSampler(graph, [k], "mean", importance_sampling=importance_sampling)
    torch.manual_seed(0)
    counts = torch.stack([row_counts(sampler.sample(seeds).blocks[0]) for _ in range(300)]).double()
    per_row = counts.mean(0)
    if importance_sampling == 0:  # Σ_t min(1, k/d_s) = k exactly
        assert abs(float(per_row.mean()) - k) < 4 * float(counts.std()) / counts.numel() ** 0.5
        assert ((per_row - k).abs() < 0.5).all()
    else:  # the variance constraint keeps Σ_t π_ts >= k (harmonic vs arithmetic mean), close to it
        assert k - 0.1 < float(per_row.mean()) < 1.3 * k
    if low.numel():  # a destination with at most k neighbours keeps all of them
        block = sampler.sample(low).blocks[0]
        assert torch.equal(row_counts(block), deg[low])


def test_one_variate_per_source_is_shared_by_all_destinations():
    # LABOR-0: t is kept for s exactly when r_t <= k/d_s, so a kept edge of t implies t is kept for
    # every destination of smaller degree: per source, kept and dropped probabilities never interleave
    graph = community_graph(seed=3)
    seeds = torch.arange(0, graph.num_nodes, 2)
    cand, _ = in_edge_candidates(graph, seeds)
    prob = labor_probabilities(cand, 4, 0, SourceIndex(graph.num_nodes))
    torch.manual_seed(5)
    batch = LaborSampler(graph, [4], "mean").sample(seeds)
    block, nodes = batch.blocks[0], batch.input_nodes
    kept = set(zip(block.dst_ids().tolist(), nodes[block.indices].tolist()))
    is_kept = torch.tensor([(r, t) in kept for r, t in zip(cand.rows.tolist(), cand.src.tolist())])
    assert 0 < int(is_kept.sum()) < is_kept.numel()
    lowest_kept = torch.full((graph.num_nodes,), 2.0, dtype=torch.float64).scatter_reduce_(
        0, cand.src[is_kept], prob[is_kept], "amin"
    )
    highest_dropped = torch.zeros(graph.num_nodes, dtype=torch.float64).scatter_reduce_(
        0, cand.src[~is_kept], prob[~is_kept], "amax"
    )
    assert (highest_dropped < lowest_kept).all()


def test_shared_uniforms_are_uniform_and_independent_across_ids_and_seeds():
    ids = torch.arange(200_000)
    u = shared_uniforms(7, ids)
    assert float(u.min()) > 0 and float(u.max()) <= 1
    hist = torch.histc(u.float(), bins=20, min=0, max=1) / ids.numel()
    assert (hist - 0.05).abs().max() < 5 * (0.05 * 0.95 / ids.numel()) ** 0.5
    v = shared_uniforms(8, ids)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.01  # neighbouring ids
    assert torch.equal(shared_uniforms(7, ids[[5, 5, 9]]), u[[5, 5, 9]])


def test_labor_samples_fewer_distinct_vertices_than_node_wise_at_the_same_fanout():
    graph = community_graph()
    seeds = torch.arange(0, graph.num_nodes, 4)
    torch.manual_seed(0)
    sizes = {}
    for name, sampler in {
        "node": NeighborSampler(graph, [5, 5], "mean"),
        "labor0": LaborSampler(graph, [5, 5], "mean"),
        "labor*": LaborSampler(graph, [5, 5], "mean", importance_sampling=-1),
    }.items():
        sizes[name] = sum(sampler.sample(seeds).input_nodes.numel() for _ in range(20)) / 20
    assert sizes["labor0"] < 0.8 * sizes["node"]
    assert sizes["labor*"] <= sizes["labor0"]


def test_importance_probabilities_converge_and_keep_every_rows_variance():
    graph = community_graph(seed=1)
    seeds = torch.arange(0, graph.num_nodes, 3)
    cand, _ = in_edge_candidates(graph, seeds)
    scratch = SourceIndex(graph.num_nodes)
    k = 4
    expected = []
    for rounds in (0, 1, 2, 4, -1):
        prob = labor_probabilities(cand, k, rounds, scratch)
        # eq. 22: Σ_t 1/π_ts = d_s² / min(k, d_s), node-wise sampling's variance, in every row
        lhs = torch.zeros(seeds.numel(), dtype=torch.float64).index_add_(0, cand.rows, 1.0 / prob)
        target = cand.deg**2 / cand.deg.clamp(max=k)
        torch.testing.assert_close(lhs, target, rtol=1e-3, atol=0)
        vertex_p = torch.zeros(graph.num_nodes, dtype=torch.float64).scatter_reduce_(
            0, cand.src, prob, "amax"
        )
        expected.append(float(vertex_p.sum()))
    assert expected[-1] < expected[0]  # importance sampling samples fewer vertices in expectation
    assert all(b <= a * (1 + 1e-6) for a, b in zip(expected, expected[1:]))


@pytest.mark.parametrize("rounds", [0, 2, -1])
def test_per_row_fanouts_keep_each_rows_own_variance_on_both_paths(rounds):
    # a k per row (GNS asks the uncached part of a row for its shortfall) solves every row at its
    # own k: eq. 22 with k_s = min(k_s, d_s); one k for every row is the tensor of that k; the
    # compiled (CPU) and vectorised (GPU) forms agree
    graph = community_graph(seed=2)
    seeds = torch.arange(0, graph.num_nodes, 2)
    cand, _ = in_edge_candidates(graph, seeds)
    k = torch.randint(1, 7, (seeds.numel(),), generator=torch.Generator().manual_seed(4))
    index = SourceIndex(graph.num_nodes)
    prob = labor_probabilities(cand, k, rounds, index)
    has = cand.counts > 0
    lhs = torch.zeros(seeds.numel(), dtype=torch.float64).index_add_(
        0, cand.rows, 1.0 / prob.clamp(min=1e-300)
    )
    k_s = torch.minimum(cand.deg, k.to(torch.float64))
    torch.testing.assert_close(lhs[has], (cand.deg**2 / k_s)[has], rtol=1e-3, atol=0)
    if rounds != 0:
        vectorised = importance_probabilities_vectorised(cand, k, MAX_ROUNDS if rounds < 0 else rounds, index)
        torch.testing.assert_close(prob, vectorised, rtol=1e-9, atol=1e-12)
    same = labor_probabilities(cand, torch.full_like(k, 4), rounds, index)
    torch.testing.assert_close(same, labor_probabilities(cand, 4, rounds, index), rtol=0, atol=0)


def test_blocks_keep_destinations_as_source_prefix_and_seeded_draws_repeat():
    graph = random_graph(isolate_last=True)
    sampler = LaborSampler(graph, [4, 2], "gcn", importance_sampling=1)
    seeds = torch.tensor([5, 17, 42, graph.num_nodes - 1])
    torch.manual_seed(3)
    batch = sampler.sample(seeds)
    top, bottom = batch.blocks[1], batch.blocks[0]
    assert torch.equal(batch.output_nodes, seeds) and top.num_dst == 4 and bottom.num_dst == top.num_src
    assert torch.equal(batch.input_nodes[:4], seeds)
    assert int(row_counts(top)[-1]) == 1  # the isolated node: only its GCN self loop, no crash
    layer1 = batch.input_nodes[: bottom.num_dst]
    for row in range(top.num_dst):
        local = top.indices[top.indptr[row] + 1 : top.indptr[row + 1]]  # after the self loop
        assert local.unique().numel() == local.numel()
        v = int(seeds[row])
        assert set(layer1[local].tolist()) <= set(
            graph.indices[graph.indptr[v] : graph.indptr[v + 1]].tolist()
        )
    assert bottom.weights.dtype == torch.float32 and bottom.indices.dtype == torch.int64
    torch.manual_seed(3)
    again = sampler.sample(seeds)
    assert torch.equal(again.input_nodes, batch.input_nodes)
    assert all(torch.equal(a.weights, b.weights) for a, b in zip(again.blocks, batch.blocks))
    torch.manual_seed(4)
    assert not torch.equal(sampler.sample(seeds).input_nodes, batch.input_nodes)
    # an edgeless frontier (only the isolated node) gives edgeless blocks
    empty = LaborSampler(graph, [3], "mean").sample(torch.tensor([graph.num_nodes - 1]))
    assert empty.blocks[0].num_edges == 0 and empty.input_nodes.tolist() == [graph.num_nodes - 1]


def test_block_normalization_is_eq2_on_the_sampled_block_times_row_normalised_importance():
    graph = random_graph(isolate_last=True)
    seeds = torch.arange(0, 60, 3)
    for rounds in (0, 2):
        torch.manual_seed(2)
        block = LaborSampler(graph, [3], "gcn", rounds, normalization="block").sample(seeds).blocks[0]
        rows = block.dst_ids()
        a = torch.zeros(block.num_dst, block.num_src, dtype=torch.float64)
        a.index_put_((rows, block.indices), torch.ones(block.num_edges, dtype=torch.float64), accumulate=True)
        plain = (a / a.sum(1).sqrt().unsqueeze(1) / a.sum(0).clamp(min=1).sqrt())[rows, block.indices]
        ratio = block.weights.double() / plain
        assert torch.allclose(ratio[block.indptr[:-1]], torch.ones(block.num_dst, dtype=torch.float64))
        # the importance factors of a row's sampled entries average to 1
        nbr = torch.ones(block.num_edges, dtype=torch.bool)
        nbr[block.indptr[:-1]] = False
        sums = torch.zeros(block.num_dst, dtype=torch.float64).index_add_(0, rows[nbr], ratio[nbr])
        n = torch.zeros(block.num_dst, dtype=torch.float64).index_add_(
            0, rows[nbr], torch.ones(int(nbr.sum()), dtype=torch.float64)
        )
        torch.testing.assert_close(
            sums[n > 0] / n[n > 0], torch.ones(int((n > 0).sum()), dtype=torch.float64)
        )
        if rounds == 0:  # LABOR-0: equal probabilities in a row, so exactly the node-wise normalisation
            torch.testing.assert_close(ratio, torch.ones_like(ratio))


def test_bad_arguments_name_the_problem():
    graph = random_graph(isolate_last=True)
    with pytest.raises(ValueError, match="fanouts"):
        LaborSampler(graph, [5, 0])
    with pytest.raises(ValueError, match="aggregation"):
        LaborSampler(graph, [5], aggregation="max")
    with pytest.raises(ValueError, match="estimator"):
        LaborSampler(graph, [5], estimator="clipped")
    with pytest.raises(ValueError, match="importance_sampling"):
        LaborSampler(graph, [5], importance_sampling=-2)
    with pytest.raises(ValueError, match="normalization='block' is GCN's"):
        LaborSampler(graph, [5], "mean", normalization="block")
    with pytest.raises(ValueError, match="GNS layer sampling"):
        cache = GNSCache(graph, torch.arange(100), fraction=0.1)
        GNSSampler(graph, [3], cache, sampling="ladies")


def test_full_fanout_keeps_every_edge_with_exact_weights():
    graph = random_graph(isolate_last=True)
    seeds = torch.arange(0, 50, 5)
    block = LaborSampler(graph, [-1], "mean", importance_sampling=-1).sample(seeds).blocks[0]
    exact, _ = full_block(graph, seeds, exact_operator(graph, "mean"))
    assert torch.equal(row_counts(block), row_counts(exact))
    torch.testing.assert_close(
        torch.zeros(10).index_add_(0, block.dst_ids(), block.weights),
        torch.zeros(10).index_add_(0, exact.dst_ids(), exact.weights),
    )


def test_sampler_pickles_without_its_scratch_and_samples_the_same_in_a_copy():
    graph = random_graph(isolate_last=True)
    sampler = LaborSampler(graph, [4, 4], "mean", importance_sampling=-1)
    torch.manual_seed(0)
    first = sampler.sample(torch.arange(30))
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone._sources._held is None and clone._relabel._held is None
    torch.manual_seed(0)
    again = clone.sample(torch.arange(30))
    assert torch.equal(first.input_nodes, again.input_nodes)


class Capture(pl.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rows.append((batch.input_nodes, batch.features))


@pytest.mark.parametrize("gns", [False, True])
def test_pipeline_workers_produce_the_sequential_batches(gns):
    from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule

    ds = small_dataset()
    out = {}
    for mode in ("sequential", "pipeline"):
        cache = None
        if gns:
            cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, fanouts=(5, 5), seed=0)
            sampler = GNSSampler(ds.graph, [5, 5], cache, sampling="labor", importance_sampling=-1)
        else:
            sampler = LaborSampler(ds.graph, [5, 5], "mean", importance_sampling=-1)
        dm = MQGNNDataModule(
            ds, sampler, LoaderSettings(batch_size=256, mode=mode, num_workers=1), feature_cache=cache
        )
        cap = Capture()
        model = seeded_module(ds, seed=3)
        make_trainer([cap], max_epochs=2).fit(model, dm)
        out[mode] = (cap.rows, torch.cat([p.detach().flatten() for p in model.parameters()]))
    (rows_a, params_a), (rows_b, params_b) = out["sequential"], out["pipeline"]
    assert len(rows_a) == len(rows_b) > 0
    for a, b in zip(rows_a, rows_b):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(params_a, params_b)


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
def test_gns_labor_input_layer_is_unbiased_and_reads_only_cached_neighbours(aggregation):
    g = torch.Generator().manual_seed(5)
    src, dst = torch.randint(0, 80, (240,), generator=g), torch.randint(0, 80, (240,), generator=g)
    graph = CSRGraph.from_edges(src, dst, 80, symmetrize=True)
    cache = GNSCache(graph, torch.arange(80), fraction=0.15, seed=2)
    sampler = GNSSampler(
        graph,
        [3],
        cache,
        aggregation=aggregation,
        sampling="labor",
        importance_sampling=-1,
        rule="cached_only",
    )

    def draw(t, seeds):
        cache.refresh_(t + 1)
        b = sampler.sample(seeds)
        extra = b.input_nodes[b.blocks[0].num_dst :]
        assert (cache.slot[extra] >= 0).all()
        return b

    assert_input_layer_unbiased(graph, aggregation, draw, torch.tensor([0, 11, 42, 77]))


def test_gns_labor_upper_layers_are_labor_samplers_layers():
    graph = random_graph(isolate_last=True)
    cache = GNSCache(graph, torch.arange(250), fraction=0.1, seed=3)
    sampler = GNSSampler(graph, [4, 5], cache, aggregation="mean", sampling="labor", estimator="hajek")
    torch.manual_seed(9)
    batch = sampler.sample(torch.arange(20))
    torch.manual_seed(9)
    plain = LaborSampler(graph, [5], "mean", estimator="hajek").sample(torch.arange(20))
    assert torch.equal(batch.blocks[1].indices, plain.blocks[0].indices)
    assert torch.equal(batch.blocks[1].weights, plain.blocks[0].weights)


@pytest.mark.parametrize(
    ("model", "aggregation", "rounds", "normalization", "dependent"),
    [
        ("labor_sage", "mean", 0, "graph", False),
        ("labor_gcn", "gcn", 0, "graph", False),
        ("labor_star_sage", "mean", -1, "graph", False),
        ("labor_star_gcn", "gcn", -1, "graph", False),
        ("labor_star_dep_sage", "mean", -1, "graph", True),
    ],
)
def test_labor_model_configs_build_their_sampler(model, aggregation, rounds, normalization, dependent):
    from hydra.utils import instantiate

    cfg = recipe_config(f"model={model}")
    sampler = instantiate(cfg.model.sampler)(graph=random_graph(isolate_last=True))
    module = instantiate(cfg.model.module)(in_dim=8, num_classes=3)
    assert isinstance(sampler, LaborSampler) and cfg.model.name == model
    assert sampler.layer_dependency is dependent
    assert (sampler.aggregation, sampler.importance_sampling, sampler.normalization) == (
        aggregation,
        rounds,
        normalization,
    )
    assert module.aggregation == aggregation and sampler.fanouts == [5, 5]


def test_candidate_edges_dataclass_names_rows():
    graph = random_graph(isolate_last=True)
    cand, pos = in_edge_candidates(graph, torch.tensor([3, 4]))
    assert isinstance(cand, CandidateEdges)
    assert torch.equal(cand.src, graph.indices[pos])
    assert cand.rows.tolist() == [0] * int(cand.deg[0]) + [1] * int(cand.deg[1])


def _fmix32_reference(seed: int, node: int) -> int:
    """MurmurHash3's 32-bit finaliser of ``node · 0x9E3779B1 + seed + 2^31`` on Python integers,
    as a signed 32-bit value: what ``hash_bits`` must give, written without torch."""
    z = (node * 0x9E3779B1 + seed + (1 << 31)) & 0xFFFFFFFF
    z ^= z >> 16
    z = (z * 0x85EBCA6B) & 0xFFFFFFFF
    z ^= z >> 13
    z = (z * 0xC2B2AE35) & 0xFFFFFFFF
    z ^= z >> 16
    return z - (1 << 32) if z >= 1 << 31 else z


@pytest.mark.parametrize("seed", [0, 7, 2**31 + 5, 2**62 - 3])
def test_hash_bits_are_fmix32_of_the_scrambled_id(seed):
    # the variates must not drift: seeded runs and the DGL-parity counts rest on them
    ids = torch.tensor([0, 1, 2, 3, 255, 65_535, 65_536, 1_000_003, 2**31 - 1, 2**32 - 1, 2**40 + 9])
    expect = [_fmix32_reference(seed, int(i)) for i in ids]
    assert hash_bits(seed, ids).tolist() == expect
    ws = Workspace()
    for n in (ids.numel(), 3, 1):  # the workspace path, with buffers left from a longer call
        assert hash_bits(seed, ids[:n], ws).tolist() == expect[:n]


def test_threshold_keeps_exactly_the_sources_whose_uniform_is_at_most_the_probability():
    ids = torch.arange(50_000)
    g = torch.Generator().manual_seed(2)
    prob = torch.rand(ids.numel(), generator=g, dtype=torch.float64)
    prob[:5] = torch.tensor([0.0, 1.0, 2.0**-32, 1.0 - 2.0**-33, 0.5])
    u = shared_uniforms(11, ids)
    kept = torch.zeros(ids.numel(), dtype=torch.bool)
    kept[below(11, ids, threshold(prob))] = True
    # r_t <= p, with p rounded down to a multiple of 2^-32
    assert torch.equal(kept, u <= torch.floor(prob * 2.0**32) / 2.0**32)
    assert not kept[0] and kept[1]
    hits = float(kept[5:].float().mean())
    assert abs(hits - float(prob[5:].mean())) < 0.01


def test_candidate_rows_and_repeated_row_values_agree_in_every_form():
    g = torch.Generator().manual_seed(4)
    ws = Workspace()
    for _ in range(30):
        counts = torch.randint(0, 5, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g)
        counts[0] = 0  # leading, inner and trailing empty rows
        counts[-1] = 0
        total = int(counts.sum())
        cand = CandidateEdges(torch.randint(0, 100, (total,), generator=g), counts)
        rows = torch.repeat_interleave(torch.arange(counts.numel()), counts)
        values = torch.randint(-(2**31), 2**31 - 1, (counts.numel(),), generator=g).to(torch.int32)
        values[1::3] = torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32).repeat(len(values[1::3]))[
            : len(values[1::3])
        ]  # jumps between the extremes wrap
        assert torch.equal(cand.per_edge(values, ws), values[rows])
        assert torch.equal(cand.per_edge(values), values[rows])
        positions = torch.sort(torch.randperm(total, generator=g)[: total // 3]).values
        assert torch.equal(cand.rows_at(positions), rows[positions])  # before the row ids exist
        assert torch.equal(cand.rows, rows)
        assert torch.equal(cand.rows_at(positions), rows[positions])


def test_candidates_in_a_workspace_sample_as_the_allocating_path():
    graph = community_graph(seed=2)
    dst = torch.arange(0, graph.num_nodes, 3)
    ws = Workspace()
    for rounds in (0, 2):
        plain, pos = in_edge_candidates(graph, dst)
        buffered, pos_ws = in_edge_candidates(graph, dst, ws)
        assert torch.equal(plain.src, buffered.src) and torch.equal(pos, pos_ws)
        index = SourceIndex(graph.num_nodes)
        a = labor_sample(plain, 4, rounds, index, seed=17)
        b = labor_sample(buffered, 4, rounds, index, seed=17, workspace=ws)
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_layer_dependency_shares_one_seed_across_the_layers_of_a_batch(monkeypatch):
    import lightning_mqgnn.sampling.labor as labor

    graph = community_graph(seed=4)
    seeds = torch.arange(0, graph.num_nodes, 5)
    drawn = []
    real = labor.draw_layer_seed
    monkeypatch.setattr(labor, "draw_layer_seed", lambda: drawn.append(real()) or drawn[-1])
    for dependent, per_batch in ((False, 2), (True, 1)):
        sampler = LaborSampler(graph, [4, 4], "mean", layer_dependency=dependent)
        drawn.clear()
        torch.manual_seed(3)
        batch = sampler.sample(seeds)
        assert len(drawn) == per_batch
        if dependent:  # the same blocks as both layers sampled from that one seed by hand
            top, frontier = sampler._sample_layer(seeds, 4, drawn[0])
            bottom, inputs = sampler._sample_layer(frontier, 4, drawn[0])
            assert torch.equal(batch.input_nodes, inputs)
            for ours, theirs in zip(batch.blocks, [bottom, top]):
                assert torch.equal(ours.indices, theirs.indices) and torch.equal(ours.weights, theirs.weights)
    sizes = {}
    for dependent in (False, True):
        sampler = LaborSampler(graph, [4, 4], "mean", layer_dependency=dependent)
        torch.manual_seed(0)
        sizes[dependent] = sum(sampler.sample(seeds).input_nodes.numel() for _ in range(20))
    assert sizes[True] < sizes[False]
