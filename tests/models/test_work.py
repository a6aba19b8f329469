"""Work in rows and edges: a training batch's (its blocks, forward and backward) and exact
inference's (each computed row and its in-edges), the unit of ValidationWorkBudget."""

import torch
from helpers.graphs import random_graph, ring_dataset

from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.models.inference import FullGraphInference
from lightning_mqgnn.models.work import TRAINING_PASSES, batch_work, inference_work
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def test_a_training_batch_weighs_its_blocks_rows_and_edges_forward_and_backward():
    graph = random_graph()
    batch = NeighborSampler(graph, [4, 3], "mean").sample(torch.arange(16))
    touched = sum(block.num_src + block.num_edges for block in batch.blocks)
    assert touched > 2 * 16
    assert batch_work(batch) == TRAINING_PASSES * touched


def test_inference_weighs_every_computed_row_and_its_in_edges():
    graph = random_graph()
    degrees = graph.indptr[1:] - graph.indptr[:-1]
    rows = torch.tensor([0, 5, 7])
    assert inference_work(graph, [None]) == graph.num_nodes + graph.num_edges
    assert inference_work(graph, [rows]) == 3 + int(degrees[rows].sum())
    assert inference_work(graph, [None, rows]) == graph.num_nodes + graph.num_edges + 3 + int(
        degrees[rows].sum()
    )


def test_a_models_validation_weighs_the_rows_exact_inference_computes_for_the_validation_nodes():
    dataset = ring_dataset(num_nodes=40)
    model = NodeClassifier(dataset.num_features, dataset.num_classes, conv="sage", num_layers=2)

    class Trainer:  # what validation_work reads of a trainer
        datamodule = type("DataModule", (), {"dataset": dataset})()

    model._trainer = Trainer()
    rows = FullGraphInference(dataset, model.aggregation).rows_per_layer(dataset.val_idx, 2)
    assert model.validation_work() == inference_work(dataset.graph, rows)
    # the last layer scores the validation nodes alone, the one below their closure in the ring
    assert rows[1].tolist() == dataset.val_idx.tolist()
