"""What device-resident sampling reads and how it makes one batch, in whichever thread or process
samples: the sampler, labels and features moved to the device once (``ResidentGraph``), and
``produce_resident``."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.pipeline.placement import Placement
from lightning_mqgnn.pipeline.produce import sample_batch
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.feature_cache import FeatureCache, merge_cached_rows
from lightning_mqgnn.sampling.residency import to_device


@dataclass
class ResidentGraph:
    """What the producer reads, on ``device``: the moved sampler (and its cache), the labels,
    and the features (on the device, or the host ones when they stay there)."""

    device: torch.device
    sampler: Sampler
    labels: Tensor
    features: Tensor
    cache: FeatureCache | None

    @classmethod
    def build(cls, source: BatchSource, placement: Placement) -> ResidentGraph:
        device = placement.sample_on
        if device.type == "cuda" and device.index is None:  # "cuda": the current device, by index
            device = torch.device("cuda", torch.cuda.current_device())
        memo: dict = {}  # a GNS sampler and its cache keep one moved graph
        sampler = to_device(source.sampler, device, memo)
        cache = to_device(source.feature_cache, device, memo) if source.feature_cache is not None else None
        ds = source.dataset
        features_on = device if placement.features_resident else placement.features_on
        return cls(device, sampler, ds.labels.to(device), ds.features.to(features_on), cache)

    @property
    def features_resident(self) -> bool:
        return self.features.device == self.device


def produce_resident(
    r: ResidentGraph,
    seeds: Tensor,
    rng_seed: int,
    index: int,
    input_aggregation: str | None,
    host_cache: Tensor | None = None,
) -> MiniBatch:
    """Batch ``index`` sampled and gathered from ``r`` on its device. With resident features and
    no cache the first layer is aggregated as ``input_aggregation`` says; with host features the
    rows are gathered there and copied over, a cache's rows merged from ``host_cache`` (its rows'
    device copy)."""
    t0 = time.perf_counter()
    batch = sample_batch(r.sampler, seeds.to(r.device), rng_seed, index)
    t1 = time.perf_counter()
    if r.features_resident:
        # the rows are all here: no cache lookup, and the first layer may be aggregated
        aggregation = input_aggregation if r.cache is None else None
        gather(batch, r.features, r.labels, None, aggregation)
    else:
        slot = r.cache.slot if r.cache is not None else None
        gather(batch, r.features, r.labels, slot, None)  # host rows, copied in RowGather
        merge_cached_rows(batch, host_cache)
    batch.meta.update(gather_s=time.perf_counter() - t1, sample_s=t1 - t0)
    return batch
