"""The DataModule's loader configs, pickling (ddp_spawn) and evaluation loaders."""

import pickle

import pytest
import torch
from helpers.paths import CONF
from helpers.pipeline import small_dataset, worker_pipeline
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.models.inference import FullGraphBatch, FullGraphLoader
from lightning_mqgnn.pipeline.loader import PipelinedLoader
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.sampling.neighbor import NeighborSampler

CONF = CONF / "loader"


@pytest.fixture(scope="module")
def ds():
    return small_dataset(600)


@pytest.mark.parametrize(
    ("name", "mode", "loader_type"),
    [("sequential", "sequential", SequentialLoader), ("pipeline", "pipeline", PipelinedLoader)],
)
def test_loader_configs_instantiate_with_the_recipe_call_shape(ds, name, mode, loader_type):
    cfg = OmegaConf.merge(OmegaConf.create({"seed": 5}), {"loader": OmegaConf.load(CONF / f"{name}.yaml")})
    settings = instantiate(cfg.loader)
    assert isinstance(settings, LoaderSettings) and settings.mode == mode and settings.seed == 5
    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [5, 5]), settings)
    assert dm.settings is settings and dm.source.seed == 5
    assert isinstance(dm.train_dataloader(), loader_type)
    if mode == "pipeline":
        assert dm.settings.queue_size == "auto" and dm.settings.num_workers is None


def test_datamodule_pickles_without_live_workers(ds):
    dm = worker_pipeline(ds, NeighborSampler(ds.graph, [5]), batch_size=64, num_workers=1)
    loader = dm.train_dataloader()
    try:
        first = next(iter(loader))  # workers and transfer thread are running now
        clone = pickle.loads(pickle.dumps(dm))
    finally:
        dm.shutdown_pipeline()
    assert clone.pipeline_loader is None and clone.settings.mode == "pipeline"
    assert first.meta["index"] == 0
    assert clone.graph_stats() == (ds.num_nodes, ds.graph.num_edges)


def test_evaluation_loaders_yield_one_full_graph_batch(ds):
    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [5]), LoaderSettings(mode="pipeline"))
    for loader, idx in ((dm.val_dataloader(), ds.val_idx), (dm.test_dataloader(), ds.test_idx)):
        assert isinstance(loader, FullGraphLoader) and len(loader) == 1
        (batch,) = list(loader)
        assert isinstance(batch, FullGraphBatch) and torch.equal(batch.nodes, idx)
    assert dm.pipeline_loader is None  # evaluation never starts the pipeline
