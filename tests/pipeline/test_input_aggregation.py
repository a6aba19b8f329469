"""The first layer's aggregation computed in the gather stage: the same numbers as the layer's own,
in the workers and in the training thread, and training bit-identical to gathered inputs."""

from dataclasses import replace

import lightning.pytorch as pl
import pytest
import torch
from helpers.pipeline import make_trainer, seeded_module, small_dataset, worker_pipeline

from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def ds():
    return small_dataset()


def test_gathered_aggregation_is_the_blocks_own_and_features_are_not_gathered(ds):
    torch.manual_seed(0)
    seeds = ds.train_idx[:100]
    node_wise = NeighborSampler(ds.graph, [5, 5]).sample(seeds)
    rows = ds.features.index_select(0, node_wise.input_nodes)
    expected = node_wise.blocks[0].aggregate_with_self(rows)
    gather(node_wise, ds.features, ds.labels, input_aggregation="mean")
    assert node_wise.features is None and torch.equal(node_wise.labels, ds.labels[seeds])
    assert torch.equal(node_wise.aggregated, expected)
    with pytest.raises(ValueError, match="aggregate_inputs=False"):
        node_wise.input_features()

    layer_wise = FastGCNSampler(ds.graph, [64, 64]).sample(seeds)  # destinations not among sources
    assert not layer_wise.blocks[0].dst_in_src
    expected = layer_wise.blocks[0].aggregate(ds.features.index_select(0, layer_wise.input_nodes))
    assert torch.equal(
        gather(layer_wise, ds.features, ds.labels, input_aggregation="gcn").aggregated, expected
    )
    with pytest.raises(ValueError, match="source prefix"):
        gather(layer_wise, ds.features, ds.labels, input_aggregation="mean")


@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_a_step_on_the_aggregation_equals_a_step_on_the_rows(ds, conv):
    torch.manual_seed(1)
    aggregation = "mean" if conv == "sage" else "gcn"
    sampled = NeighborSampler(ds.graph, [5, 5], aggregation).sample(ds.train_idx[:200])
    rows = gather(replace(sampled), ds.features, ds.labels)
    aggregated = gather(replace(sampled), ds.features, ds.labels, input_aggregation=aggregation)
    assert rows.aggregated is None and aggregated.features is None
    results = []
    for batch in (rows, aggregated):
        torch.manual_seed(2)
        model = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=16, dropout=0.5)
        loss = model.training_step(batch, 0)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


def train(ds, mode: str, aggregate_inputs: bool, cache=None, sampler=None) -> torch.Tensor:
    dm = worker_pipeline(
        ds, sampler, mode, batch_size=128, seed=4, aggregate_inputs=aggregate_inputs, feature_cache=cache
    )
    model = seeded_module(ds, seed=3)
    make_trainer(max_epochs=2).fit(model, dm)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_workers_and_training_thread_train_identically_with_or_without_it(ds):
    reference = train(ds, "sequential", aggregate_inputs=False)
    assert torch.equal(train(ds, "sequential", aggregate_inputs=True), reference)
    assert torch.equal(train(ds, "pipeline", aggregate_inputs=True), reference)


def test_with_a_feature_cache_the_rows_are_gathered(ds):
    cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, seed=0)
    cache.refresh_(0)
    sampler = GNSSampler(ds.graph, [5, 5], cache)
    batch = gather(
        sampler.sample(ds.train_idx[:50]), ds.features, ds.labels, cache.slot, input_aggregation="mean"
    )
    assert batch.aggregated is None and batch.cache_slots is not None


class RowsOnlyClassifier(NodeClassifier):
    """The same layers, declaring that it reads feature rows only."""

    accepts_aggregated_inputs = False


class RecordBatchKind(pl.Callback):
    def __init__(self):
        self.kinds = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.kinds.add((batch.aggregated is not None, batch.features is not None))


@pytest.mark.parametrize("mode", ["sequential", "pipeline"])
@pytest.mark.parametrize(("module_cls", "aggregated"), [(NodeClassifier, True), (RowsOnlyClassifier, False)])
def test_the_datamodule_aggregates_only_for_modules_that_accept_it(ds, mode, module_cls, aggregated):
    dm = worker_pipeline(ds, mode=mode, batch_size=256, aggregate_inputs=True)
    assert dm.source.input_aggregation == "mean"  # no module attached yet: as configured
    record = RecordBatchKind()
    make_trainer(callbacks=[record], max_epochs=1).fit(
        module_cls(ds.num_features, ds.num_classes, hidden=8), dm
    )
    assert record.kinds == {(aggregated, not aggregated)}
