"""Device-resident sampling in a spawned process (``device_sampler="process"``) on device=cpu: the
code a GPU runs, with shared-memory tensors where a GPU passes CUDA IPC handles. Its batches are
the thread's (and so SequentialLoader's), an epoch left early does not leak into the next, a
failure or death of the child surfaces within seconds, no process outlives the loader, and the
children import no Lightning."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest
import torch
from helpers.pipeline import (
    FailInWorkerSampler,
    assert_epochs_agree,
    assert_gone,
    drain_raises_within,
    make_trainer,
    seeded_module,
    small_dataset,
)

from lightning_mqgnn import SAMPLER_PROCESS_NAME
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def ds():
    return small_dataset(1500)


def process_loader(source, queue_size=2, processes=1) -> DeviceResidentLoader:
    return DeviceResidentLoader(
        source, queue_size=queue_size, device_sampler="process", sampler_processes=processes
    )


@pytest.mark.parametrize("variant", ["sage", "ladies_fd"])
def test_the_sampler_process_gives_the_sequential_batches(ds, variant):
    if variant == "sage":  # node-wise, the first layer aggregated in the child
        sampler, aggregate = NeighborSampler(ds.graph, [5, 5], "mean"), True
    else:
        sampler, aggregate = LADIESSampler(ds.graph, [256, 128], flat=True, debias=True), False
    source = BatchSource(ds, sampler, batch_size=256, seed=3, aggregate_inputs=aggregate)
    seq, dev = SequentialLoader(source), process_loader(source, processes=2)
    try:
        assert_epochs_agree(seq, dev)
        assert dev.process is not None and dev.process.alive()  # the same children for every epoch
        assert [m.process.name for m in dev.process.members] == [SAMPLER_PROCESS_NAME] * 2
        pids = dev.process.pids()
    finally:
        dev.shutdown()
    assert dev.process is None and not dev.producer_alive()
    assert_gone(pids)


def test_an_epoch_left_early_does_not_leak_into_the_next(ds):
    source = BatchSource(ds, NeighborSampler(ds.graph, [5, 5]), batch_size=64, seed=1)
    seq, dev = SequentialLoader(source), process_loader(source, queue_size=1)
    try:
        it = iter(dev)
        next(it)  # the child runs ahead of this, up to its credit
        assert_epochs_agree(seq, dev, epochs=(1,))
    finally:
        dev.shutdown()


def test_a_failure_in_the_process_surfaces_within_seconds_with_its_traceback(ds):
    dev = process_loader(BatchSource(ds, FailInWorkerSampler(ds.graph, [5, 5], fail_on=3), batch_size=100))
    it = iter(dev)
    next(it)  # the child has started
    info = drain_raises_within(it, 5.0, "device-resident sampling failed")
    assert "injected sampler failure on call 3" in str(info.value.__cause__)
    pids = dev.process.pids()
    dev.shutdown()
    assert_gone(pids)


def test_a_killed_sampler_process_fails_the_epoch_within_seconds(ds):
    dev = process_loader(BatchSource(ds, NeighborSampler(ds.graph, [5, 5]), batch_size=32), queue_size=1)
    try:
        it = iter(dev)
        next(it)
        os.kill(dev.process.pids()[0], signal.SIGKILL)
        info = drain_raises_within(it, 5.0, "device-resident sampling failed")
        assert "exit code -9" in str(info.value.__cause__)
    finally:
        dev.shutdown()


def test_fit_with_the_sampler_process_trains_like_the_thread(ds):
    weights = {}
    for device_sampler in ("thread", "process"):
        dm = MQGNNDataModule(
            ds,
            NeighborSampler(ds.graph, [5, 5]),
            LoaderSettings(
                batch_size=256, seed=7, mode="device", aggregate_inputs=True, device_sampler=device_sampler
            ),
        )
        module = seeded_module(ds)
        make_trainer(max_epochs=2).fit(module, dm)
        weights[device_sampler] = [p.detach().clone() for p in module.parameters()]
        assert dm.device_loader.process is None and not dm.device_loader.producer_alive()
    for a, b in zip(weights["thread"], weights["process"]):
        assert torch.equal(a, b)


def test_a_feature_cache_keeps_the_thread_and_says_so(ds, caplog):
    cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, fanouts=(5, 5), seed=0)
    source = BatchSource(ds, GNSSampler(ds.graph, [5, 5], cache), 256, feature_cache=cache)
    with caplog.at_level(logging.INFO, logger="lightning_mqgnn.pipeline.device_loader"):
        dev = process_loader(source)
        batches = list(dev)
    assert batches and dev.process is None and dev.device_sampler == "thread"
    assert "a feature cache: a thread samples" in caplog.text
    dev.shutdown()


def test_the_device_loader_checks_its_sampler_option(ds):
    sampler = NeighborSampler(ds.graph, [5, 5])
    with pytest.raises(ValueError, match="device_sampler must be one of"):
        DeviceResidentLoader(BatchSource(ds, sampler), device_sampler="")


def test_a_process_with_the_sampler_name_samples_without_importing_lightning():
    # a spawned child has its name before it unpickles its target (and so imports this package)
    code = (
        "import multiprocessing, sys\n"
        f"multiprocessing.current_process().name = {SAMPLER_PROCESS_NAME!r}\n"
        "import lightning_mqgnn.pipeline.sampler_process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"
