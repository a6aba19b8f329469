"""The CUDA path of the transfer stage: pinned copy on a side stream, event hand-off,
record_stream, device-side cache merge, and eq. 25 from torch.cuda.mem_get_info."""

import pytest
import torch
from helpers.devices import require_cuda
from helpers.pipeline import make_trainer, small_dataset, worker_pipeline

from lightning_mqgnn.callbacks import GPUBusyMonitor, StageTimingCallback
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.pipeline.loader import PipelinedLoader
from lightning_mqgnn.pipeline.plan import EpochPlan
from lightning_mqgnn.pipeline.queue_size import device_memory
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.settings import PipelineSettings
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.pipeline.transfer import DeviceMover
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool
from lightning_mqgnn.sampling.neighbor import NeighborSampler

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ds():
    require_cuda()
    return small_dataset(800)


def test_side_stream_copy_is_complete_after_hand_over(ds):
    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=128))
    cpu = next(iter(SequentialLoader(dm.source)))
    mover = DeviceMover("cuda")
    dev, event = mover.to_device(cpu)
    assert event is not None and dev.features.is_cuda and dev.blocks[0].indices.is_cuda
    dev = mover.hand_over(dev, event)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(dev.features.cpu(), cpu.features)
    assert torch.equal(dev.blocks[1].weights.cpu(), cpu.blocks[1].weights)


def test_pipeline_delivers_device_batches_equal_to_the_sequential_ones(ds):
    seq = MQGNNDataModule(ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=128, seed=4))
    source = BatchSource(ds, NeighborSampler(ds.graph, [5, 5]), batch_size=128, seed=4)
    settings = PipelineSettings(num_workers=1, producer="workers")
    loader = PipelinedLoader(source, settings, EpochPlan(device=torch.device("cuda"), max_epochs=1))
    try:
        got = list(loader)
    finally:
        loader.shutdown()
    assert loader.pool is None or not loader.pool.running
    assert len(got) == len(loader) >= 2
    for a, b in zip(SequentialLoader(seq.source), got):
        assert b.features.is_cuda
        assert torch.equal(a.features, b.features.cpu()) and torch.equal(a.input_nodes, b.input_nodes.cpu())


def test_slots_are_page_locked_so_batches_go_to_the_gpu_without_a_staging_copy(ds):
    sampler = NeighborSampler(ds.graph, [5, 5])
    pool = SamplerWorkerPool(sampler, ds.features, ds.labels, num_workers=1, max_slots=2, pin_slots=True)
    mover = DeviceMover("cuda")
    pool.start()
    try:
        for index in range(4):  # the first batch sizes the slots; the same batch then fits them
            pool.submit(0, index, ds.train_idx[:64], rng_seed=0)
            cpu = pool.get(timeout=30).batch
            if index == 0:
                continue
            assert cpu.features.is_pinned()
            assert cpu.pin_memory().features.data_ptr() == cpu.features.data_ptr()  # no copy
            dev, event = mover.to_device(cpu)
            dev = mover.hand_over(dev, event)
            torch.cuda.current_stream().synchronize()
            assert torch.equal(dev.features.cpu(), cpu.features)
            del cpu
    finally:
        pool.stop()


def test_memory_cap_inputs_come_from_the_device():
    require_cuda()
    available, peak = device_memory(torch.device("cuda"), 0.1)
    free, total = torch.cuda.mem_get_info()
    assert free <= available <= total and peak >= 0


def test_pipelined_fit_on_cuda_trains_and_reports_gpu_busy_time(ds):
    """A whole Lightning fit on the GPU through the pipeline (workers, side stream, queue): the stage timing and the
    GPU busy monitor both measure the run, and the logged loss is kept on the host (Lightning reads
    the progress bar's values after every batch: a GPU tensor would make each read wait for it)."""
    dm = worker_pipeline(
        ds,
        batch_size=64,
        seed=1,
        num_workers=2,
    )
    model = NodeClassifier(ds.num_features, ds.num_classes, conv="sage", hidden=64, lr=1e-2)
    busy, timing = GPUBusyMonitor(interval=0.01), StageTimingCallback(trim=0)
    trainer = make_trainer([busy, timing], accelerator="gpu", max_epochs=3)
    trainer.fit(model, dm)
    assert timing.summary["num_batches"] == 3 * dm.num_train_batches()
    assert busy.samples and 0.0 <= busy.busy_fraction <= 1.0
    assert trainer.callback_metrics["train/loss"].device.type == "cpu"
    assert (
        dm.pipeline_loader is None or dm.pipeline_loader.pool is None or not dm.pipeline_loader.pool.running
    )
