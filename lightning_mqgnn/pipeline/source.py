"""What a training loader yields, independent of how it is produced: the batches of one graph."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.pipeline.host_cache import HostRowCache, TieredFeatures
from lightning_mqgnn.pipeline.produce import produce_here
from lightning_mqgnn.pipeline.schedule import epoch_batches, num_batches
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.feature_cache import FeatureCache
from lightning_mqgnn.sampling.rng import batch_rng_seed


@dataclass
class BatchSource:
    """The training mini-batches of ``dataset``: its training split cut into batches of
    ``batch_size`` seeds (``epoch_batches``), each sampled by ``sampler`` from a seed that depends
    only on (``seed``, epoch, batch index), so every loader and every worker makes the same batch.

    ``aggregate_inputs``: the gather stage computes the first layer's aggregation
    (``batch.aggregated``) instead of gathering the input rows; not with a ``feature_cache``.
    ``feature_cache`` (e.g. GNS): refreshed at every epoch start, its rows kept on the device.
    ``host_cache``: the host tier of features on disk (``pipeline/host_cache.py``); the gather
    stage reads ``features`` through it. ``seed_ids``: what the batches cut, as ids ``sampler``
    takes: None for the training nodes; positions of training edges for an ``EdgeSampler``
    (``MQGNNDataModule(seeds=EdgeSeeds(...))``).
    """

    dataset: GraphDataset
    sampler: Sampler
    batch_size: int = 1024
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 0
    aggregate_inputs: bool = False
    feature_cache: FeatureCache | None = None
    host_cache: HostRowCache | None = None
    seed_ids: Tensor | None = None

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")

    @property
    def seeds(self) -> Tensor:
        """The ids an epoch's batches are cut from: ``seed_ids``, or the training nodes."""
        return self.dataset.train_idx if self.seed_ids is None else self.seed_ids

    @property
    def input_aggregation(self) -> str | None:
        """The sampler's aggregation when the gather stage aggregates the first layer, else None."""
        return self.sampler.aggregation if self.aggregate_inputs else None

    @property
    def features(self) -> Tensor | TieredFeatures:
        """The features the gather stage reads: the dataset's, through the host tier if any."""
        if self.host_cache is None:
            return self.dataset.features
        return TieredFeatures(self.host_cache, self.dataset.features)

    @property
    def cache_slot(self) -> Tensor | None:
        return self.feature_cache.slot if self.feature_cache is not None else None

    def epoch_seeds(self, epoch: int, rank: int = 0, world_size: int = 1) -> list[Tensor]:
        """The seeds (``seeds``) of every batch ``rank`` trains on in ``epoch``."""
        return epoch_batches(
            self.seeds,
            self.batch_size,
            epoch,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )

    def num_batches(self, world_size: int = 1) -> int:
        """Batches per epoch on every rank."""
        return num_batches(self.seeds.numel(), self.batch_size, world_size, self.drop_last)

    def rng_seed(self, epoch: int, index: int) -> int:
        return batch_rng_seed(self.seed, epoch, index)

    def produce_here(self, epoch: int, index: int, seeds: Tensor) -> MiniBatch:
        """Batch ``index`` of ``epoch``, sampled and gathered in this process without touching its
        random stream."""
        return produce_here(
            self.sampler,
            seeds,
            self.features,
            self.dataset.labels,
            self.rng_seed(epoch, index),
            index,
            self.cache_slot,
            self.input_aggregation,
        )
