"""Link prediction on sampled blocks: ``NodeClassifier``'s encoder (its GCN or SAGE layers, its
exact inference) with a pair decoder in place of class logits.

Training scores each batch's positive and negative pairs (``MiniBatch.pairs``, from
``EdgeSeeds``) with binary cross-entropy; validation and test compute every endpoint's embedding
by exact full-neighbourhood inference, as node classification does, and score the split's fixed
pairs as OGB does (``link_metrics``): Hits@K over the shared negatives, MRR over each positive's
own negatives when the split has them, and ROC-AUC.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from lightning_mqgnn.models.inference import LinkEvalBatch
from lightning_mqgnn.models.link_metrics import hits_at_k, mrr, roc_auc
from lightning_mqgnn.models.node_classifier import NodeClassifier
from lightning_mqgnn.models.work import inference_work
from lightning_mqgnn.sampling.batch import MiniBatch

DECODERS = ("dot", "mlp")


class DotDecoder(nn.Module):
    """``<h_u, h_v>``: the graph auto-encoder's decoder (Kipf & Welling 2016, eq. 2), no weights."""

    def forward(self, src: Tensor, dst: Tensor) -> Tensor:
        return (src * dst).sum(-1)


class HadamardMLPDecoder(nn.Module):
    """An MLP over ``h_u ⊙ h_v`` (one hidden layer of ``width``): symmetric in the pair, as OGB's
    link-prediction baselines decode (``LinkPredictor`` of their examples)."""

    def __init__(self, width: int, hidden: int | None = None):
        super().__init__()
        hidden = width if hidden is None else hidden
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, src: Tensor, dst: Tensor) -> Tensor:
        return self.mlp(src * dst).squeeze(-1)


def pair_decoder(name: str, width: int) -> nn.Module:
    """The decoder ``name`` ("dot" or "mlp") for embeddings of ``width``."""
    if name == "dot":
        return DotDecoder()
    if name == "mlp":
        return HadamardMLPDecoder(width)
    raise ValueError(f"unknown decoder {name!r}; expected one of {DECODERS}")


class LinkPredictor(NodeClassifier):
    """Scores node pairs: a GCN or SAGE encoder of ``num_layers`` layers ending in embeddings of
    ``embedding`` width (default: ``hidden``), then ``decoder`` ("dot", or "mlp" over the
    Hadamard product). ``hits_k``: the K of the logged ``val/metric`` (Hits@K; 50 as
    ogbl-collab). Logged: ``train/loss``, ``{val,test}/metric`` (Hits@K), ``{val,test}/auc``,
    and ``{val,test}/mrr`` where the split has per-source negatives.

    The encoder is ``NodeClassifier``'s, trained on batches of ``EdgeSeeds``: any sampler, any
    loader, the first layer aggregated in the gather stage or not."""

    SCORED_PAIRS = 65_536

    def __init__(
        self,
        in_dim: int,
        conv: str = "sage",
        hidden: int = 128,
        embedding: int | None = None,
        num_layers: int = 2,
        dropout: float = 0.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        decoder: str = "dot",
        hits_k: int = 50,
        glorot_init: bool | None = None,
        num_classes: int | None = None,
    ):
        embedding = hidden if embedding is None else embedding
        if num_classes is not None and num_classes != embedding:
            raise ValueError(
                f"LinkPredictor: num_classes={num_classes} is a node classifier's output; a link "
                f"predictor ends in embeddings of width embedding={embedding}"
            )
        super().__init__(
            in_dim,
            embedding,
            conv=conv,
            hidden=hidden,
            num_layers=num_layers,
            dropout=dropout,
            lr=lr,
            weight_decay=weight_decay,
            glorot_init=glorot_init,
        )
        if hits_k < 1:
            raise ValueError(f"LinkPredictor: hits_k must be a positive count, got {hits_k}")
        self.decoder = pair_decoder(decoder, embedding)
        self.hits_k = hits_k
        self.save_hyperparameters()

    def score(self, embeddings: Tensor, pairs: Tensor) -> Tensor:
        """The decoder's logit for each pair (``[2, P]`` rows of ``embeddings``)."""
        return self.decoder(embeddings.index_select(0, pairs[0]), embeddings.index_select(0, pairs[1]))

    def score_in_chunks(self, embeddings: Tensor, pairs: Tensor) -> Tensor:
        """``score`` over ``SCORED_PAIRS`` pairs at a time: an evaluation split's pairs (100
        negatives per positive for MRR) would otherwise gather two embeddings each at once."""
        chunks = pairs.split(self.SCORED_PAIRS, dim=1)
        return (
            torch.cat([self.score(embeddings, chunk) for chunk in chunks]) if chunks else pairs.new_zeros(0)
        )

    @override
    def training_step(self, batch: MiniBatch, batch_idx: int) -> Tensor:
        if batch.pairs is None:
            raise ValueError(
                "LinkPredictor trains on batches seeded by edges (MQGNNDataModule(seeds=EdgeSeeds(...))); "
                "this batch carries no pairs"
            )
        if len(batch.blocks) != len(self.layers):
            raise ValueError(
                f"mini-batch has {len(batch.blocks)} blocks, model has {len(self.layers)} layers"
            )
        logits = self.score(self.batch_logits(batch), batch.pairs)
        loss = F.binary_cross_entropy_with_logits(logits, batch.pair_labels)
        if self._logging_step():
            self.log("train/loss", loss.detach().cpu(), prog_bar=True, batch_size=batch.pairs.shape[1])
        return loss

    @override
    def validation_step(self, batch: LinkEvalBatch, batch_idx: int) -> None:
        self._score_pairs(batch, "val")

    @override
    def test_step(self, batch: LinkEvalBatch, batch_idx: int) -> None:
        self._score_pairs(batch, "test")

    @torch.no_grad()
    def _score_pairs(self, batch: LinkEvalBatch, split: str) -> None:
        if not isinstance(batch, LinkEvalBatch):
            raise ValueError(
                f"LinkPredictor scores a link split's pairs; the {split} loader gave a {type(batch).__name__} "
                "(build the DataModule with seeds=EdgeSeeds(...))"
            )
        h = self._full_graph_logits(batch)
        pos, neg = (
            self.score_in_chunks(h, batch.pos.to(h.device)),
            self.score_in_chunks(h, batch.neg.to(h.device)),
        )
        self.log(f"{split}/metric", hits_at_k(pos, neg, self.hits_k), prog_bar=True, batch_size=pos.numel())
        self.log(f"{split}/auc", roc_auc(pos, neg), batch_size=pos.numel())
        if batch.neg_per_source is not None:
            per_source = batch.neg_per_source.to(h.device)
            sources = batch.pos[0].to(h.device).unsqueeze(1).expand_as(per_source)
            neg_rows = self.score_in_chunks(h, torch.stack([sources.reshape(-1), per_source.reshape(-1)]))
            self.log(f"{split}/mrr", mrr(pos, neg_rows.view(per_source.shape)), batch_size=pos.numel())

    @override
    def validation_work(self) -> float:
        """Exact inference for the validation pairs' endpoints (``models.work``)."""
        trainer = self.trainer
        datamodule = trainer.datamodule
        nodes = datamodule.val_dataloader().batch.nodes
        inference = self._inference_of(datamodule.dataset)
        rows = inference.rows_per_layer(nodes, len(self.layers))
        nonzeros = inference.input_nonzeros(self.layers[0], trainer.strategy.root_device)
        return inference_work(datamodule.dataset.graph, rows, self.layer_widths, nonzeros)
