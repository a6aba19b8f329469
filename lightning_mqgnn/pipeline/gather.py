"""The gather stage: attach feature rows and labels to a sampled mini-batch."""

from __future__ import annotations

from torch import Tensor

from lightning_mqgnn.pipeline.packing import RowGather
from lightning_mqgnn.sampling.batch import MiniBatch


def feature_rows(batch: MiniBatch, cache_slot: Tensor | None = None) -> Tensor:
    """Node ids whose feature rows must come from host memory.

    With a device feature cache (``cache_slot[v]`` = cache row of node v, or -1) only the
    uncached input nodes; ``batch.cache_slots`` then tells the device stage where the rest live.
    """
    if cache_slot is None:
        return batch.input_nodes
    slots = cache_slot.index_select(0, batch.input_nodes)
    batch.cache_slots = slots
    batch.meta["cache_hits"] = int((slots >= 0).sum())  # for the per-epoch hit rate
    return batch.input_nodes[slots < 0]


def batch_gathers(
    batch: MiniBatch, features: Tensor, labels: Tensor, cache_slot: Tensor | None = None
) -> dict[str, RowGather]:
    """The rows gathered into ``batch``: ``features`` of ``feature_rows`` and the seeds' ``labels``.
    Workers write them straight into the packed batch; ``gather`` attaches them in place."""
    return {
        "features": RowGather(features, feature_rows(batch, cache_slot)),
        "labels": RowGather(labels, batch.output_nodes),
    }


def gather(batch: MiniBatch, features: Tensor, labels: Tensor, cache_slot: Tensor | None = None) -> MiniBatch:
    """Fill ``batch.features`` (the rows of ``feature_rows``) and ``batch.labels``."""
    for name, rows in batch_gathers(batch, features, labels, cache_slot).items():
        setattr(batch, name, rows.source.index_select(0, rows.rows))
    return batch
