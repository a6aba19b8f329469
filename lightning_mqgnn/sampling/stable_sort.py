"""Stable ordering of integer keys at the speed of torch's radix sort.

On the CPU torch sorts a tensor of fewer than 32,768 entries (its parallel grain) with a comparison
sort and a longer integer tensor with a radix sort, so a mid-sized key array sorts several times
slower than one twice its size. ``stable_argsort`` pads such an array past the threshold with keys
that sort after all others. Stability also makes the order independent of which algorithm ran:
equal keys keep their input order.
"""

from __future__ import annotations

import torch
from torch import Tensor

RADIX_SORT_MIN = 32_768  # torch's CPU sort of integers takes its radix path from this length on
PAD_FROM = 8_192  # shorter arrays sort faster as they are than padded to RADIX_SORT_MIN


def stable_argsort(keys: Tensor) -> Tensor:
    """Positions that order the 1-D integer ``keys`` ascending, equal keys in input order."""
    n = keys.numel()
    if keys.is_cuda or not PAD_FROM <= n < RADIX_SORT_MIN:
        return torch.sort(keys, stable=True).indices
    padded = keys.new_full((RADIX_SORT_MIN,), torch.iinfo(keys.dtype).max)
    padded[:n] = keys  # a real key equal to the pad value still sorts first: the sort is stable
    return torch.sort(padded, stable=True).indices[:n]
