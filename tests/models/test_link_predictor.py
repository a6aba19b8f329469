"""LinkPredictor: NodeClassifier's encoder with a pair decoder, trained on edge-seeded batches and
scored on a split's fixed pairs as OGB scores them."""

import dataclasses

import lightning.pytorch as pl
import pytest
import torch

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.graph.link_generated import generate_link_graph
from lightning_mqgnn.models import LinkPredictor
from lightning_mqgnn.models.link_metrics import hits_at_k, mrr, roc_auc
from lightning_mqgnn.models.link_predictor import DotDecoder, HadamardMLPDecoder
from lightning_mqgnn.sampling.edge_seeds import random_edge_seeds
from lightning_mqgnn.sampling.negative import UniformNegatives
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def link_data():
    dataset = generate_link_graph(num_nodes=1500, seed=0)
    return random_edge_seeds(dataset, UniformNegatives(k=1), seed=0, neg_per_source=20)


def fit(link_data, epochs: int = 3, decoder: str = "dot", seed: int = 0):
    dataset, seeds = link_data
    pl.seed_everything(seed)
    datamodule = MQGNNDataModule(
        dataset,
        NeighborSampler(dataset.graph, [5, 5], "gcn"),
        LoaderSettings(batch_size=256, seed=seed, aggregate_inputs=True),
        seeds,
    )
    model = LinkPredictor(dataset.num_features, conv="gcn", hidden=32, lr=0.01, decoder=decoder)
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule)
    return model, datamodule, trainer


def test_training_on_edge_batches_learns_the_planted_links_and_scores_them_as_ogb_does(link_data):
    model, datamodule, trainer = fit(link_data)
    untrained = LinkPredictor(model.hparams.in_dim, conv="gcn", hidden=32)
    before = trainer.validate(untrained, datamodule, verbose=False)[0]
    after = trainer.validate(model, datamodule, verbose=False)[0]
    # an untrained GCN already smooths community features into useful embeddings; training adds
    assert after["val/metric"] > before["val/metric"] + 0.05, (before, after)
    assert after["val/mrr"] > before["val/mrr"] + 0.05 and after["val/auc"] > 0.8, (before, after)
    # the logged scores are link_metrics' over every node's exact embedding
    batch = datamodule.val_dataloader().batch
    model.eval()
    with torch.no_grad():
        every = model._inference_of(datamodule.dataset).run(
            model.layers, torch.relu_, torch.arange(datamodule.dataset.num_nodes), torch.device("cpu")
        )
        h = every[batch.nodes]
        pos, neg = model.score(h, batch.pos), model.score(h, batch.neg)
        own = model.score(
            h, torch.stack([batch.pos[0].repeat_interleave(20), batch.neg_per_source.reshape(-1)])
        )
    assert after["val/metric"] == pytest.approx(hits_at_k(pos, neg, 50), abs=1e-6)
    assert after["val/auc"] == pytest.approx(roc_auc(pos, neg), abs=1e-6)
    assert after["val/mrr"] == pytest.approx(mrr(pos, own.view(-1, 20)), abs=1e-6)


def test_the_same_seed_trains_the_same_weights(link_data):
    a, _, _ = fit(link_data, epochs=1, seed=3)
    b, _, _ = fit(link_data, epochs=1, seed=3)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def test_the_mlp_decoder_trains_and_both_decoders_are_symmetric(link_data):
    model, _, trainer = fit(link_data, epochs=1, decoder="mlp")
    assert trainer.callback_metrics["val/metric"] > 0.1
    u, v = torch.randn(5, 8), torch.randn(5, 8)
    for decoder in (DotDecoder(), HadamardMLPDecoder(8)):
        assert torch.allclose(decoder(u, v), decoder(v, u))


def test_bad_modules_and_batches_are_refused_in_one_line(link_data):
    with pytest.raises(ValueError, match=r"unknown decoder 'cosine'; expected one of \('dot', 'mlp'\)"):
        LinkPredictor(8, decoder="cosine")
    with pytest.raises(ValueError, match=r"num_classes=7 is a node classifier's output.*embedding=16"):
        LinkPredictor(8, hidden=16, num_classes=7)
    model = LinkPredictor(8, hidden=16)
    dataset, _ = link_data
    batch = NeighborSampler(dataset.graph, [3, 3]).sample(torch.arange(10))
    with pytest.raises(ValueError, match=r"LinkPredictor trains on batches seeded by edges"):
        model.training_step(batch, 0)
    from lightning_mqgnn.models import FullGraphBatch

    with pytest.raises(ValueError, match=r"the val loader gave a FullGraphBatch"):
        model.validation_step(FullGraphBatch(dataclasses.replace(dataset), torch.arange(3), "val"), 0)
