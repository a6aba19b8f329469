"""Sorting integer ids at the speed of a radix sort.

On the CPU torch sorts a tensor of fewer than 32,768 entries (its parallel grain) with a comparison
sort and a longer integer tensor with a radix sort, so a mid-sized id array sorts several times
slower than one twice its size. ``stable_argsort`` pads an array in that range past the threshold
with ids that sort after all others. Keys known to
lie below 2^16 (a block's local ids) take numpy's stable sort of 16-bit integers, a radix sort
whose cost is linear in the keys (BENCHMARKS.md measures what it saves a batch).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

RADIX_SORT_MIN = 32_768  # torch's CPU sort of integers takes its radix path from this length on
PAD_FROM = 8_192  # shorter arrays sort faster as they are than padded to RADIX_SORT_MIN
SHORT_KEYS = 1 << 16  # keys below this fit numpy's 16-bit radix sort


def _padded(ids: Tensor) -> Tensor | None:
    """``ids`` followed by the dtype's largest value up to ``RADIX_SORT_MIN`` entries, when a CPU
    sort of them is faster that way; else None."""
    if ids.is_cuda or not PAD_FROM <= ids.numel() < RADIX_SORT_MIN:
        return None
    padded = ids.new_full((RADIX_SORT_MIN,), torch.iinfo(ids.dtype).max)
    padded[: ids.numel()] = ids
    return padded


def stable_argsort(keys: Tensor, bound: int | None = None) -> Tensor:
    """Positions that order the 1-D integer ``keys`` ascending, equal keys in input order (so the
    order does not depend on which algorithm ran). ``bound``: every key is in ``[0, bound)``, when
    the caller knows it. A real key equal to the pad value still sorts before the padding: the
    sort is stable."""
    if bound is not None and bound <= SHORT_KEYS and not keys.is_cuda and keys.numel() > 0:
        return torch.from_numpy(np.argsort(keys.numpy().astype(np.uint16), kind="stable")).to(torch.int64)
    padded = _padded(keys)
    if padded is None:
        return torch.sort(keys, stable=True).indices
    return torch.sort(padded, stable=True).indices[: keys.numel()]
