"""The gather stage: attach feature rows (or the first layer's aggregation of them) and labels to
a sampled mini-batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.graph.mapped_pages import prefetch_rows
from lightning_mqgnn.pipeline.host_cache import TieredFeatures
from lightning_mqgnn.pipeline.packing import Deferred, RowGather
from lightning_mqgnn.sampling.aggregate import row_sum
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.feature_cache import lookup


def feature_rows(batch: MiniBatch, cache_slot: Tensor | None = None) -> Tensor:
    """Node ids whose feature rows must come from host memory: all input nodes, or with a device
    feature cache (``cache_slot[v]`` = cache row of node v, or -1) only the uncached ones
    (``feature_cache.lookup``)."""
    return batch.input_nodes if cache_slot is None else lookup(batch, cache_slot)


@dataclass
class InputAggregation:
    """The first block's aggregation of the input features: ``A_0 X`` (eq. 1, GCN), or for mean
    aggregation (GraphSAGE, eq. 17) ``[A_0 X, X_dst]``, the destinations' own rows beside it.

    The first layer's weights come after this sum, so the pipeline stage that owns the batch can
    compute it: the row sum reads ``X`` by global id, so the input rows are never gathered into
    a copy, the batch shrinks from ``num_src`` rows to ``num_dst``, and the training step starts
    at the first GEMM. Summation order is that of ``Block.aggregate``: training is bit-identical.
    From ``TieredFeatures`` (two tiers) or half-precision features (widened to float32) the input
    rows are read first, then summed alike.
    """

    features: Tensor | TieredFeatures
    block: Block
    input_nodes: Tensor
    with_self: bool

    def __post_init__(self):
        if self.with_self and not self.block.dst_in_src:
            raise ValueError(
                "mean aggregation (GraphSAGE) needs destinations as a source prefix (dst_in_src)"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        width = self.features.shape[1] * (2 if self.with_self else 1)
        return (self.block.num_dst, width)

    @property
    def dtype(self) -> torch.dtype:
        return compute_dtype(self.features.dtype)

    def _parts(self) -> list[Tensor]:
        b = self.block
        if isinstance(self.features, TieredFeatures) or self.features.dtype != self.dtype:
            # half-precision features are summed in float32: the input rows are read and widened
            rows = RowGather(self.features, self.input_nodes).value()
            ids, dst_rows = b.indices, rows[: b.num_dst]
        else:
            rows = self.features
            ids = self.input_nodes.index_select(0, b.indices)
            dst_rows = rows.index_select(0, self.input_nodes[: b.num_dst])
        agg = row_sum(ids, rows, b.indptr, b.weights.to(self.dtype))
        return [agg, dst_rows] if self.with_self else [agg]

    def write(self, out: Tensor) -> None:
        torch.cat(self._parts(), 1, out=out)

    def value(self) -> Tensor:
        parts = self._parts()
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def batch_gathers(
    batch: MiniBatch,
    features: Tensor | TieredFeatures,
    labels: Tensor,
    cache_slot: Tensor | None = None,
    input_aggregation: str | None = None,
) -> dict[str, Deferred]:
    """What the gather stage attaches to ``batch``: the seeds' ``labels``, and ``features`` of
    ``feature_rows`` or, with ``input_aggregation`` (the sampler's aggregation; not with a
    device cache, whose rows are on the device), the ``aggregated`` first layer. Workers write
    them straight into the packed batch; ``gather`` attaches them in place. Rows of arrays mapped
    from disk are asked for here, all at once (``prefetch_rows``), before any is read; with a host
    tier (``TieredFeatures``) only those it lacks, and ``meta["host_hits"]`` counts those it has."""
    aggregate = input_aggregation is not None and cache_slot is None
    rows = batch.input_nodes if aggregate else feature_rows(batch, cache_slot)
    if isinstance(features, TieredFeatures):
        batch.meta["host_hits"] = features.hits(rows)
        batch.meta["host_reads"] = rows.numel()
    else:
        prefetch_rows(features, rows)
    if aggregate:
        with_self = input_aggregation == "mean"
        inputs = {"aggregated": InputAggregation(features, batch.blocks[0], batch.input_nodes, with_self)}
    else:
        inputs = {"features": RowGather(features, rows)}
    prefetch_rows(labels, batch.output_nodes)
    return {**inputs, "labels": RowGather(labels, batch.output_nodes)}


def gather(
    batch: MiniBatch,
    features: Tensor | TieredFeatures,
    labels: Tensor,
    cache_slot: Tensor | None = None,
    input_aggregation: str | None = None,
) -> MiniBatch:
    """Attach the ``batch_gathers`` to ``batch`` (in place)."""
    for name, deferred in batch_gathers(batch, features, labels, cache_slot, input_aggregation).items():
        setattr(batch, name, deferred.value())
    return batch
