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

from lightning_mqgnn.graph.link_dataset import LINK_METRICS
from lightning_mqgnn.models.inference import FullGraphBatch, LinkEvalBatch
from lightning_mqgnn.models.link_metrics import hits_at_k, mrr, roc_auc
from lightning_mqgnn.models.node_classifier import NodeClassifier
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


def check_decoder_width(decoder: nn.Module, width: int) -> None:
    """A one-line ``ValueError`` unless ``decoder`` scores a pair of ``width``-wide embeddings as
    one logit, found by scoring two zero pairs: a decoder built for another width fails here,
    not at the first batch."""
    name = type(decoder).__name__
    probe = torch.zeros(2, width)
    try:
        with torch.no_grad():
            out = decoder(probe, probe)
    except RuntimeError as err:
        first = (str(err).splitlines() or [""])[0]
        raise ValueError(
            f"LinkPredictor: decoder {name} does not take the encoder's embeddings of width {width} "
            f"(model.module.embedding, default hidden): {first}"
        ) from None
    if not isinstance(out, Tensor) or tuple(out.shape) != (2,):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"LinkPredictor: decoder {name} gives {shape} for 2 pairs of width {width}; expected one logit a pair"
        )


class LinkPredictor(NodeClassifier):
    """Scores node pairs: a GCN or SAGE encoder of ``num_layers`` layers ending in embeddings of
    ``embedding`` width (default: ``hidden``), then ``decoder`` ("dot", "mlp" over the Hadamard
    product, or a module scoring ``decoder(h_src, h_dst)``, checked against ``embedding``).
    ``metric``: what ``val/metric`` is: ``"hits"`` (Hits@``hits_k``; 50 as ogbl-collab) or
    ``"mrr"`` (over each positive's own negatives, as ogbl-citation2). Logged: ``train/loss``,
    ``{val,test}/metric``, ``{val,test}/auc``, ``{val,test}/mrr`` where the split has per-source
    negatives (under ``metric="hits"``) and ``{val,test}/hits`` (under ``metric="mrr"``).

    Node inputs: the dataset's features (``in_dim`` wide), or a learnt table of ``num_nodes`` rows
    of ``node_embedding`` width (``nn.Embedding``), the input rows of every batch's nodes and of
    exact inference. The table is used where ``node_embedding`` is given, and for a dataset
    without features (``in_dim=0``), then ``hidden`` wide by default.

    The encoder is ``NodeClassifier``'s, trained on batches of ``EdgeSeeds``: any sampler, any
    loader, the first layer aggregated in the gather stage or not (features only)."""

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
        decoder: str | nn.Module = "dot",
        hits_k: int = 50,
        metric: str = "hits",
        num_nodes: int | None = None,
        node_embedding: int | None = None,
        glorot_init: bool | None = None,
        num_classes: int | None = None,
    ):
        embedding = hidden if embedding is None else embedding
        if num_classes is not None and num_classes != embedding:
            raise ValueError(
                f"LinkPredictor: num_classes={num_classes} is a node classifier's output; a link "
                f"predictor ends in embeddings of width embedding={embedding}"
            )
        if metric not in LINK_METRICS:
            raise ValueError(f"LinkPredictor: metric must be one of {LINK_METRICS}, got {metric!r}")
        if hits_k < 1:
            raise ValueError(f"LinkPredictor: hits_k must be a positive count, got {hits_k}")
        if node_embedding is None and in_dim == 0:
            node_embedding = hidden
        if node_embedding is not None and (num_nodes is None or num_nodes < 1 or node_embedding < 1):
            raise ValueError(
                f"LinkPredictor: a learnt input per node (node_embedding={node_embedding}, or a dataset "
                f"without features) needs num_nodes >= 1 and a positive width, got num_nodes={num_nodes}"
            )
        pair = decoder if isinstance(decoder, nn.Module) else pair_decoder(decoder, embedding)
        check_decoder_width(pair, embedding)
        if isinstance(decoder, nn.Module):  # the hyperparameters name it; its weights are the state's
            decoder = type(decoder).__name__
        super().__init__(
            in_dim if node_embedding is None else node_embedding,
            embedding,
            conv=conv,
            hidden=hidden,
            num_layers=num_layers,
            dropout=dropout,
            lr=lr,
            weight_decay=weight_decay,
            glorot_init=glorot_init,
        )
        self.decoder = pair
        self.hits_k = hits_k
        self.link_metric = metric
        self.node_embedding: nn.Embedding | None = None
        if node_embedding is not None:
            self.node_embedding = nn.Embedding(num_nodes, node_embedding)
            nn.init.xavier_uniform_(self.node_embedding.weight)
            self.accepts_aggregated_inputs = False  # the gather stage has no rows to aggregate
        self.save_hyperparameters()

    @override
    def batch_logits(self, batch: MiniBatch) -> Tensor:
        if self.node_embedding is None:
            return super().batch_logits(batch)
        return self(batch.blocks, self.node_embedding(batch.input_nodes))

    @override
    def _full_graph_logits(self, batch: FullGraphBatch) -> Tensor:
        inputs = None if self.node_embedding is None else self.node_embedding.weight
        return self._inference_of(batch.dataset).run(
            self.layers, torch.relu_, batch.nodes, self.device, inputs=inputs
        )

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
        if self.link_metric == "mrr" and batch.neg_per_source is None:
            raise ValueError(
                f"LinkPredictor(metric='mrr') ranks each positive against its own negatives; the {split} "
                "split has none (LinkSplit.val_neg_per_source / test_neg_per_source)"
            )
        h = self._full_graph_logits(batch)
        pos, neg = (
            self.score_in_chunks(h, batch.pos.to(h.device)),
            self.score_in_chunks(h, batch.neg.to(h.device)),
        )
        scores = {"hits": hits_at_k(pos, neg, self.hits_k), "auc": roc_auc(pos, neg)}
        if batch.neg_per_source is not None:
            per_source = batch.neg_per_source.to(h.device)
            sources = batch.pos[0].to(h.device).unsqueeze(1).expand_as(per_source)
            neg_rows = self.score_in_chunks(h, torch.stack([sources.reshape(-1), per_source.reshape(-1)]))
            scores["mrr"] = mrr(pos, neg_rows.view(per_source.shape))
        self.log(f"{split}/metric", scores.pop(self.link_metric), prog_bar=True, batch_size=pos.numel())
        for name, value in scores.items():
            self.log(f"{split}/{name}", value, batch_size=pos.numel())

    @override
    def _validation_nodes(self) -> Tensor:
        """The validation pairs' endpoints: what validation's exact inference computes."""
        return self.trainer.datamodule.val_dataloader().batch.nodes
