"""The training loaders stand alone: iterated without Lightning, from a ``BatchSource`` and an
``EpochPlan``, they yield exactly the batches the DataModule hands a Trainer."""

import lightning.pytorch as pl
import pytest
import torch
from helpers.pipeline import live_children, make_trainer, seeded_module, small_dataset

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline import (
    BatchSource,
    EpochPlan,
    PipelinedLoader,
    PipelineSettings,
    SequentialLoader,
)
from lightning_mqgnn.sampling.neighbor import NeighborSampler

EPOCHS = 2


@pytest.fixture(scope="module")
def ds():
    return small_dataset()


class Record(pl.Callback):
    def __init__(self):
        self.batches = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append((trainer.current_epoch, batch))


def assert_same(a, b):
    assert a.meta["index"] == b.meta["index"]
    assert torch.equal(a.output_nodes, b.output_nodes) and torch.equal(a.input_nodes, b.input_nodes)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
        assert torch.equal(x.weights, y.weights)


@pytest.mark.parametrize("mode", ["sequential", "pipeline"])
def test_loader_without_lightning_yields_the_datamodules_batches(ds, mode):
    before = live_children()
    settings = dict(num_workers=1, producer="workers")
    dm = MQGNNDataModule(
        ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=200, seed=7, mode=mode, **settings)
    )
    rec = Record()
    make_trainer([rec], max_epochs=EPOCHS).fit(seeded_module(ds), dm)

    source = BatchSource(ds, NeighborSampler(ds.graph, [5, 5]), batch_size=200, seed=7)
    if mode == "sequential":
        loader = SequentialLoader(source)
    else:
        loader = PipelinedLoader(source, PipelineSettings(**settings), EpochPlan(max_epochs=EPOCHS))
    got = []
    try:
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            assert len(loader) == dm.num_train_batches()
            got.extend((epoch, b) for b in loader)
    finally:
        if mode == "pipeline":
            loader.shutdown()
    assert [e for e, _ in got] == [e for e, _ in rec.batches]
    assert len(got) == EPOCHS * len(loader) >= 2 * EPOCHS
    for (_, a), (_, b) in zip(rec.batches, got, strict=True):
        assert_same(a, b)
    assert not torch.equal(got[0][1].output_nodes, got[len(loader)][1].output_nodes)  # epochs differ
    if mode == "pipeline":
        # the plan told it another epoch follows: every epoch after the first opened on a head start
        assert [b.meta["head_start"] for e, b in got if b.meta["index"] == 0] == [False] + [True] * (
            EPOCHS - 1
        )
    assert live_children() - before == set()


def test_a_rank_of_the_plan_gets_its_own_share(ds):
    source = BatchSource(ds, NeighborSampler(ds.graph, [5]), batch_size=100, seed=1, shuffle=True)
    shares = [list(SequentialLoader(source, EpochPlan(rank=r, world_size=2))) for r in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == source.num_batches(world_size=2)
    seeds = [torch.cat([b.output_nodes for b in share]) for share in shares]
    padding = 2 * seeds[0].numel() - ds.train_idx.numel()  # a short share wraps around the permutation
    assert int(torch.isin(seeds[0], seeds[1]).sum()) <= padding
    assert torch.equal(torch.cat(seeds).unique(), ds.train_idx.unique())


def test_a_plan_function_owns_the_epochs_and_a_bad_plan_is_refused(ds):
    source = BatchSource(ds, NeighborSampler(ds.graph, [5]), batch_size=500)
    loader = SequentialLoader(source, lambda: EpochPlan(epoch=3))
    assert [b.meta["epoch"] for b in loader] == [3] * len(loader)
    with pytest.raises(RuntimeError, match="plan function"):
        loader.set_epoch(4)
    with pytest.raises(ValueError, match="rank must be in"):
        EpochPlan(rank=2, world_size=2)
    with pytest.raises(ValueError, match="queue_size must be"):
        PipelineSettings(queue_size=0)
