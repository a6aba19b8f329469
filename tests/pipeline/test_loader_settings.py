"""``LoaderSettings``: every plain setting of the DataModule in one object, a bad one refused when
made with one line naming its field and value, and a DataModule built from it trains on the
batches the settings say."""

import dataclasses

import lightning.pytorch as pl
import pytest
import torch
from helpers.paths import CONF
from helpers.pipeline import make_trainer, seeded_module, small_dataset
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from typing_extensions import override

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline import BatchSource, SequentialLoader
from lightning_mqgnn.sampling.neighbor import NeighborSampler

BAD = [  # (settings, the field and value the one line names)
    ({"mode": "overlap"}, "mode must be one of ('sequential', 'pipeline', 'device'), got 'overlap'"),
    ({"batch_size": 0}, "batch_size must be positive, got 0"),
    ({"num_workers": 0}, "num_workers must be >= 1 (or None for auto), got 0"),
    ({"queue_size": 0}, "queue_size must be a positive int or 'auto', got 0"),
    ({"queue_size": "big"}, "queue_size must be a positive int or 'auto', got 'big'"),
    ({"cpu_queue_size": 0}, "cpu_queue_size must be >= 1 (or None for auto), got 0"),
    ({"start_method": "thread"}, "start_method must be one of"),
    ({"worker_threads": 0}, "worker_threads must be >= 1, got 0"),
    ({"start_method": "fork", "worker_threads": 2}, "worker_threads=2 with start_method='fork'"),
    ({"warmup_batches": -1}, "warmup_batches must be >= 0, got -1"),
    ({"window_batches": 0}, "window_batches must be >= 1, got 0"),
    ({"memory_margin": 1.0}, "memory_margin must be in [0, 1), got 1.0"),
    ({"producer": "thread"}, "producer must be one of ('auto', 'workers'), got 'thread'"),
    ({"sample_on": "gpu"}, "sample_on must be one of ('auto', 'cpu', 'cuda'), got 'gpu'"),
    ({"features_on": "device"}, "features_on must be one of ('auto', 'cpu', 'cuda'), got 'device'"),
    (
        {"device_sampler": "subprocess"},
        "device_sampler must be one of ('thread', 'process'), got 'subprocess'",
    ),
    ({"sampler_processes": 0}, "sampler_processes must be >= 1, got 0"),
    ({"host_cache_gb": -1.0}, "host_cache_gb must be >= 0, got -1.0"),
    ({"host_cache_policy": "lru"}, "host_cache_policy must be one of ('degree', 'walk'), got 'lru'"),
    ({"host_cache_gb": 1.0, "mode": "device"}, "host_cache_gb=1.0 with mode='device'"),
]


@pytest.mark.parametrize(("settings", "message"), BAD, ids=[" ".join(s) for s, _ in BAD])
def test_a_bad_setting_is_one_line_naming_its_field_and_value(settings, message):
    with pytest.raises(ValueError) as err:
        LoaderSettings(**settings)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_settings_are_one_frozen_object_with_the_datamodules_defaults():
    settings = LoaderSettings()
    assert (settings.mode, settings.batch_size, settings.queue_size, settings.sample_on) == (
        "sequential",
        1024,
        "auto",
        "cpu",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.batch_size = 2  # type: ignore[misc]
    ds = small_dataset(300)
    assert MQGNNDataModule(ds, NeighborSampler(ds.graph, [3])).settings == settings


@pytest.mark.parametrize("name", ["sequential", "pipeline", "device"])
def test_every_sampled_loader_config_is_the_settings_with_its_overrides(name):
    cfg = OmegaConf.merge({"seed": 3}, {"loader": OmegaConf.load(CONF / "loader" / f"{name}.yaml")})
    cfg.loader.batch_size = 128  # loader.batch_size=128 on the recipe's command line
    settings = instantiate(cfg.loader)
    assert isinstance(settings, LoaderSettings)
    assert (settings.mode, settings.batch_size, settings.seed) == (name, 128, 3)
    cfg.loader.mode = "overlap"
    with pytest.raises(InstantiationException) as err:
        instantiate(cfg.loader)
    assert "mode must be one of" in str(err.value.__cause__)


class Seen(pl.Callback):
    def __init__(self):
        self.seeds: list[torch.Tensor] = []

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seeds.append(batch.output_nodes.clone())


def test_a_datamodule_built_from_settings_trains_on_the_batches_they_say():
    ds = small_dataset(600)
    settings = LoaderSettings(batch_size=100, seed=4, shuffle=False, drop_last=True)
    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [3, 3]), settings)
    seen = Seen()
    make_trainer([seen], max_epochs=1).fit(seeded_module(ds), dm)
    source = BatchSource(ds, NeighborSampler(ds.graph, [3, 3]), 100, shuffle=False, drop_last=True, seed=4)
    expected = [b.output_nodes for b in SequentialLoader(source)]
    assert len(seen.seeds) == len(expected) == ds.train_idx.numel() // 100
    assert all(torch.equal(a, b) for a, b in zip(seen.seeds, expected, strict=True))
