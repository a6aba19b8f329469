"""LinkPredictor's node inputs and decoders: a learnt table for a graph without features, used by
training batches (read by node id) and by exact inference alike; a decoder that does not fit the
encoder's width is refused in one line before any batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.graphs import random_graph

from lightning_mqgnn.graph.link_dataset import link_only_dataset
from lightning_mqgnn.models.inference import FullGraphBatch, FullGraphInference
from lightning_mqgnn.models.link_predictor import HadamardMLPDecoder, LinkPredictor
from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.sampling.edge_seeds import random_edge_seeds
from lightning_mqgnn.sampling.negative import UniformNegatives
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def featureless():
    torch.manual_seed(0)
    return random_edge_seeds(link_only_dataset("g", random_graph(120, 600, seed=2)), UniformNegatives(k=1))


def test_a_graph_without_features_trains_a_table_of_node_inputs(featureless):
    ds, seeds = featureless
    model = LinkPredictor(in_dim=ds.num_features, num_nodes=ds.num_nodes, hidden=8, num_layers=2)
    assert model.node_embedding.weight.shape == (120, 8) and not model.accepts_aggregated_inputs
    batch = seeds.sampler(NeighborSampler(ds.graph, [3, 3]), ds.graph).sample(torch.arange(16))
    gather(batch, ds.features, ds.labels)
    assert batch.features.shape == (batch.input_nodes.numel(), 0)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        model.score(model.batch_logits(batch), batch.pairs), batch.pair_labels
    )
    loss.backward()
    touched = model.node_embedding.weight.grad.abs().sum(1) > 0
    assert touched.any() and not touched[~torch.isin(torch.arange(120), batch.input_nodes)].any()


def test_exact_inference_reads_the_table(featureless):
    ds, _ = featureless
    model = LinkPredictor(in_dim=0, num_nodes=ds.num_nodes, hidden=8, node_embedding=5).eval()
    nodes = torch.arange(0, 120, 7)
    got = model._full_graph_logits(FullGraphBatch(ds, nodes, "val"))
    # the same layers over a dataset whose features are the table
    table = dataclasses.replace(ds, features=model.node_embedding.weight.detach().clone())
    want = FullGraphInference(table, model.aggregation).run(
        model.layers, torch.relu_, nodes, torch.device("cpu")
    )
    assert got.shape == (nodes.numel(), 8) and torch.allclose(got, want, atol=1e-6)


def test_features_are_used_unless_a_table_is_asked_for():
    assert LinkPredictor(in_dim=4, hidden=8).node_embedding is None
    model = LinkPredictor(in_dim=4, hidden=8, num_nodes=10, node_embedding=6)
    assert model.node_embedding.weight.shape == (10, 6)
    with pytest.raises(ValueError, match=r"needs num_nodes >= 1 .* got num_nodes=None"):
        LinkPredictor(in_dim=0, hidden=8)


def test_a_decoder_that_does_not_fit_the_encoder_is_one_line():
    with pytest.raises(ValueError) as err:
        LinkPredictor(in_dim=4, hidden=16, decoder=HadamardMLPDecoder(8))
    message = str(err.value)
    assert "\n" not in message
    assert "decoder HadamardMLPDecoder does not take the encoder's embeddings of width 16" in message
    model = LinkPredictor(in_dim=4, hidden=16, embedding=8, decoder=HadamardMLPDecoder(8))
    assert model.hparams["decoder"] == "HadamardMLPDecoder"

    class Pairwise(torch.nn.Module):
        def forward(self, src, dst):
            return src * dst

    with pytest.raises(ValueError, match=r"decoder Pairwise gives \(2, 16\) for 2 pairs of width 16"):
        LinkPredictor(in_dim=4, hidden=16, decoder=Pairwise())
    with pytest.raises(ValueError, match=r"metric must be one of \('hits', 'mrr'\), got 'auc'"):
        LinkPredictor(in_dim=4, metric="auc")
