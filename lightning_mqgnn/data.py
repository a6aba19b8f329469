"""The LightningDataModule that ties graph, sampler and loader together."""

from __future__ import annotations

import time
from collections.abc import Iterator

import lightning.pytorch as pl

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models.inference import FullGraphLoader
from lightning_mqgnn.pipeline.loader import FeatureCache, PipelinedLoader
from lightning_mqgnn.pipeline.produce import produce_here
from lightning_mqgnn.pipeline.producer_choice import PRODUCERS
from lightning_mqgnn.pipeline.schedule import batch_rng_seed, epoch_batches, num_batches
from lightning_mqgnn.pipeline.workers import check_start_method, default_num_workers
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch

MODES = ("sequential", "pipeline")


class MQGNNDataModule(pl.LightningDataModule):
    """Training mini-batches from ``sampler`` over ``dataset``'s training split; validation and
    test as one exact full-graph batch each.

    ``mode="sequential"``: sample → gather → compute in the training process, no overlap (the
    baseline). ``mode="pipeline"``: the MQ-GNN multi-queue pipeline (``PipelinedLoader``) with
    ``num_workers`` sampler processes (default: the cores of this rank less one), a CPU queue of
    ``cpu_queue_size`` batches and a device queue of ``queue_size`` batches (int, or ``"auto"``
    for eq. 24-25). ``producer="auto"`` times an epoch made by the workers against one made in the
    training thread with every core, and keeps the faster (``ProducerChoice``); ``"workers"``
    always uses the workers. ``aggregate_inputs``: the gather stage computes the first layer's
    aggregation (``batch.aggregated``) instead of gathering the input rows (``batch.features``),
    for models that declare ``accepts_aggregated_inputs``, as ``NodeClassifier`` does (others get
    ``batch.features`` whatever this says); not with a feature cache. Both modes
    seed each batch's sampling from (seed, epoch, batch index), so they train on identical
    batches. Each rank trains on its own disjoint share of the seeds every epoch
    (``epoch_batches``). ``feature_cache`` (e.g. GNS) is refreshed at every epoch start; its rows
    are kept on the device and merged into ``batch.features`` before the model sees it.
    """

    def __init__(
        self,
        dataset: GraphDataset,
        sampler: Sampler,
        batch_size: int = 1024,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mode: str = "sequential",
        num_workers: int | None = None,
        queue_size: int | str = "auto",
        cpu_queue_size: int | None = None,
        start_method: str = "auto",
        worker_threads: int = 1,
        warmup_batches: int = 5,
        window_batches: int = 20,
        memory_margin: float = 0.1,
        producer: str = "auto",
        aggregate_inputs: bool = False,
        feature_cache: FeatureCache | None = None,
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"loader mode must be one of {MODES}, got {mode!r}")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (or None for auto), got {num_workers}")
        if queue_size != "auto" and (not isinstance(queue_size, int) or queue_size < 1):
            raise ValueError(f"queue_size must be a positive int or 'auto', got {queue_size!r}")
        check_start_method(start_method, worker_threads)
        if producer not in PRODUCERS:
            raise ValueError(f"producer must be one of {PRODUCERS}, got {producer!r}")
        if not 0.0 <= memory_margin < 1.0:
            raise ValueError(f"memory_margin must be in [0, 1), got {memory_margin}")
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.mode = mode
        self.num_workers = num_workers
        self.queue_size = queue_size
        self.cpu_queue_size = cpu_queue_size
        self.start_method = start_method
        self.worker_threads = worker_threads
        self.warmup_batches = warmup_batches
        self.window_batches = window_batches
        self.memory_margin = memory_margin
        self.producer = producer
        self.aggregate_inputs = aggregate_inputs
        self.feature_cache = feature_cache
        self.pipeline_loader: PipelinedLoader | None = None

    def __getstate__(self) -> dict:
        # ddp_spawn pickles the DataModule: never ship live processes or threads
        state = self.__dict__.copy()
        state["pipeline_loader"] = None
        return state

    def rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def ranks_on_node(self) -> int:
        trainer = self.trainer
        if trainer is None:
            return 1
        return max(1, trainer.world_size // max(1, trainer.num_nodes))

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

    def input_aggregation(self) -> str | None:
        """The sampler's aggregation when the gather stage aggregates the first layer, else None.

        Only for a module that declares ``accepts_aggregated_inputs`` (``NodeClassifier`` does;
        a PyG layer stack reads feature rows), once one is attached to the trainer.
        """
        if not self.aggregate_inputs:
            return None
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is not None and not getattr(module, "accepts_aggregated_inputs", False):
            return None
        return self.sampler.aggregation

    def produce_here(self, epoch: int, index: int, seeds) -> MiniBatch:
        """Batch ``index`` of ``epoch`` (seeded from ``seed``, epoch and index), sampled and
        gathered in this process without touching its random stream."""
        cache = self.feature_cache
        return produce_here(
            self.sampler,
            seeds,
            self.dataset.features,
            self.dataset.labels,
            batch_rng_seed(self.seed, epoch, index),
            index,
            cache.slot if cache is not None else None,
            self.input_aggregation(),
        )

    def num_train_batches(self) -> int:
        _, world = self.rank_and_world()
        return num_batches(self.dataset.train_idx.numel(), self.batch_size, world, self.drop_last)

    def train_dataloader(self) -> SequentialLoader | PipelinedLoader:
        if self.mode == "sequential":
            return SequentialLoader(self)
        return self.train_pipeline_loader()

    def train_pipeline_loader(self) -> PipelinedLoader:
        if self.pipeline_loader is None:
            self.pipeline_loader = PipelinedLoader(
                self, num_workers=self.num_workers or default_num_workers(self.ranks_on_node())
            )
        return self.pipeline_loader

    def val_dataloader(self) -> FullGraphLoader:
        return FullGraphLoader(self.dataset, self.dataset.val_idx, "val")

    def test_dataloader(self) -> FullGraphLoader:
        return FullGraphLoader(self.dataset, self.dataset.test_idx, "test")

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.mode == "pipeline":
            # workers fork and sample the first batches while Lightning sets up and sanity-checks
            self.train_pipeline_loader().prime()

    def shutdown_pipeline(self) -> None:
        """Stop the pipeline's workers and threads (idempotent). The loader object stays, with its
        queue-size history; a later fit restarts its workers."""
        if self.pipeline_loader is not None:
            self.pipeline_loader.shutdown()

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.shutdown_pipeline()

    def on_exception(self, exception: BaseException) -> None:
        # Lightning calls this (not teardown) on errors and KeyboardInterrupt
        self.shutdown_pipeline()


class SequentialLoader:
    """Sample → gather → hand over, one batch at a time in the training process (no overlap).

    The baseline every pipeline figure is compared against. Stage times go to ``batch.meta``;
    ``wait_s`` is the whole sample + gather time, since the training loop waits for all of it.
    """

    def __init__(self, datamodule: MQGNNDataModule):
        self.dm = datamodule

    def __len__(self) -> int:
        return self.dm.num_train_batches()

    def __iter__(self) -> Iterator[MiniBatch]:
        dm = self.dm
        ds = dm.dataset
        epoch = dm.current_epoch()
        cache = dm.feature_cache
        cache_rows = None
        if cache is not None:
            cache.refresh_(epoch)
            cache_rows = ds.features.index_select(0, cache.nodes)
        for i, seeds in enumerate(dm.epoch_seeds(epoch)):
            t0 = time.perf_counter()
            batch = dm.produce_here(epoch, i, seeds)
            if cache is not None:
                batch.features = batch.input_features(cache_rows)
                batch.cache_slots = None
            batch.meta.update(wait_s=time.perf_counter() - t0, epoch=epoch)
            yield batch
