"""Seeded random train/val/test splits (the generated graphs use them; OGB and npz ship their own)."""

from __future__ import annotations

import torch
from torch import Tensor


def random_split(
    num_nodes: int, fractions: tuple[float, float, float], generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Disjoint sorted id sets of sizes ``round(f * N)`` (test takes the rest if the fractions sum to 1).

    Each split keeps at least one node, so a tiny graph still validates.
    """
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or sum(fractions) > 1.0 + 1e-9:
        raise ValueError(f"split fractions must be 3 positive numbers summing to <= 1, got {fractions}")
    if num_nodes < 3:
        raise ValueError(f"a split needs at least 3 nodes, got num_nodes={num_nodes}")
    n_train = max(1, round(fractions[0] * num_nodes))
    n_val = max(1, round(fractions[1] * num_nodes))
    if abs(sum(fractions) - 1.0) < 1e-9:
        n_test = num_nodes - n_train - n_val
    else:
        n_test = round(fractions[2] * num_nodes)
    n_test = max(1, min(n_test, num_nodes - n_train - n_val))
    if n_train + n_val + n_test > num_nodes:
        raise ValueError(f"split fractions {fractions} do not fit {num_nodes} nodes")
    perm = torch.randperm(num_nodes, generator=generator)
    cuts = (n_train, n_train + n_val, n_train + n_val + n_test)
    train, val, test = perm[: cuts[0]], perm[cuts[0] : cuts[1]], perm[cuts[1] : cuts[2]]
    return torch.sort(train).values, torch.sort(val).values, torch.sort(test).values
