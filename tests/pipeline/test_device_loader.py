"""The device-resident loader on device=cpu: the same code path a GPU runs (null stream, no-op
events). Its batches are SequentialLoader's for every sampler, its producer thread leaves the
training thread's random stream alone, errors surface within seconds and no thread outlives it."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers.pipeline import (
    assert_epochs_agree,
    assert_same_batches,
    drain_raises_within,
    make_trainer,
    seeded_module,
    small_dataset,
)

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader, resident_sizes
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.labor import LaborSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler
from lightning_mqgnn.sampling.neighbor import NeighborSampler

THREAD = "mqgnn-device-sampler"


@pytest.fixture(scope="module")
def ds():
    return small_dataset(1500)


def sampler_variants(graph):
    """The ten model variants' samplers (conf/model): GCN and SAGE node-wise, FastGCN and LADIES
    with and without +flat and +debias; layer-wise sizes scaled down to the small graph."""
    out = {
        "gcn": NeighborSampler(graph, [5, 5], "gcn"),
        "sage": NeighborSampler(graph, [5, 5], "mean"),
    }
    for cls, name in ((FastGCNSampler, "fastgcn"), (LADIESSampler, "ladies")):
        for flat in (False, True):
            for debias in (False, True):
                suffix = ("_" + "f" * flat + "d" * debias) if (flat or debias) else ""
                out[name + suffix] = cls(graph, [256, 128], flat=flat, debias=debias)
    return out


VARIANTS = ["gcn", "sage"] + [n + s for n in ("fastgcn", "ladies") for s in ("", "_f", "_d", "_fd")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_device_loader_on_cpu_gives_the_sequential_batches(ds, variant):
    sampler = sampler_variants(ds.graph)[variant]
    aggregate = variant in ("gcn", "sage")  # node-wise: the gather stage aggregates the first layer
    source = BatchSource(ds, sampler, batch_size=256, seed=3, aggregate_inputs=aggregate)
    seq, dev = SequentialLoader(source), DeviceResidentLoader(source, queue_size=2)
    try:
        assert_epochs_agree(seq, dev)
    finally:
        dev.shutdown()
    assert not dev.producer_alive()


@pytest.mark.parametrize("sampling", ["neighbor", "labor"])
def test_device_loader_with_the_gns_cache_gives_the_sequential_batches(ds, sampling):
    def source():
        cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, fanouts=(5, 5), seed=1)
        sampler = GNSSampler(ds.graph, [5, 5], cache, sampling=sampling, estimator="hajek")
        return BatchSource(ds, sampler, 256, seed=5, feature_cache=cache)

    seq_source, dev_source = source(), source()
    seq, dev = SequentialLoader(seq_source), DeviceResidentLoader(dev_source)
    for epoch in (0, 1, 2):  # the cache is redrawn every epoch and copied to the device copy
        seq.set_epoch(epoch)
        dev.set_epoch(epoch)
        expected, got = list(seq), list(dev)
        assert_same_batches(expected, got)
        assert {b.meta["cache_version"] for b in got} == {epoch}
    assert int(dev.resident.cache.version) == 2
    dev.shutdown()


@pytest.mark.parametrize("importance_sampling", [0, 1])
def test_device_loader_with_labor_gives_the_sequential_batches(ds, importance_sampling):
    source = BatchSource(ds, LaborSampler(ds.graph, [5, 5], "mean", importance_sampling), 256, seed=4)
    seq, dev = SequentialLoader(source), DeviceResidentLoader(source)
    assert_same_batches(list(seq), list(dev))


def test_producer_thread_leaves_the_training_threads_random_stream_alone(ds):
    source = BatchSource(ds, NeighborSampler(ds.graph, [5, 5]), batch_size=128)

    def draws(loader):
        torch.manual_seed(11)
        out = []
        for _ in loader or range(len(SequentialLoader(source))):
            time.sleep(0.002)  # let the producer run between the training thread's draws
            out.append(torch.rand(3))
        return torch.stack(out)

    alone = draws(None)
    loader = DeviceResidentLoader(source, queue_size=3)
    assert torch.equal(draws(loader), alone)


class FailingSampler(NeighborSampler):
    def __init__(self, graph, fail_on: int):
        super().__init__(graph, [5, 5], "mean")
        self.fail_on = fail_on
        self.calls = 0

    def sample(self, seeds):
        self.calls += 1
        if self.calls >= self.fail_on:
            raise ValueError(f"injected sampler failure on call {self.calls}")
        return super().sample(seeds)


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD and t.is_alive()]


def test_a_producer_error_surfaces_within_seconds_and_leaves_no_thread(ds):
    loader = DeviceResidentLoader(BatchSource(ds, FailingSampler(ds.graph, 3), batch_size=100))
    info = drain_raises_within(loader, 5.0, "device-resident sampling failed")
    assert "injected sampler failure on call 3" in repr(info.value.__cause__)
    assert not loader.producer_alive() and sampler_threads() == []


def test_an_abandoned_epoch_is_stopped_and_joined(ds):
    loader = DeviceResidentLoader(
        BatchSource(ds, NeighborSampler(ds.graph, [5, 5]), batch_size=64), queue_size=1
    )
    it = iter(loader)
    next(it)
    assert loader.producer_alive()  # blocked on the full queue
    loader.shutdown()
    assert not loader.producer_alive() and sampler_threads() == []


def test_datamodule_device_mode_trains_like_the_sequential_mode(ds):
    weights = {}
    for mode in ("sequential", "device"):
        dm = MQGNNDataModule(
            ds,
            NeighborSampler(ds.graph, [5, 5]),
            LoaderSettings(batch_size=256, seed=7, mode=mode, aggregate_inputs=True),
        )
        module = seeded_module(ds)
        make_trainer(max_epochs=2).fit(module, dm)
        weights[mode] = [p.detach().clone() for p in module.parameters()]
        if mode == "device":
            assert isinstance(dm.device_loader, DeviceResidentLoader)
            assert not dm.device_loader.producer_alive()
    for a, b in zip(weights["sequential"], weights["device"]):
        assert torch.equal(a, b)
    assert sampler_threads() == []


def test_an_error_inside_fit_stops_the_producer(ds):
    dm = MQGNNDataModule(ds, FailingSampler(ds.graph, 4), LoaderSettings(batch_size=100, mode="device"))
    with pytest.raises(RuntimeError, match="device-resident sampling failed"):
        make_trainer(max_epochs=1).fit(seeded_module(ds), dm)
    assert sampler_threads() == []


def test_placement_options_are_checked(ds):
    s = NeighborSampler(ds.graph, [5, 5])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sample_on='cuda'.*no CUDA"):
            MQGNNDataModule(ds, s, LoaderSettings(sample_on="cuda")).train_dataloader()
    # auto on a CPU trainer: CPU sampling
    dm = MQGNNDataModule(ds, s, LoaderSettings(mode="pipeline", sample_on="auto"))
    assert not dm.placement().on_device and not dm.uses_device_loader()


def test_resident_sizes_count_the_graph_once_and_the_features(ds):
    cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, seed=0)
    source = BatchSource(ds, GNSSampler(ds.graph, [5, 5], cache), feature_cache=cache)
    graph_bytes, feature_bytes = resident_sizes(source)
    csr = ds.graph.indptr.nbytes + ds.graph.indices.nbytes
    assert feature_bytes == ds.features.nbytes
    # the sampler, its upper sampler and the cache share one CSR: counted once
    assert csr + cache.slot.nbytes < graph_bytes < 3 * csr + 40 * ds.num_nodes * 8


def test_an_error_in_the_training_step_stops_the_producer(ds):
    class FailingStep(type(seeded_module(ds))):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise ValueError("injected training failure")
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    module = FailingStep(ds.num_features, ds.num_classes, conv="sage", hidden=16)
    dm = MQGNNDataModule(
        ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=64, mode="device", queue_size=1)
    )
    with pytest.raises(ValueError, match="injected training failure"):
        make_trainer(max_epochs=1).fit(module, dm)
    assert sampler_threads() == []
