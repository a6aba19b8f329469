"""FastGCN / LADIES (+flat, +debias): block structure, unbiasedness of the sampled products."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.devices import DEVICES, on_device
from helpers.graphs import random_graph

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.exact import exact_operator, full_block
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler

VARIANTS = [
    (cls, flat, debias) for cls in (FastGCNSampler, LADIESSampler) for flat in (0, 1) for debias in (0, 1)
]


def variant_id(v) -> str:
    cls, flat, debias = v
    return cls.__name__[:-7].lower() + ("_f" if flat else "") + ("_d" if debias else "")


def dense_laplacian(graph: CSRGraph) -> torch.Tensor:
    """L = D^-1/2 (A+I) D^-1/2 as a dense float64 matrix, from the exact full blocks."""
    block, _ = full_block(graph, torch.arange(graph.num_nodes), exact_operator(graph, "gcn"))
    return block.adjacency().to_dense().to(torch.float64)


def block_dense(block) -> torch.Tensor:
    return block.adjacency().to_dense().to(torch.float64)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_blocks_are_rows_of_the_laplacian_over_distinct_sampled_columns(variant):
    cls, flat, debias = variant
    graph = random_graph(300, 900, 0)
    sampler = cls(graph, [64, 32], flat=bool(flat), debias=bool(debias))
    assert isinstance(sampler, Sampler) and sampler.aggregation == "gcn" and sampler.num_layers == 2
    torch.manual_seed(1)
    seeds = torch.randperm(300)[:20]
    batch = sampler.sample(seeds)
    assert torch.equal(batch.output_nodes, seeds)
    # top-down: output block rows = batch, its sources = the 32 output-side samples; input block 64
    out_b, in_b = batch.blocks[1], batch.blocks[0]
    assert (out_b.num_dst, out_b.num_src, in_b.num_dst, in_b.num_src) == (20, 32, 32, 64)
    assert batch.input_nodes.numel() == 64 and batch.input_nodes.unique().numel() == 64
    assert not out_b.dst_in_src and not in_b.dst_in_src
    for b in (out_b, in_b):
        assert b.weights.dtype == torch.float32 and torch.isfinite(b.weights).all() and (b.weights > 0).all()
        assert int(b.indptr[-1]) == b.num_edges and (b.indices < b.num_src).all()


def test_block_weights_equal_laplacian_entries_times_column_weights():
    # block = L[batch, S] · diag(w), w = 1/(s p_S) (eq. 8) or the debias weights (eq. 13) of S
    # in draw order (input_nodes keeps the draw order)
    from lightning_mqgnn.sampling.debias import debias_weights

    graph = random_graph(120, 400, 2)
    lap = dense_laplacian(graph)
    seeds = torch.arange(10, 30)
    for cls in (FastGCNSampler, LADIESSampler):
        for debias in (False, True):
            sampler = cls(graph, [40], debias=debias)
            torch.manual_seed(3)
            batch = sampler.sample(seeds)
            chosen = batch.input_nodes
            dist = sampler.distribution(seeds)
            p = torch.zeros(120, dtype=torch.float64)
            p[dist.support] = dist.p
            w = debias_weights(p[chosen], 120) if debias else 1.0 / (chosen.numel() * p[chosen])
            expect = lap[seeds][:, chosen] * w
            torch.testing.assert_close(block_dense(batch.blocks[0]), expect, rtol=1e-5, atol=1e-7)


def one_layer_estimates(sampler, seeds, h, trials, device="cpu"):
    est = torch.zeros(trials, seeds.numel(), h.shape[1], dtype=torch.float64)
    sampler = on_device(sampler, device)
    for t in range(trials):
        batch = sampler.sample(seeds.to(device)).to("cpu")
        est[t] = batch.blocks[0].aggregate(h[batch.input_nodes].float()).double()
    return est


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[2]], ids=variant_id)
@pytest.mark.parametrize("device", DEVICES)
def test_debiased_sampled_product_is_unbiased(variant, device):
    # Monte Carlo over 1200 samples: mean of L̂[batch, S] H[S] within 4.5 standard errors of
    # L[batch, :] H for every entry (s = 12 of a support of ~40-60 nodes: far from with-replacement)
    cls, flat, _ = variant
    graph = random_graph(60, 150, 4)
    lap = dense_laplacian(graph)
    h = torch.randn(60, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    seeds = torch.tensor([0, 7, 19, 33])
    sampler = cls(graph, [12], flat=bool(flat), debias=True)
    torch.manual_seed(6)
    est = one_layer_estimates(sampler, seeds, h, 1200, device)
    truth = lap[seeds] @ h
    se = est.std(0) / est.shape[0] ** 0.5
    assert ((est.mean(0) - truth).abs() <= 4.5 * se + 1e-5).all()


@pytest.mark.parametrize("cls", [FastGCNSampler, LADIESSampler], ids=["fastgcn", "ladies"])
@pytest.mark.parametrize("device", DEVICES)
def test_plain_weights_are_biased_without_replacement_and_debias_fixes_it(cls, device):
    # s close to the support size: plain 1/(s p) (eq. 8) misses L H badly, debias (eq. 13) does not
    graph = random_graph(12, 20, 7)
    lap = dense_laplacian(graph)
    h = torch.rand(12, 1, generator=torch.Generator().manual_seed(8), dtype=torch.float64) + 1.0
    seeds = torch.arange(12)
    truth = lap @ h
    torch.manual_seed(9)
    plain = one_layer_estimates(cls(graph, [10]), seeds, h, 800, device).mean(0)
    debiased = one_layer_estimates(cls(graph, [10], debias=True), seeds, h, 800, device).mean(0)
    err_plain = float((plain - truth).abs().sum())
    err_debias = float((debiased - truth).abs().sum())
    assert err_plain > 5 * err_debias and err_plain > 0.5


@pytest.mark.parametrize("cls", [FastGCNSampler, LADIESSampler], ids=["fastgcn", "ladies"])
@pytest.mark.parametrize("device", DEVICES)
def test_two_layer_debiased_product_is_unbiased(cls, device):
    # E[B_out (B_in H)] = L[batch, :] L H: the layers compose (conditioning on the upper sample)
    graph = random_graph(50, 120, 10)
    lap = dense_laplacian(graph)
    h = torch.randn(50, 1, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    seeds = torch.tensor([1, 2, 40])
    sampler = on_device(cls(graph, [20, 10], debias=True), device)
    torch.manual_seed(12)
    trials = 1200
    est = torch.zeros(trials, 3, dtype=torch.float64)
    for t in range(trials):
        b = sampler.sample(seeds.to(device)).to("cpu")
        inner = b.blocks[0].aggregate(h[b.input_nodes].float())
        est[t] = b.blocks[1].aggregate(inner).double()[:, 0]
    truth = (lap @ lap @ h)[seeds, 0]
    se = est.std(0) / trials**0.5
    assert ((est.mean(0) - truth).abs() <= 4.5 * se + 1e-5).all()


def test_flat_probabilities_are_column_norms_not_squared():
    graph = random_graph(80, 200, 13)
    lap = dense_laplacian(graph)
    sq = lap.square().sum(0)
    torch.testing.assert_close(FastGCNSampler(graph, [8])._dist.p, sq / sq.sum())
    torch.testing.assert_close(FastGCNSampler(graph, [8], flat=True)._dist.p, sq.sqrt() / sq.sqrt().sum())
    prev = torch.tensor([3, 4, 50])
    for flat in (False, True):
        s = LADIESSampler(graph, [8], flat=flat)
        dist = s.distribution(prev)
        col = lap[prev].square().sum(0)
        col = col.sqrt() if flat else col
        expect = torch.zeros(80, dtype=torch.float64)
        expect[dist.support] = dist.p
        torch.testing.assert_close(expect, col / col.sum())  # support = union of rows of prev (eq. 6)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_isolated_nodes_and_tiny_graphs_do_not_crash(variant):
    cls, flat, debias = variant
    # 3 nodes, no edges: every column of L is a self loop only; s is clipped to the support
    empty = CSRGraph(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 3)
    b = cls(empty, [10, 10], flat=bool(flat), debias=bool(debias)).sample(torch.tensor([0, 2]))
    for block in b.blocks:
        assert torch.isfinite(block.weights).all()
    assert b.input_nodes.unique().numel() == b.input_nodes.numel() <= 3
    # a graph with an isolated seed: the seed's row holds only its self loop
    g = CSRGraph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 5, symmetrize=True)
    b = cls(g, [4], flat=bool(flat), debias=bool(debias)).sample(torch.tensor([4, 0]))
    assert torch.isfinite(b.blocks[0].weights).all()
    assert b.blocks[0].num_dst == 2


def test_bad_arguments_raise_clear_errors():
    graph = random_graph(10, 20, 0)
    with pytest.raises(ValueError, match="samples must be positive"):
        LADIESSampler(graph, [0, 5])
    with pytest.raises(ValueError, match="seeds is empty"):
        FastGCNSampler(graph, [5]).sample(torch.empty(0, dtype=torch.int64))


def test_sampler_pickles_without_its_scratch_array():
    graph = random_graph(100, 300, 1)
    sampler = LADIESSampler(graph, [16, 8], debias=True)
    sampler.sample(torch.arange(5))
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone._scratch is None
    batch = clone.sample(torch.arange(5))
    assert batch.input_nodes.numel() == 16
    assert (sampler.scratch() == -1).all()  # scratch left clean after sampling


@pytest.mark.parametrize("flat", [False, True], ids=["ladies_d", "ladies_fd"])
@pytest.mark.parametrize("device", DEVICES)
def test_ladies_draws_from_entries_are_unbiased_and_match_the_column_law(flat, device):
    # many rows against s (4 s <= entries): LADIES draws columns through entries drawn ∝ L_ij²
    # (flat: ∝ L_ij² / sqrt(π_j)); the block still equals L[batch, S] · diag(w) with p of eq. 7/10
    from lightning_mqgnn.sampling.debias import debias_weights
    from lightning_mqgnn.sampling.layerwise import row_entries

    graph = random_graph(60, 150, 4)
    lap = dense_laplacian(graph)
    seeds = torch.arange(0, 60, 3)
    sampler = LADIESSampler(graph, [6], flat=flat, debias=True)
    assert row_entries(graph, seeds).cols.numel() >= 4 * 6
    dist = sampler.distribution(seeds)
    p = torch.zeros(60, dtype=torch.float64)
    p[dist.support] = dist.p
    sampler = on_device(sampler, device)
    torch.manual_seed(14)
    batch = sampler.sample(seeds.to(device)).to("cpu")
    chosen = batch.input_nodes
    expect = lap[seeds][:, chosen] * debias_weights(p[chosen], 60)
    torch.testing.assert_close(block_dense(batch.blocks[0]), expect, rtol=1e-5, atol=1e-7)
    h = torch.randn(60, 2, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    est = one_layer_estimates(sampler, seeds, h, 1500, device)
    truth = lap[seeds] @ h
    se = est.std(0) / est.shape[0] ** 0.5
    assert ((est.mean(0) - truth).abs() <= 4.5 * se + 1e-5).all()
    # the first draw follows p exactly (successive sampling's first step)
    first = torch.zeros(60, dtype=torch.float64)
    trials = 3000
    for _ in range(trials):
        first[sampler.sample(seeds.to(device)).input_nodes[0].cpu()] += 1
    tol = 5 * (p * (1 - p) / trials).sqrt() + 1e-3
    assert ((first / trials - p).abs() <= tol).all()


@pytest.mark.parametrize("flat", [False, True], ids=["ladies", "ladies_f"])
def test_ladies_support_smaller_than_s_among_many_entries(flat):
    # K_10, 5 rows: 50 entries >= 4 s but only 10 distinct columns < s = 12: the entry draws
    # stall, the sample continues per column and s is clipped to the support
    n = 10
    src, dst = torch.combinations(torch.arange(n), 2).T
    graph = CSRGraph.from_edges(src, dst, n, symmetrize=True)
    for debias in (False, True):
        batch = LADIESSampler(graph, [12], flat=flat, debias=debias).sample(torch.arange(5))
        assert sorted(batch.input_nodes.tolist()) == list(range(n))
        assert torch.isfinite(batch.blocks[0].weights).all() and batch.blocks[0].num_edges == 5 * n


def test_flat_entry_weights_are_exact_whichever_way_the_accumulator_is_cleared():
    # N = 4000: 200 entries clear the whole accumulator (a sweep), 20 entries clear only what they
    # set; sums left behind by either would be read by the next call
    graph = random_graph(4000, 100, 6)
    sampler = LADIESSampler(graph, [8], flat=True)
    g = torch.Generator().manual_seed(7)
    base = torch.randint(0, 4000, (100,), generator=g)
    for size in (200, 20, 20, 200, 200, 20):
        # the same columns every call (where stale sums would be read), each one twice
        cols = base[: size // 2].repeat(2)
        sq = torch.rand(size, generator=g) + 0.1
        col_sum = torch.zeros(4000, dtype=torch.float64).index_add_(0, cols, sq.double())
        expect = (sq.double() / col_sum[cols].sqrt()).float()
        torch.testing.assert_close(sampler._flat_entry_weights(cols, sq), expect, rtol=1e-6, atol=0)


# Samples of every variant pinned for fixed seeds: a digest of the drawn nodes and block structure
# and the sum of the block weights, over three seed sets (few rows: LADIES's per-column draws;
# many rows: its per-entry draws). Refactoring a sampler must leave its samples bit-identical.
PINNED_SAMPLES = {
    ("FastGCNSampler", False, False): ("942f74253b452444", 435.0784702003002),
    ("FastGCNSampler", False, True): ("942f74253b452444", 434.7033124268055),
    ("FastGCNSampler", True, False): ("59a2d9873e047272", 450.2129073292017),
    ("FastGCNSampler", True, True): ("59a2d9873e047272", 450.10816599428654),
    ("LADIESSampler", False, False): ("4aadda59f4cbdf0e", 433.62661430612206),
    ("LADIESSampler", False, True): ("4aadda59f4cbdf0e", 429.7373774666339),
    ("LADIESSampler", True, False): ("253837acb6346407", 419.96762193366885),
    ("LADIESSampler", True, True): ("253837acb6346407", 423.47404694743454),
}


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_samples_for_fixed_seeds_are_unchanged(variant):
    import hashlib

    cls, flat, debias = variant
    sampler = cls(random_graph(300, 1500, 0), [64, 24], flat=bool(flat), debias=bool(debias))
    digest, weight_sum = hashlib.sha256(), 0.0
    for seed in range(3):
        torch.manual_seed(seed)
        for seeds in (torch.arange(0, 3), torch.arange(0, 40), torch.arange(100, 300, 7)):
            batch = sampler.sample(seeds)
            digest.update(batch.input_nodes.numpy().tobytes())
            for block in batch.blocks:
                digest.update(block.indptr.numpy().tobytes())
                digest.update(block.indices.numpy().tobytes())
                weight_sum += float(block.weights.double().sum())
    want_digest, want_sum = PINNED_SAMPLES[(cls.__name__, bool(flat), bool(debias))]
    assert digest.hexdigest()[:16] == want_digest
    assert weight_sum == pytest.approx(want_sum, rel=1e-9)


def test_a_layerwise_sampler_without_its_hooks_says_so():
    from lightning_mqgnn.sampling.layerwise import LayerwiseSampler

    with pytest.raises(NotImplementedError, match="must implement draw_layer"):
        LayerwiseSampler(random_graph(10, 20, 0), [4]).sample(torch.arange(3))
