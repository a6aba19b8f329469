"""One mini-batch, from seeds to gathered features: the work a sampler worker does."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.rng import batch_generator, drawing_from


def sampler_device(sampler: Sampler, seeds: Tensor) -> torch.device:
    """Where ``sampler`` draws: its graph's device (the seeds' for a sampler without a graph)."""
    graph = getattr(sampler, "graph", None)
    return graph.indptr.device if graph is not None else seeds.device


def sample_batch(sampler: Sampler, seeds: Tensor, rng_seed: int, index: int) -> MiniBatch:
    """Sample ``seeds`` drawing from a generator seeded to ``rng_seed`` on the sampler's device
    (``rng.drawing_from``): the calling thread's default generators are not touched, so a
    producer thread beside the training thread leaves its random stream alone. On CPU the draws
    are those of ``torch.manual_seed(rng_seed)``. The blocks above the input layer get their
    transpose (``Block.with_transpose``), sparing the training step a sort per layer in backward.
    The time goes to ``batch.meta["sample_s"]``.
    """
    t0 = time.perf_counter()
    with drawing_from(batch_generator(rng_seed, sampler_device(sampler, seeds))):
        batch = sampler.sample(seeds)
    # a layer-wise sampler's node sets, read by edge seeds inside ``sample``: not shipped onwards
    batch.meta.pop("layer_nodes", None)
    # the layers above the input carry their transpose for the backward (the input layer's
    # sources are data: nothing flows back through its aggregation)
    batch.blocks[1:] = [block.with_transpose() for block in batch.blocks[1:]]
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
