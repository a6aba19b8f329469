"""Lossless compression of the activations a layer pipeline sends between stages: a bitmap of the
non-zero entries, then their values.

A stage's output rows are a convolution's ReLU then dropout, so most of their entries are zero
(about three in four at dropout 0.5): sending one bit per entry plus the non-zero values cuts the
forward transfer to roughly a quarter of the dense float32 rows and changes no value (GNNPipe's
own system compresses its stage transfers the same way). The receiver learns the number of values
from the bitmap, so the two messages need no size header. Zeros come back as +0.0 (a -0.0 loses
its sign); NaN and infinities are non-zero entries and travel as values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def bitmap_bytes(numel: int) -> int:
    """Bytes of the bitmap of ``numel`` entries: one bit each, the last byte padded."""
    return (numel + 7) // 8


@dataclass
class NonzeroRows:
    """Rows as a bitmap (uint8, bit ``i`` in numpy's big-endian bit order set where entry ``i`` of
    the row-major rows is non-zero) and the non-zero entries in row-major order (float32)."""

    bitmap: Tensor
    values: Tensor


def pack_nonzeros(rows: Tensor) -> NonzeroRows:
    """``rows`` (on the host, float32) as a bitmap and its non-zero values."""
    flat = rows.reshape(-1)
    nonzero = flat != 0
    bitmap = torch.from_numpy(np.packbits(nonzero.numpy()))
    return NonzeroRows(bitmap, flat[nonzero])


def nonzero_mask(bitmap: Tensor, numel: int) -> Tensor:
    """The boolean mask of ``numel`` entries that ``bitmap`` encodes."""
    if bitmap.numel() != bitmap_bytes(numel):
        raise ValueError(f"a bitmap of {numel} entries has {bitmap_bytes(numel)} bytes, got {bitmap.numel()}")
    return torch.from_numpy(np.unpackbits(bitmap.numpy(), count=numel).view(np.bool_))


def unpack_nonzeros(mask: Tensor, values: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The float32 rows of ``shape`` whose entries under ``mask`` are ``values``, zero elsewhere."""
    flat = torch.zeros(mask.numel(), dtype=torch.float32)
    flat.masked_scatter_(mask, values)  # unlike flat[mask] = values, no index per entry
    return flat.view(shape)
