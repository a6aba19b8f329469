"""The dtypes features are stored in, and the one the models compute in.

Features on disk may be stored in float16 or bfloat16 (``recipes/convert.py
features_dtype=float16``): half the bytes of float32, so half the reads from the disk per batch,
and twice the rows in the same page cache or host tier. They are a storage format only: a
gathered row, the first layer's aggregation, the device feature cache and exact inference are
float32 (``compute_dtype``), widened as they are read, so models, optimisers and aggregation sums
are the same code and precision as for float32 features. float16 keeps 11 significant bits over
a range of +-65504; bfloat16 keeps 8 bits over float32's range.

numpy has no bfloat16: a bfloat16 array is stored in its ``.npy`` file as the uint16 words of its
values (``storage_dtype``), and the dataset's manifest names it bfloat16.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "FEATURE_DTYPES",
    "as_stored",
    "check_feature_dtype",
    "compute_dtype",
    "narrowed",
    "storage_dtype",
    "torch_dtype",
]

FEATURE_DTYPES = ("float32", "float16", "bfloat16")


def check_feature_dtype(name: str, what: str = "features dtype") -> None:
    """ValueError unless ``name`` is one of ``FEATURE_DTYPES`` (``what`` names the setting)."""
    if name not in FEATURE_DTYPES:
        raise ValueError(f"{what} must be one of {FEATURE_DTYPES}, got {name!r}")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a stored array's dtype name (``"int64"``, ``"bfloat16"``...) stands for."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype whose ``.npy`` file holds an array of dtype ``name``: itself, or uint16
    words for bfloat16."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype rows of a ``dtype`` array are gathered in: float32 for the half-precision
    feature dtypes, ``dtype`` itself for any other (float32 features, int64 labels)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def narrowed(chunk: np.ndarray, name: str, first_row: int = 0) -> np.ndarray:
    """Rows of float32 features as the storage of dtype ``name`` holds them (rounded to nearest).
    A value that rounds to infinity (beyond +-65504 in float16) is a ``ValueError`` naming its
    node (``first_row`` is the chunk's first) and column."""
    check_feature_dtype(name)
    if name == "float32":
        return np.ascontiguousarray(chunk, dtype=np.float32)
    values = torch.from_numpy(np.ascontiguousarray(chunk, dtype=np.float32))
    out = values.to(torch_dtype(name))
    bad = torch.nonzero(torch.isinf(out) & torch.isfinite(values))
    if bad.numel():
        v, c = int(bad[0, 0]), int(bad[0, 1]) if bad.shape[1] > 1 else 0
        where = values[v, c] if values.dim() > 1 else values[v]
        raise ValueError(
            f"field 'features' has value {float(where)} at node {first_row + v}, column {c}, "
            f"beyond the range of {name}; store the features as "
            + ("float32 or bfloat16" if name == "float16" else "float32")
        )
    # the words through int16: torch has no uint16 tensors before 2.3
    return out.view(torch.int16).numpy().view(np.uint16) if name == "bfloat16" else out.numpy()


def as_stored(array: np.ndarray, name: str) -> Tensor:
    """A tensor over the words of a mapped ``storage_dtype(name)`` array, as dtype ``name`` (the
    bfloat16 words through int16: torch has no uint16 tensors before 2.3)."""
    if name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
