"""The full-graph strategies through Lightning on 4 forked CPU processes (gloo)."""

from __future__ import annotations

import helpers.fullgraph_ranks as ranks
import pytest
import torch

from lightning_mqgnn.fullgraph import FullGraphDataModule, FullGraphStrategy  # noqa: E402

pytestmark = pytest.mark.distributed


def _fit(strategy: FullGraphStrategy, conv: str, epochs: int, **trainer_kwargs):
    ds = ranks.small_dataset()
    model = ranks.make_model(conv, ds.num_features, ds.num_classes)
    trainer = ranks.quiet_trainer(strategy, epochs, **trainer_kwargs)
    datamodule = FullGraphDataModule(ds, aggregation=model.aggregation)
    trainer.fit(model, datamodule=datamodule)
    return model, trainer, datamodule


def _reference_weights(conv: str, steps: int) -> list[torch.Tensor]:
    ds = ranks.small_dataset()
    model = ranks.make_model(conv, ds.num_features, ds.num_classes)
    from lightning_mqgnn.sampling.exact import exact_operator, full_block

    block, _ = full_block(ds.graph, torch.arange(ds.num_nodes), exact_operator(ds.graph, model.aggregation))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        h = ds.features
        for i, layer in enumerate(model.layers):
            h = layer(block, h, h) if conv == "sage" else layer(block, h)
            h = torch.relu(h) if i < len(model.layers) - 1 else h
        loss = torch.nn.functional.cross_entropy(h[ds.train_idx], ds.labels[ds.train_idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_graph_parallel_strategy_trains_like_one_process(conv):
    model, _, _ = _fit(
        FullGraphStrategy(mode="sync", start_method="fork"), conv, epochs=3, limit_val_batches=0
    )
    for got, expected in zip(model.parameters(), _reference_weights(conv, steps=3)):
        torch.testing.assert_close(got.detach(), expected, rtol=1e-4, atol=1e-5)


def test_pipeqs_strategy_trains_and_scores():
    strategy = FullGraphStrategy(mode="stale", quantize=True, start_method="fork")
    model, trainer, _ = _fit(strategy, "gcn", epochs=4)
    assert trainer.callback_metrics["val/metric"] > 0.2  # 4 classes: above chance after 4 epochs
    stale_weights = [p.detach().clone() for p in model.parameters()]
    reference = _reference_weights("gcn", steps=4)
    assert any(not torch.allclose(a, b, atol=1e-5) for a, b in zip(stale_weights, reference))


def test_strategy_refuses_a_sampled_batch():
    strategy = FullGraphStrategy(mode="sync")
    with pytest.raises(TypeError, match="trains on PartitionBatch"):
        strategy._exchanger_for(object())
