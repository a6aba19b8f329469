"""Which seeds each rank trains on in each epoch."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_mqgnn.sampling.rng import epoch_seed


def epoch_batches(
    train_idx: Tensor,
    batch_size: int,
    epoch: int,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[Tensor]:
    """Split one epoch's seeds into this rank's mini-batches.

    Every rank permutes with the same ``(seed, epoch)`` generator and takes a disjoint,
    equal-sized share, so all ranks run the same number of steps (uneven counts hang DDP).
    Without ``drop_last`` the share is padded by wrapping around the permutation.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = train_idx.numel()
    if n == 0:
        raise ValueError("the training split is empty")
    if shuffle:
        gen = torch.Generator().manual_seed(epoch_seed(seed, epoch))
        order = train_idx[torch.randperm(n, generator=gen)]
    else:
        order = train_idx
    per_rank = n // world_size if drop_last else -(-n // world_size)
    if per_rank == 0:
        raise ValueError(f"{n} training nodes cannot be shared by {world_size} ranks")
    if per_rank * world_size > n:  # pad by wrapping so every rank gets the same count
        order = torch.cat([order, order[: per_rank * world_size - n]])
    mine = order[rank * per_rank : (rank + 1) * per_rank]
    batches = list(torch.split(mine, batch_size))
    if drop_last and len(batches) > 1 and batches[-1].numel() < batch_size:
        batches.pop()
    return batches


def num_batches(n_train: int, batch_size: int, world_size: int = 1, drop_last: bool = False) -> int:
    """Number of batches ``epoch_batches`` yields on every rank."""
    per_rank = n_train // world_size if drop_last else -(-n_train // world_size)
    full, rest = divmod(per_rank, batch_size)
    return full + (1 if rest and (not drop_last or full == 0) else 0)
