"""A full-graph GCN, SAGE or GCNII node classifier on one rank's partition."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.stacks import ConvStack, GCNIIStack
from lightning_mqgnn.models.metrics import make_metric, metric_input, node_loss
from lightning_mqgnn.models.node_classifier import AGGREGATION_OF_CONV


class FullGraphNodeClassifier(pl.LightningModule):
    """GCN, SAGE or GCNII layers over the whole graph, one partition per rank. Same arguments as
    ``NodeClassifier`` (``glorot_init`` for GCN and SAGE layers), plus GCNII's ``alpha`` and
    ``theta`` (``conv="gcnii"``, eq. 5-6); each
    layer after the first reads its halo rows through ``PartitionBatch.with_halo``, which the
    full-graph strategy provides. The layers are a ``stack`` (``stacks``) that the GNNPipe
    strategy can also run stage by stage."""

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
        alpha: float = 0.1,
        theta: float = 0.5,
        glorot_init: bool | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if conv == "gcnii":
            self.stack = GCNIIStack(in_dim, hidden, num_classes, num_layers, dropout, alpha, theta)
            self.aggregation = "gcn"  # P̃ = D̃^-1/2 (A + I) D̃^-1/2
        else:
            self.stack = ConvStack(conv, in_dim, hidden, num_classes, num_layers, dropout, glorot_init)
            self.aggregation = AGGREGATION_OF_CONV[conv]
        self.val_metric = make_metric(metric, num_classes, multilabel)
        self.test_metric = make_metric(metric, num_classes, multilabel)

    @property
    def layers(self) -> nn.ModuleList:
        """The convolutions (the stack's embedding and head aside)."""
        return self.stack.layers

    @override
    def forward(self, batch: PartitionBatch) -> Tensor:
        """Logits of the partition's inner nodes. The embedding runs on every local row, halo
        included, so the first convolution needs no exchange."""
        stack, block = self.stack, batch.block
        h0 = stack.embed(batch.features)
        h = h0
        for i in range(stack.num_convs):
            h = stack.conv(i, block, h if i == 0 else batch.with_halo(i, h), h0[: block.num_dst])
        return stack.head(h)

    @override
    def training_step(self, batch: PartitionBatch, batch_idx: int) -> Tensor:
        logits = self(batch)
        mask = batch.train_mask
        # summed over the rank's nodes, so the ranks' shares add up to the full graph's loss
        loss = node_loss(logits[mask], batch.labels[mask], self.hparams.multilabel, "sum") * batch.loss_scale
        self.log("train/loss", loss, prog_bar=True, batch_size=1, sync_dist=True)
        return loss

    def _score(self, batch: PartitionBatch, mask: Tensor, metric, name: str) -> None:
        self.score(self(batch)[mask], batch.labels[mask], metric, name)

    def score(self, logits: Tensor, labels: Tensor, metric, name: str) -> None:
        """Add ``logits`` of labelled nodes to ``metric`` and log it (summed over ranks)."""
        metric.update(metric_input(logits, self.hparams.metric, self.hparams.multilabel), labels.long())
        self.log(name, metric, prog_bar=True, batch_size=max(1, int(labels.shape[0])))

    @override
    def validation_step(self, batch: PartitionBatch, batch_idx: int) -> None:
        self._score(batch, batch.val_mask, self.val_metric, "val/metric")

    @override
    def test_step(self, batch: PartitionBatch, batch_idx: int) -> None:
        self._score(batch, batch.test_mask, self.test_metric, "test/metric")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
