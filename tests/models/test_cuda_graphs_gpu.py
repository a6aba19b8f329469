"""CUDA-graphed training steps on a GPU: the same training as eager steps without dropout, one
graph per bucket, recaptured when the parameters move, and a Lightning fit that learns."""

import pytest
import torch
from helpers.devices import require_cuda
from helpers.pipeline import make_trainer, small_dataset

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.models.cuda_graphs import bucket_of
from lightning_mqgnn.pipeline.produce import produce_batch
from lightning_mqgnn.sampling.neighbor import NeighborSampler

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ds():
    require_cuda()
    return small_dataset(1500)


def batches(ds, conv: str, sizes: list[int]) -> list:
    aggregation = {"sage": "mean", "gcn": "gcn"}[conv]
    sampler = NeighborSampler(ds.graph, [4, 4], aggregation)
    out, start = [], 0
    for i, n in enumerate(sizes):
        seeds = ds.train_idx[torch.arange(start, start + n) % ds.train_idx.numel()]
        start += n
        out.append(produce_batch(sampler, seeds, ds.features, ds.labels, 11, i, None, aggregation).to("cuda"))
    return out


def train(model: NodeClassifier, steps: list) -> list[float]:
    opt = model.configure_optimizers()
    losses = []
    for i, batch in enumerate(steps):
        opt.zero_grad(set_to_none=True)
        loss = model.training_step(batch, i)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_graphed_steps_train_as_the_eager_ones_without_dropout(ds, conv):
    steps = batches(ds, conv, [200, 150, 200, 190, 150, 200, 120])
    models = []
    for graphs in (True, False):
        torch.manual_seed(0)
        models.append(
            NodeClassifier(
                ds.num_features,
                ds.num_classes,
                conv=conv,
                hidden=32,
                dropout=0.0,
                lr=1e-2,
                cuda_graphs=graphs,
            )
            .cuda()
            .train()
        )
    graphed, eager = models
    first = [train(m, steps[:4]) for m in models]
    assert graphed._graph_steps.num_graphs == len({bucket_of(b) for b in steps[:4]}) >= 2
    old_storage = [p.data for m in models for p in m.parameters()]  # alive: new addresses below
    for m in models:  # every parameter moves: the graphs must be captured again
        for p in m.parameters():
            p.data = p.data.clone()
    second = [train(m, steps[4:]) for m in models]
    del old_storage
    assert first[0] == pytest.approx(first[1], rel=1e-4) and second[0] == pytest.approx(second[1], rel=1e-4)
    for p, q in zip(graphed.parameters(), eager.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5)
    buckets = {bucket_of(b) for b in steps[4:]}
    assert graphed._graph_steps.num_graphs == len(buckets) >= 2  # only those since the move


def test_a_cuda_fit_with_dropout_learns_from_graphed_steps(ds):
    torch.manual_seed(0)
    model = NodeClassifier(
        ds.num_features, ds.num_classes, conv="sage", hidden=32, dropout=0.5, lr=1e-2, cuda_graphs=True
    )
    dm = MQGNNDataModule(
        ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=128, seed=0, aggregate_inputs=True)
    )
    trainer = make_trainer(accelerator="gpu", max_epochs=4, limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(model, dm)
    assert model._graph_steps.num_graphs >= 1
    losses = trainer.callback_metrics["train/loss"]
    assert torch.isfinite(losses) and float(losses) < 1.2  # 4 classes: ln 4 = 1.39 at the start


def test_graphs_are_captured_while_a_device_resident_producer_samples(ds):
    """Thread-local capture: the producer thread keeps sampling on its own stream (allocating and
    reading sizes to the host) while the training thread captures a new bucket."""
    torch.manual_seed(0)
    model = NodeClassifier(
        ds.num_features, ds.num_classes, conv="sage", hidden=32, dropout=0.5, lr=1e-2, cuda_graphs=True
    )
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, [5, 5]),
        LoaderSettings(batch_size=128, mode="device", sample_on="auto", aggregate_inputs=True),
    )
    trainer = make_trainer(accelerator="gpu", max_epochs=3, limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(model, dm)
    assert dm.placement().on_device
    assert model._graph_steps.num_graphs >= 1
    assert float(trainer.callback_metrics["train/loss"]) < 1.2
