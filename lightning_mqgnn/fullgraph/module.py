"""A full-graph GCN/SAGE node classifier on one rank's partition."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.models.layers import layer_stack
from lightning_mqgnn.models.metrics import make_metric, metric_input, node_loss
from lightning_mqgnn.models.node_classifier import AGGREGATION_OF_CONV


class FullGraphNodeClassifier(pl.LightningModule):
    """GCN or SAGE layers over the whole graph, one partition per rank. Same arguments as
    ``NodeClassifier``; each layer after the first reads its halo rows through
    ``PartitionBatch.with_halo``, which the full-graph strategy provides."""

    full_graph = True

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        conv: str = "sage",
        hidden: int = 256,
        num_layers: int = 2,
        dropout: float = 0.5,
        lr: float = 1e-2,
        weight_decay: float = 0.0,
        metric: str = "accuracy",
        multilabel: bool = False,
    ):
        super().__init__()
        self.layers = nn.ModuleList(layer_stack(conv, in_dim, hidden, num_classes, num_layers))
        self.save_hyperparameters()
        self.dropout = nn.Dropout(dropout)
        self.aggregation = AGGREGATION_OF_CONV[conv]
        self.val_metric = make_metric(metric, num_classes, multilabel)
        self.test_metric = make_metric(metric, num_classes, multilabel)

    @override
    def forward(self, batch: PartitionBatch) -> Tensor:
        """Logits of the partition's inner nodes."""
        h = batch.features
        for i, layer in enumerate(self.layers):
            if i > 0:
                h = batch.with_halo(i, h)
            h = layer(batch.block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(torch.relu(h))
        return h

    @override
    def training_step(self, batch: PartitionBatch, batch_idx: int) -> Tensor:
        logits = self(batch)
        mask = batch.train_mask
        # summed over the rank's nodes, so the ranks' shares add up to the full graph's loss
        loss = node_loss(logits[mask], batch.labels[mask], self.hparams.multilabel, "sum") * batch.loss_scale
        self.log("train/loss", loss, prog_bar=True, batch_size=1, sync_dist=True)
        return loss

    def _score(self, batch: PartitionBatch, mask: Tensor, metric, name: str) -> None:
        logits = self(batch)[mask]
        metric.update(
            metric_input(logits, self.hparams.metric, self.hparams.multilabel), batch.labels[mask].long()
        )
        self.log(name, metric, prog_bar=True, batch_size=int(mask.sum()))

    @override
    def validation_step(self, batch: PartitionBatch, batch_idx: int) -> None:
        self._score(batch, batch.val_mask, self.val_metric, "val/metric")

    @override
    def test_step(self, batch: PartitionBatch, batch_idx: int) -> None:
        self._score(batch, batch.test_mask, self.test_metric, "test/metric")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
