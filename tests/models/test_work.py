"""Work from the blocks, the graph and the layers' widths: a training batch's (its layers forward
and backward) and exact inference's, the unit of ValidationWorkBudget."""

import pytest
import torch
from helpers.graphs import random_graph, ring_dataset
from torch import nn

from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.models.inference import FullGraphInference
from lightning_mqgnn.models.work import (
    EDGE_ELEMENT_WORK,
    INPUT_LAYER_PASSES,
    SPARSE_ELEMENT_WORK,
    STEP_WORK,
    TRAINING_PASSES,
    LayerWidth,
    batch_work,
    inference_work,
    layer_widths,
    layer_work,
)
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def test_widths_come_from_the_weight_matrices_of_our_layers_and_of_any_other():
    model = NodeClassifier(10, 3, conv="sage", hidden=8, num_layers=2)
    assert model.layer_widths == [LayerWidth(10, 8, 2 * 10 * 8), LayerWidth(8, 3, 2 * 8 * 3)]
    gcn = NodeClassifier(10, 3, conv="gcn", hidden=8, num_layers=2)
    assert gcn.layer_widths == [LayerWidth(10, 8, 80), LayerWidth(8, 3, 24)]
    with pytest.raises(ValueError, match=r"layer 0 \(ReLU\) has no weight matrix"):
        layer_widths([nn.ReLU()])


def test_a_layer_takes_the_cheaper_order():
    width = LayerWidth(100, 4, 400)
    # few destinations: aggregate the wide inputs of each, then map the destinations
    assert layer_work(1000, 10, 50, width) == 50 * 100 * EDGE_ELEMENT_WORK + 10 * 400
    # many edges over few sources: map the sources, then aggregate the narrow outputs
    assert layer_work(20, 1000, 20_000, width) == 20 * 400 + 20_000 * 4 * EDGE_ELEMENT_WORK


def test_a_training_batch_weighs_its_layers_forward_and_backward_and_the_steps_fixed_cost():
    graph = random_graph()
    batch = NeighborSampler(graph, [4, 3], "mean").sample(torch.arange(16))
    widths = [LayerWidth(12, 6, 144), LayerWidth(6, 2, 24)]
    first, second = (layer_work(b.num_src, b.num_dst, b.num_edges, w) for b, w in zip(batch.blocks, widths))
    assert batch_work(batch, widths) == STEP_WORK + INPUT_LAYER_PASSES * first + TRAINING_PASSES * second
    # the first layer aggregated in the gather stage: aggregated once, mapped forward and back
    batch.aggregated = torch.zeros(batch.blocks[0].num_dst, 24)
    block = batch.blocks[0]
    gathered = block.num_edges * 12 * EDGE_ELEMENT_WORK + INPUT_LAYER_PASSES * block.num_dst * 144
    assert batch_work(batch, widths) == STEP_WORK + gathered + TRAINING_PASSES * second
    # wider layers weigh more: the schedule sees the width
    wide = [LayerWidth(1200, 6, 14_400), LayerWidth(6, 2, 24)]
    assert batch_work(batch, wide) > 10 * (batch_work(batch, widths) - STEP_WORK)


def test_inference_weighs_each_layer_over_its_rows_in_edges_with_the_rows_below_as_sources():
    graph = random_graph()
    degrees = graph.indptr[1:] - graph.indptr[:-1]
    rows = torch.tensor([0, 5, 7])
    widths = [LayerWidth(12, 6, 144), LayerWidth(6, 2, 24)]
    every = layer_work(graph.num_nodes, graph.num_nodes, graph.num_edges, widths[0])
    scored = layer_work(graph.num_nodes, 3, int(degrees[rows].sum()), widths[1])
    assert inference_work(graph, [None, rows], widths) == every + scored
    # sparse features: the first layer maps every node's non-zeros, then aggregates its outputs
    sparse = 50 * 144 / 12 * SPARSE_ELEMENT_WORK + graph.num_edges * 6 * EDGE_ELEMENT_WORK
    assert inference_work(graph, [None, rows], widths, input_nonzeros=50) == sparse + scored


def test_a_models_validation_weighs_the_rows_exact_inference_computes_for_the_validation_nodes():
    dataset = ring_dataset(num_nodes=40)
    model = NodeClassifier(dataset.num_features, dataset.num_classes, conv="sage", num_layers=2)

    class Trainer:  # what validation_work reads of a trainer
        datamodule = type("DataModule", (), {"dataset": dataset})()
        strategy = type("Strategy", (), {"root_device": torch.device("cpu")})()

    model._trainer = Trainer()
    inference = FullGraphInference(dataset, model.aggregation)
    rows = inference.rows_per_layer(dataset.val_idx, 2)
    nonzeros = inference.input_nonzeros(model.layers[0], torch.device("cpu"))
    assert model.validation_work() == inference_work(dataset.graph, rows, model.layer_widths, nonzeros)
    # the last layer scores the validation nodes alone, the one below their closure in the ring
    assert rows[1].tolist() == dataset.val_idx.tolist()
