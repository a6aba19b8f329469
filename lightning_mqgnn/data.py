"""The LightningDataModule that ties graph, sampler and loader together: a thin adapter that
builds the loaders' ``BatchSource`` from its ``LoaderSettings`` and reads each epoch's
``EpochPlan`` from the Trainer."""

from __future__ import annotations

import logging
import os

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from typing_extensions import override

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models.inference import FullGraphLoader
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader, resolve_placement
from lightning_mqgnn.pipeline.host_cache import (
    host_row_cache,
    host_tier_capacity,
    sampler_fanouts,
    shared_host_row_cache,
)
from lightning_mqgnn.pipeline.loader import PipelinedLoader
from lightning_mqgnn.pipeline.placement import DEFAULT_MARGIN, Placement
from lightning_mqgnn.pipeline.plan import EpochPlan
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.settings import LoaderSettings
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.edge_seeds import EdgeSeeds
from lightning_mqgnn.sampling.feature_cache import FeatureCache

__all__ = ["LoaderSettings", "MQGNNDataModule"]

log = logging.getLogger(__name__)


class MQGNNDataModule(pl.LightningDataModule):
    """Training mini-batches from ``sampler`` over ``dataset``'s training split, made as
    ``loader`` (``LoaderSettings``) says; validation and test as one exact full-graph batch each.

    ``seeds``: what seeds a batch. None: the training nodes (node classification). An
    ``EdgeSeeds``: batches of its training edges with their negatives (link prediction), the
    blocks those of their endpoints; validation and test then score its split's fixed pairs
    (``LinkEvalBatch``).

    Each rank trains on its own disjoint share of the seeds every epoch (``epoch_batches``).
    ``feature_cache`` (e.g. GNS) is refreshed at every epoch start; its rows are kept on the
    device and merged into ``batch.features`` before the model sees it. Where the run samples and
    gathers is decided at the first training loader from the trainer's device
    (``placement``); a host tier (``host_cache_gb``) is filled at ``setup``.
    """

    def __init__(
        self,
        dataset: GraphDataset,
        sampler: Sampler,
        loader: LoaderSettings | None = None,
        seeds: EdgeSeeds | None = None,
        feature_cache: FeatureCache | None = None,
    ):
        super().__init__()
        settings = loader if loader is not None else LoaderSettings()
        if settings.host_cache_gb:  # a budget that holds no row of this dataset fails here
            host_tier_capacity(dataset, settings.host_cache_gb, settings.host_cache_policy)
        self.settings = settings
        self._placement: Placement | None = None
        self.device_loader: DeviceResidentLoader | None = None
        self.seeds = seeds
        self.source = BatchSource(
            dataset,
            sampler if seeds is None else seeds.sampler(sampler, dataset.graph),
            settings.batch_size,
            settings.shuffle,
            settings.drop_last,
            settings.seed,
            settings.aggregate_inputs,
            feature_cache=feature_cache,
            seed_ids=None if seeds is None else torch.arange(seeds.num_seeds),
        )
        self.pipeline_loader: PipelinedLoader | None = None

    def __getstate__(self) -> dict:
        # ddp_spawn pickles the DataModule: never ship live processes or threads
        state = self.__dict__.copy()
        state["pipeline_loader"] = None
        state["device_loader"] = None
        state["_placement"] = None
        return state

    @property
    def dataset(self) -> GraphDataset:
        return self.source.dataset

    @property
    def sampler(self) -> Sampler:
        return self.source.sampler

    @property
    def batch_size(self) -> int:
        return self.source.batch_size

    @property
    def drop_last(self) -> bool:
        return self.source.drop_last

    def epoch_plan(self) -> EpochPlan:
        """The coming epoch as the Trainer knows it (epoch 0 on one CPU rank without one)."""
        trainer = self.trainer
        if trainer is None:
            return EpochPlan()
        return EpochPlan(
            epoch=trainer.current_epoch,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            ranks_on_node=max(1, trainer.world_size // max(1, trainer.num_nodes)),
            device=trainer.strategy.root_device,
            max_epochs=trainer.max_epochs if trainer.max_epochs is not None else -1,
            stopping=trainer.should_stop,
            # the batches of the running epoch already trained on: a fit resumed inside an epoch
            # (LastCheckpoint after a signal) starts at the next one
            first_batch=trainer.fit_loop.epoch_loop.batch_progress.current.completed
            if trainer.training
            else 0,
        )

    def graph_stats(self) -> tuple[int, int]:
        """(|V|, |E|) of the training graph, for the synchronisation period of eq. 23."""
        return self.dataset.num_nodes, self.dataset.graph.num_edges

    def num_train_batches(self) -> int:
        return self.source.num_batches(self.epoch_plan().world_size)

    def match_module(self) -> None:
        """Aggregate the first layer in the gather stage only for a module that declares
        ``accepts_aggregated_inputs`` (``NodeClassifier`` does; a PyG layer stack reads feature
        rows); without an attached module, as asked."""
        trainer = self.trainer
        module = trainer.lightning_module if trainer is not None else None
        accepts = module is None or getattr(module, "accepts_aggregated_inputs", False)
        self.source.aggregate_inputs = self.settings.aggregate_inputs and accepts

    def placement(self) -> Placement:
        """Where this fit samples and gathers, decided once from the trainer's device and its
        free memory (``resolve_placement``)."""
        if self._placement is None:
            device = self.epoch_plan().device
            sample_on = self.settings.sample_on
            placement = resolve_placement(
                self.source, sample_on, self.settings.features_on, device, DEFAULT_MARGIN
            )
            if self.settings.mode == "device" and device.type == "cuda" and not placement.on_device:
                raise ValueError(
                    f"mode='device' samples on {device}, but sample_on={sample_on!r} keeps the "
                    f"graph on the CPU ({placement.reason}); use sample_on='cuda' or 'auto'"
                )
            self._placement = placement
        return self._placement

    def uses_device_loader(self) -> bool:
        return self.settings.mode == "device" or self.placement().on_device

    def fill_host_tier(self) -> None:
        """Build the host tier (``host_cache_gb``) once: with several ranks, one per machine,
        filled by its local rank 0 and mapped by the others (``shared_host_row_cache``)."""
        settings = self.settings
        if not settings.host_cache_gb or self.source.host_cache is not None:
            return
        fanouts = sampler_fanouts(self.sampler)

        def build():
            return host_row_cache(self.dataset, settings.host_cache_gb, settings.host_cache_policy, fanouts)

        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            tier = shared_host_row_cache(build, trainer.local_rank, trainer.node_rank)
        else:
            tier = build()
        log.info(
            "host tier: %d rows (%.0f MB), policy %s, filled by pid %d, mapped by pid %d",
            tier.nodes.numel(),
            tier.nbytes / 1e6,
            tier.policy,
            tier.filled_by,
            os.getpid(),
        )
        self.source.host_cache = tier

    @override
    def train_dataloader(self) -> SequentialLoader | PipelinedLoader | DeviceResidentLoader:
        self.match_module()
        if self.uses_device_loader():
            return self.train_device_loader()
        self.fill_host_tier()
        if self.settings.mode == "sequential":
            return SequentialLoader(self.source, self.epoch_plan)
        return self.train_pipeline_loader()

    def train_pipeline_loader(self) -> PipelinedLoader:
        if self.pipeline_loader is None:
            self.pipeline_loader = PipelinedLoader(self.source, self.settings, self.epoch_plan)
        return self.pipeline_loader

    def train_device_loader(self) -> DeviceResidentLoader:
        if self.device_loader is None:
            settings = self.settings
            self.device_loader = DeviceResidentLoader(
                self.source,
                self.placement(),
                settings.queue_size,
                self.epoch_plan,
                settings.memory_margin,
                settings.device_sampler,
                settings.sampler_processes,
            )
        return self.device_loader

    @override
    def val_dataloader(self) -> FullGraphLoader:
        if self.seeds is not None:
            return self.seeds.eval_loader(self.dataset, "val")
        return FullGraphLoader(self.dataset, self.dataset.val_idx, "val")

    @override
    def test_dataloader(self) -> FullGraphLoader:
        if self.seeds is not None:
            return self.seeds.eval_loader(self.dataset, "test")
        return FullGraphLoader(self.dataset, self.dataset.test_idx, "test")

    @override
    def setup(self, stage: str) -> None:
        self.match_module()
        if stage == "fit" and self.settings.host_cache_gb and not self.uses_device_loader():
            self.fill_host_tier()  # a collective with several ranks: every rank is here
        if stage == "fit" and self.settings.mode == "pipeline" and not self.uses_device_loader():
            # workers fork and sample the first batches while Lightning sets up and sanity-checks
            self.train_pipeline_loader().prime()

    def shutdown_pipeline(self) -> None:
        """Stop the pipeline's workers and threads, and the device sampler's thread (idempotent). The loader object stays, with its
        queue-size history; a later fit restarts its workers."""
        if self.pipeline_loader is not None:
            self.pipeline_loader.shutdown()
        if self.device_loader is not None:
            self.device_loader.shutdown()

    @override
    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.shutdown_pipeline()

    @override
    def on_exception(self, exception: BaseException) -> None:
        # Lightning calls this (not teardown) on errors and KeyboardInterrupt
        self.shutdown_pipeline()
