"""The gather stage: attach feature rows and labels to a sampled mini-batch."""

from __future__ import annotations

from torch import Tensor

from lightning_mqgnn.sampling.batch import MiniBatch


def gather(batch: MiniBatch, features: Tensor, labels: Tensor, cache_slot: Tensor | None = None) -> MiniBatch:
    """Fill ``batch.features`` and ``batch.labels``.

    With a device feature cache (``cache_slot[v]`` = cache row of node v, or -1), only uncached
    rows are gathered on the host; ``cache_slots`` tells the device stage where the rest live.
    """
    batch.labels = labels.index_select(0, batch.output_nodes)
    if cache_slot is None:
        batch.features = features.index_select(0, batch.input_nodes)
        return batch
    slots = cache_slot.index_select(0, batch.input_nodes)
    batch.cache_slots = slots
    batch.meta["cache_hits"] = int((slots >= 0).sum())  # for the per-epoch hit rate
    batch.features = features.index_select(0, batch.input_nodes[slots < 0])
    return batch
