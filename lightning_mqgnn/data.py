"""The LightningDataModule that ties graph, sampler and loader together."""

from __future__ import annotations

import time
from collections.abc import Iterator

import lightning.pytorch as pl

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models.inference import FullGraphBatch
from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.pipeline.schedule import epoch_batches, num_batches
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch


class MQGNNDataModule(pl.LightningDataModule):
    """Training mini-batches from ``sampler`` over ``dataset``'s training split; validation and
    test as one exact full-graph batch each.

    Each rank trains on its own disjoint share of the seeds every epoch (``epoch_batches``).
    """

    def __init__(
        self,
        dataset: GraphDataset,
        sampler: Sampler,
        batch_size: int = 1024,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed

    def rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def current_epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def graph_stats(self) -> tuple[int, int]:
        """(|V|, |E|) of the training graph, for the synchronisation period of eq. 23."""
        return self.dataset.num_nodes, self.dataset.graph.num_edges

    def epoch_seeds(self, epoch: int) -> list:
        rank, world = self.rank_and_world()
        return epoch_batches(
            self.dataset.train_idx,
            self.batch_size,
            epoch,
            seed=self.seed,
            rank=rank,
            world_size=world,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )

    def num_train_batches(self) -> int:
        _, world = self.rank_and_world()
        return num_batches(self.dataset.train_idx.numel(), self.batch_size, world, self.drop_last)

    def train_dataloader(self) -> SequentialLoader:
        return SequentialLoader(self)

    def val_dataloader(self) -> list[FullGraphBatch]:
        return [FullGraphBatch(self.dataset, self.dataset.val_idx, "val")]

    def test_dataloader(self) -> list[FullGraphBatch]:
        return [FullGraphBatch(self.dataset, self.dataset.test_idx, "test")]


class SequentialLoader:
    """Sample → gather → hand over, one batch at a time in the training process (no overlap).

    The baseline every pipeline figure is compared against. Stage times go to ``batch.meta``.
    """

    def __init__(self, datamodule: MQGNNDataModule):
        self.dm = datamodule

    def __len__(self) -> int:
        return self.dm.num_train_batches()

    def __iter__(self) -> Iterator[MiniBatch]:
        dm = self.dm
        ds = dm.dataset
        for i, seeds in enumerate(dm.epoch_seeds(dm.current_epoch())):
            t0 = time.perf_counter()
            batch = dm.sampler.sample(seeds)
            t1 = time.perf_counter()
            gather(batch, ds.features, ds.labels)
            batch.meta.update(index=i, sample_s=t1 - t0, gather_s=time.perf_counter() - t1)
            yield batch
