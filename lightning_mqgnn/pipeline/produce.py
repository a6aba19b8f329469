"""One mini-batch, from seeds to gathered features: the work a sampler worker does."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch


def sample_batch(sampler: Sampler, seeds: Tensor, rng_seed: int, index: int) -> MiniBatch:
    """Sample ``seeds`` with torch's global generator seeded to ``rng_seed``.

    Reseeds the global generator of the calling process: callers that also train in this
    process wrap it in ``torch.random.fork_rng`` so the model's own random stream is untouched.
    The time goes to ``batch.meta["sample_s"]``.
    """
    torch.manual_seed(rng_seed)
    t0 = time.perf_counter()
    batch = sampler.sample(seeds)
    batch.meta.update(index=index, sample_s=time.perf_counter() - t0)
    return batch


def produce_batch(
    sampler: Sampler,
    seeds: Tensor,
    features: Tensor,
    labels: Tensor,
    rng_seed: int,
    index: int,
    cache_slot: Tensor | None = None,
    input_aggregation: str | None = None,
) -> MiniBatch:
    """``sample_batch`` then ``gather`` (time in ``batch.meta["gather_s"]``)."""
    batch = sample_batch(sampler, seeds, rng_seed, index)
    t0 = time.perf_counter()
    gather(batch, features, labels, cache_slot, input_aggregation)
    batch.meta["gather_s"] = time.perf_counter() - t0
    return batch


def produce_here(*args, **kwargs) -> MiniBatch:
    """``produce_batch(*args, **kwargs)`` in a process that also trains: the model's random
    stream stays untouched."""
    with torch.random.fork_rng(devices=[]):
        return produce_batch(*args, **kwargs)
