"""The random streams of a run, each derived from the run's seed by one formula.

A draw that depends only on (seed, epoch[, batch index]) is the same whichever process or worker
makes it: the sequential loop and the pipeline train on identical batches, every rank permutes
the training set alike, and a feature cache redraws alike everywhere.
"""

from __future__ import annotations


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of ``epoch``'s per-epoch draws (the training-set permutation, the cache draw)."""
    return int(seed) * 1_000_003 + int(epoch)


def batch_rng_seed(seed: int, epoch: int, index: int) -> int:
    """The sampler RNG seed of batch ``index`` of ``epoch``: sampling is seeded per batch, not
    per process, so a batch is the same whichever process or worker draws it."""
    return epoch_seed(seed, epoch) * 1_000_033 + int(index)
