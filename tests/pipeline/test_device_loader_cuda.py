"""The device-resident loader on a GPU: a sampler without random draws gives exactly the CPU
batches; random samplers draw from the device's own stream (Philox), so their batches are
compared with the CPU ones in distribution; host-gathered features and the GNS cache merge; an on-disk dataset's mapped rows are read."""

from __future__ import annotations

import pytest
import torch
from helpers.devices import require_cuda
from helpers.pipeline import make_trainer, seeded_module, small_dataset

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.graph.ondisk import open_dataset, write_dataset
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader
from lightning_mqgnn.pipeline.placement import Placement
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler
from lightning_mqgnn.sampling.neighbor import NeighborSampler

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def ds():
    require_cuda()
    return small_dataset(1500)


def cuda_loader(source, features_on=CUDA, queue_size=2):
    return DeviceResidentLoader(source, Placement(CUDA, features_on, "test"), queue_size)


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
def test_without_random_draws_the_gpu_batches_are_the_cpu_ones(ds, aggregation):
    # fan-out -1 takes every neighbour: the algorithm draws nothing, so the streams cannot differ
    source = BatchSource(
        ds, NeighborSampler(ds.graph, [-1, -1], aggregation), 256, seed=1, aggregate_inputs=True
    )
    expected, got = list(SequentialLoader(source)), list(cuda_loader(source))
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        assert b.input_nodes.is_cuda and b.aggregated.is_cuda
        b = b.to("cpu")
        assert torch.equal(a.input_nodes, b.input_nodes) and torch.equal(a.labels, b.labels)
        torch.testing.assert_close(a.aggregated, b.aggregated, rtol=1e-5, atol=1e-6)
        for p, q in zip(a.blocks, b.blocks):
            assert torch.equal(p.indptr, q.indptr) and torch.equal(p.indices, q.indices)
            torch.testing.assert_close(p.weights, q.weights)


@pytest.mark.parametrize(
    "make",
    [
        lambda g: NeighborSampler(g, [5, 5], "mean"),
        lambda g: NeighborSampler(g, [5, 5], "gcn"),
        lambda g: FastGCNSampler(g, [256, 128], debias=True),
        lambda g: LADIESSampler(g, [256, 128], flat=True),
    ],
    ids=["sage", "gcn", "fastgcn_d", "ladies_f"],
)
def test_random_samplers_draw_the_same_law_on_the_gpu(ds, make):
    # the seeds and the layer sizes' law agree: mean input nodes per batch over 6 epochs within 3%
    source = BatchSource(ds, make(ds.graph), 256, seed=2)
    seq, dev = SequentialLoader(source), cuda_loader(source)
    sizes = {"cpu": [], "cuda": []}
    for epoch in range(6):
        seq.set_epoch(epoch)
        dev.set_epoch(epoch)
        for a, b in zip(seq, dev):
            assert torch.equal(a.output_nodes, b.output_nodes.cpu())
            assert torch.equal(b.features.cpu(), ds.features[b.input_nodes.cpu()])
            sizes["cpu"].append(a.input_nodes.numel())
            sizes["cuda"].append(b.input_nodes.numel())
    cpu, cuda = (torch.tensor(v, dtype=torch.float64).mean() for v in sizes.values())
    assert abs(float(cpu - cuda)) <= 0.03 * float(cpu)
    dev.shutdown()


def test_host_gathered_features_and_the_gns_cache_merge_on_the_gpu(ds):
    cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, fanouts=(5, 5), seed=0)
    source = BatchSource(ds, GNSSampler(ds.graph, [5, 5], cache), 256, feature_cache=cache)
    loader = cuda_loader(source, features_on=CPU)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for b in loader:
            assert b.features.is_cuda and b.cache_slots is None
            assert torch.equal(b.features.cpu(), ds.features[b.input_nodes.cpu()])
            assert b.meta["cache_version"] == epoch
    assert int(loader.resident.cache.version) == 1


def test_fit_samples_on_the_gpu_under_auto_placement(ds):
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, [5, 5]),
        LoaderSettings(batch_size=256, mode="pipeline", sample_on="auto"),
    )
    make_trainer(max_epochs=2, accelerator="gpu", devices=1).fit(seeded_module(ds), dm)
    assert dm.placement().on_device and dm.placement().features_resident
    assert isinstance(dm.device_loader, DeviceResidentLoader) and dm.pipeline_loader is None
    assert not dm.device_loader.producer_alive()


@pytest.mark.parametrize("aggregate", [True, False], ids=["aggregated", "rows"])
def test_the_sampler_process_gives_the_threads_batches_on_the_gpu(ds, aggregate):
    # same per-batch seeds on the same device: the same Philox draws, by IPC from the child
    source = BatchSource(
        ds, NeighborSampler(ds.graph, [5, 5], "mean"), 256, seed=4, aggregate_inputs=aggregate
    )
    thread = cuda_loader(source)
    process = DeviceResidentLoader(
        source, Placement(CUDA, CUDA, "test"), 2, device_sampler="process", sampler_processes=2
    )
    try:
        for epoch in (0, 1):
            thread.set_epoch(epoch)
            process.set_epoch(epoch)
            expected, got = list(thread), list(process)
            assert len(expected) == len(got) > 0
            for a, b in zip(expected, got):
                assert b.input_nodes.is_cuda and torch.equal(a.input_nodes, b.input_nodes)
                assert torch.equal(a.labels, b.labels)
                for name in ("features", "aggregated"):
                    x, y = getattr(a, name), getattr(b, name)
                    assert (x is None) == (y is None), name
                    if x is not None:
                        torch.testing.assert_close(x, y)
                for p, q in zip(a.blocks, b.blocks):
                    assert torch.equal(p.indptr, q.indptr) and torch.equal(p.indices, q.indices)
                    torch.testing.assert_close(p.weights, q.weights)
        assert process.process is not None and process.process.alive()
    finally:
        thread.shutdown()
        process.shutdown()
    assert process.process is None


def test_fit_with_the_sampler_process_on_the_gpu(ds):
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, [5, 5]),
        LoaderSettings(batch_size=256, mode="device", sample_on="auto", device_sampler="process"),
    )
    make_trainer(max_epochs=2, accelerator="gpu", devices=1).fit(seeded_module(ds), dm)
    assert dm.device_loader.process is None and not dm.device_loader.producer_alive()


def test_an_ondisk_dataset_samples_on_the_gpu_and_reads_its_mapped_rows(ds, tmp_path):
    """Topology on the device, features left mapped on the host (as features too large for the
    device are) and stored in float16: every batch's rows are the dataset's, rounded, in float32."""
    mapped = open_dataset(write_dataset(ds, tmp_path / "ds", features_dtype="float16"))
    source = BatchSource(mapped, NeighborSampler(mapped.graph, [-1, -1], "mean"), 256, seed=1)
    expected = list(
        SequentialLoader(BatchSource(ds, NeighborSampler(ds.graph, [-1, -1], "mean"), 256, seed=1))
    )
    got = list(cuda_loader(source, features_on=CPU))
    assert len(got) == len(expected) > 1
    for a, b in zip(expected, got):
        assert b.features.is_cuda and b.features.dtype == torch.float32
        assert torch.equal(b.input_nodes.cpu(), a.input_nodes)
        assert torch.equal(b.features.cpu(), ds.features[a.input_nodes].half().float())
