"""The random streams of a run, each derived from the run's seed by one formula.

A draw that depends only on (seed, epoch[, batch index]) is the same whichever process or worker
makes it: the sequential loop and the pipeline train on identical batches, every rank permutes
the training set alike, and a feature cache redraws alike everywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_local = threading.local()


def derived_seed(seed: int, key: int) -> int:
    """The seed of the stream ``key`` (an epoch, a rank) of a run seeded with ``seed``."""
    return int(seed) * 1_000_003 + int(key)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of ``epoch``'s per-epoch draws (the training-set permutation, the cache draw)."""
    return derived_seed(seed, epoch)


def batch_rng_seed(seed: int, epoch: int, index: int) -> int:
    """The sampler RNG seed of batch ``index`` of ``epoch``: sampling is seeded per batch, not
    per process, so a batch is the same whichever process or worker draws it."""
    return epoch_seed(seed, epoch) * 1_000_033 + int(index)


def sampling_generator() -> torch.Generator | None:
    """The generator samplers draw from in this thread (set by ``drawing_from``), or None for
    torch's default generator of the device the draw happens on."""
    return getattr(_local, "generator", None)


@contextmanager
def drawing_from(generator: torch.Generator | None) -> Iterator[None]:
    """Make samplers in this thread draw from ``generator``: a producer thread then never
    touches the default generator the training thread's dropout draws from."""
    before = sampling_generator()
    _local.generator = generator
    try:
        yield
    finally:
        _local.generator = before


def batch_generator(rng_seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``rng_seed``. On CPU its stream is that of
    ``torch.manual_seed(rng_seed)``; a CUDA generator draws another (Philox) stream."""
    return torch.Generator(device=device).manual_seed(int(rng_seed))
