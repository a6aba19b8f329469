"""Batches seeded by edges: the pairs and their labels, the endpoints' blocks from every sampler,
the seed edges gone from those blocks, and the same batches from every loader."""

import dataclasses

import pytest
import torch
from helpers.graphs import random_graph
from helpers.pipeline import small_dataset

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.link_split import random_link_split, save_link_split
from lightning_mqgnn.pipeline import (
    BatchSource,
    EpochPlan,
    PipelinedLoader,
    PipelineSettings,
    SequentialLoader,
)
from lightning_mqgnn.pipeline.produce import sample_batch
from lightning_mqgnn.sampling.edge_seeds import EdgeSeeds, layer_nodes, random_edge_seeds
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.labor import LaborSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler
from lightning_mqgnn.sampling.negative import UniformNegatives
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def split():
    graph = random_graph(n=400, m=4000, seed=1)
    training_graph, link_split = random_link_split(graph, seed=0)
    return training_graph, link_split


def samplers(graph):
    cache = GNSCache(graph, torch.arange(graph.num_nodes), fraction=0.1, fanouts=(4, 4), seed=0)
    return {
        "neighbor": NeighborSampler(graph, [-1, -1], "mean"),  # every edge: the seed edges are met
        "labor": LaborSampler(graph, [4, 4], "mean"),
        "gns": GNSSampler(graph, [4, 4], cache),
        "ladies": LADIESSampler(graph, [300, 300]),
    }


def drawn(sampler, ids, seed=5):
    """``sampler``'s batch of ``ids`` as sampled, before ``sample_batch`` drops what it read."""
    torch.manual_seed(seed)
    return sampler.sample(ids)


def block_edges(batch):
    """Every block's edges as (layer, global source, global destination) triples."""
    layers = layer_nodes(batch)
    out = set()
    for i, block in enumerate(batch.blocks):
        src, dst = layers[i][block.indices], layers[i + 1][block.dst_ids()]
        out |= {(i, int(u), int(v)) for u, v in zip(src, dst)}
    return out


@pytest.mark.parametrize("name", ["neighbor", "labor", "gns", "ladies"])
def test_a_batch_scores_its_positives_and_negatives_over_blocks_without_the_seed_edges(split, name):
    graph, link_split = split
    nodes = samplers(graph)[name]
    seeds = EdgeSeeds(link_split, UniformNegatives(k=2))
    ids = torch.arange(0, 60, 3)
    batch = drawn(seeds.sampler(nodes, graph), ids)
    positives = link_split.train[:, ids]
    # pairs: positions in output_nodes; the positives first, then k negatives each, labelled 1 and 0
    pairs = batch.output_nodes[batch.pairs]
    assert torch.equal(pairs[:, : ids.numel()], positives)
    assert pairs.shape[1] == 3 * ids.numel()
    assert torch.equal(pairs[0, ids.numel() :], positives[0].repeat_interleave(2))  # sources kept
    assert batch.pair_labels.tolist() == [1.0] * ids.numel() + [0.0] * (2 * ids.numel())
    assert torch.equal(batch.output_nodes, torch.unique(pairs))
    # the layers' nodes a layer-wise sampler records are read inside sampling, not shipped on
    assert "layer_nodes" not in sample_batch(seeds.sampler(nodes, graph), ids, rng_seed=5, index=0).meta
    # the seed edges, both directions, are in no block; the same batch without exclusion has them
    seed_pairs = {(int(u), int(v)) for u, v in positives.t()} | {(int(v), int(u)) for u, v in positives.t()}
    assert not {(u, v) for _, u, v in block_edges(batch)} & seed_pairs
    loose = EdgeSeeds(link_split, UniformNegatives(k=2), exclude="none").sampler(nodes, graph)
    unfiltered = drawn(loose, ids)
    leaked = {(u, v) for _, u, v in block_edges(unfiltered)} & seed_pairs
    if name == "neighbor":  # every in-edge of the endpoints is taken: each seed edge, both ways
        assert leaked == seed_pairs
    assert leaked  # every sampler meets some of them
    # nothing else was removed: the rest of each block is the unfiltered block's
    kept = {(i, u, v) for i, u, v in block_edges(unfiltered) if (u, v) not in seed_pairs}
    assert block_edges(batch) == kept


def test_a_row_that_loses_edges_keeps_its_weight_sum(split):
    graph, link_split = split
    seeds = EdgeSeeds(link_split, UniformNegatives())
    ids = torch.arange(40)
    batch = sample_batch(seeds.sampler(NeighborSampler(graph, [-1, -1], "mean"), graph), ids, 3, 0)
    for block in batch.blocks:  # mean aggregation over the neighbours left: rows sum to 1
        sums = torch.zeros(block.num_dst).index_add_(0, block.dst_ids(), block.weights)
        has_edges = (block.indptr[1:] - block.indptr[:-1]) > 0
        assert torch.allclose(sums[has_edges], torch.ones(int(has_edges.sum())))
    # the transposes the training step's backward reads were built from the filtered edges
    upper = batch.blocks[1]
    assert upper.src_indptr is not None and int(upper.src_indptr[-1]) == upper.num_edges


def test_directed_exclusion_removes_only_the_seed_direction(split):
    graph, link_split = split
    ids = torch.arange(30)
    make = lambda exclude: EdgeSeeds(link_split, UniformNegatives(), exclude).sampler(  # noqa: E731
        NeighborSampler(graph, [-1, -1], "mean"), graph
    )
    one_way = block_edges(drawn(make("self"), ids))
    positives = link_split.train[:, ids]
    forward = {(int(u), int(v)) for u, v in positives.t()}
    backward = {(v, u) for u, v in forward}
    present = {(u, v) for _, u, v in one_way}
    assert not present & forward and present & backward


def test_bad_seeds_are_refused_in_one_line(split):
    _, link_split = split
    with pytest.raises(ValueError, match=r"EdgeSeeds.exclude must be one of .* got 'both'"):
        EdgeSeeds(link_split, UniformNegatives(), exclude="both")


@pytest.mark.parametrize("mode", ["sequential", "pipeline"])
def test_every_loader_delivers_the_same_edge_batches(mode):
    ds = small_dataset(num_nodes=600)
    ds, seeds = random_edge_seeds(ds, UniformNegatives(k=1), seed=0)
    reference = BatchSource(ds, seeds.sampler(NeighborSampler(ds.graph, [4, 4]), ds.graph), 256, seed=3)
    reference.seed_ids = torch.arange(seeds.num_seeds)
    source = dataclasses.replace(reference, aggregate_inputs=True)
    if mode == "sequential":
        loader = SequentialLoader(source)
    else:
        loader = PipelinedLoader(
            source, PipelineSettings(num_workers=1, producer="workers"), EpochPlan(max_epochs=1)
        )
    try:
        loader.set_epoch(0)
        got = list(loader)
    finally:
        if mode == "pipeline":
            loader.shutdown()
    assert len(got) == reference.num_batches() > 1
    for index, (batch, ids) in enumerate(zip(got, reference.epoch_seeds(0))):
        expected = reference.produce_here(0, index, ids)
        assert torch.equal(batch.pairs, expected.pairs) and torch.equal(
            batch.pair_labels, expected.pair_labels
        )
        assert torch.equal(batch.output_nodes, expected.output_nodes)
        for a, b in zip(batch.blocks, expected.blocks, strict=True):
            assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
        assert batch.aggregated is not None  # the gather stage aggregated the endpoints' first layer


def test_edge_seeds_from_a_split_file_score_its_pairs_and_refuse_another_graphs(tmp_path):
    ds = small_dataset(num_nodes=600)
    drawn_ds, drawn = random_edge_seeds(ds, UniformNegatives(k=1), seed=5, neg_per_source=3)
    path = save_link_split(drawn.split, tmp_path / "split.npz")
    loaded_ds, loaded = random_edge_seeds(ds, UniformNegatives(k=1), seed=0, split_file=str(path))
    for f in ("train", "val_pos", "test_pos", "val_neg", "test_neg", "test_neg_per_source"):
        assert torch.equal(getattr(loaded.split, f), getattr(drawn.split, f)), f
    assert torch.equal(loaded_ds.graph.indices, drawn_ds.graph.indices)
    assert torch.equal(loaded_ds.features, ds.features)
    with pytest.raises(ValueError, match=r"split.npz\): a split of 600 nodes, the graph has 500"):
        random_edge_seeds(small_dataset(num_nodes=500), UniformNegatives(k=1), split_file=str(path))
    src, dst = drawn.split.val_neg[:, :1]  # a graph in which one of the split's negatives is an edge
    graph = CSRGraph.from_edges(torch.cat([ds.graph.row_ids(), src]), torch.cat([ds.graph.indices, dst]), 600)
    with pytest.raises(ValueError, match=r"split.npz\): field 'val_neg' holds 1 true edges"):
        random_edge_seeds(dataclasses.replace(ds, graph=graph), UniformNegatives(k=1), split_file=str(path))
