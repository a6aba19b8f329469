"""What a rank trains on in full-graph mode: its partition, served as the one batch of every epoch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lightning_mqgnn.fullgraph.partition import LocalPartition
from lightning_mqgnn.sampling.batch import Block

HaloFn = Callable[[int, Tensor], Tensor]


@dataclass
class PartitionBatch:
    """One rank's partition: the local ``block`` (inner destinations over ``[inner ; halo]``
    sources), input ``features`` of every local row, and labels and split masks of the inner rows.

    ``halo`` is set by the full-graph strategy before each step: ``with_halo(layer, h)`` turns a
    layer's inner rows into its input over all local rows. Layer 0 needs no exchange: its input
    rows, halo included, are the constant ``features``.
    """

    partition: LocalPartition
    block: Block
    features: Tensor
    labels: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_train_global: int
    world_size: int
    halo: HaloFn | None = None

    @property
    def loss_scale(self) -> float:
        """Factor turning this rank's summed training loss into its share of the global mean, so
        that gradients averaged over ranks (as DDP does) equal the full-graph gradient."""
        return self.world_size / self.num_train_global

    def to(self, device: torch.device | str) -> PartitionBatch:
        """The batch with its tensors on ``device`` (the partition's index lists stay on the CPU)."""
        return replace(
            self,
            block=self.block.to(device),
            features=self.features.to(device),
            labels=self.labels.to(device),
            train_mask=self.train_mask.to(device),
            val_mask=self.val_mask.to(device),
            test_mask=self.test_mask.to(device),
        )

    def with_halo(self, layer: int, h: Tensor) -> Tensor:
        if self.halo is None:
            if self.partition.num_halo:
                raise RuntimeError(
                    "PartitionBatch.halo is not set: train with a full-graph strategy "
                    "(graph_parallel, pipegcn or pipeqs)"
                )
            return h
        return self.halo(layer, h)
