"""Sparse node features to the dense float32 matrix a model reads: row-normalise, densify or reduce.

Wide bag-of-words features (coauthor: 6,805 and 8,415 columns) cost memory and time in every
gathered mini-batch, so loaders may reduce them to ``max_features`` columns. Default
``"frequent"``: keep the ``k`` columns with the most non-zeros (document frequency; ties to the
lower id), deterministic without a seed and still sparse bag-of-words. Measured on the shared
data at k = 1024 (nearest-centroid accuracy of neighbour-mean features, all columns -> kept):
citeseer 0.687 -> 0.682, coauthor_cs 0.910 -> 0.906, coauthor_physics 0.908 -> 0.907.
``"projection"``: a seeded very sparse random projection (Li, Hastie & Church 2006), ``X R`` with
``R[i, j]`` = +-sqrt(s / k) with probability 1/(2s) each, else 0, ``s = sqrt(F)``; it keeps
pairwise distances up to a small distortion and uses every column, but lost 3 points on
citeseer at k = 1024 (0.656).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

REDUCTIONS = ("projection", "frequent")
# torch's one-time notice that sparse CSR tensors are in beta: noise where CSR is what a product runs on
CSR_BETA_NOTICE = "Sparse CSR tensor support is in beta"


def row_normalize(indptr: Tensor, values: Tensor) -> Tensor:
    """Scale each CSR row to sum 1 (rows summing to 0 are left as they are), as GCN preprocesses
    bag-of-words features: every node then enters aggregation with the same total mass."""
    counts = indptr[1:] - indptr[:-1]
    rows = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    sums = torch.zeros(counts.numel(), dtype=torch.float64).index_add_(0, rows, values.to(torch.float64))
    sums[sums == 0] = 1.0
    return (values.to(torch.float64) / sums[rows]).to(torch.float32)


def densify(indptr: Tensor, indices: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    out = torch.zeros(shape, dtype=torch.float32)
    counts = indptr[1:] - indptr[:-1]
    rows = torch.repeat_interleave(torch.arange(shape[0]), counts)
    out.index_put_((rows, indices), values, accumulate=True)
    return out


def sparse_random_projection(
    indptr: Tensor, indices: Tensor, values: Tensor, shape: tuple[int, int], k: int, seed: int = 0
) -> Tensor:
    """``X R`` with the very sparse random matrix ``R`` of the module docstring, ``[N, k]`` float32."""
    num_cols = shape[1]
    s = math.sqrt(num_cols)
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(num_cols, k, generator=gen)
    proj = torch.zeros(num_cols, k)
    proj[u < 1.0 / (2.0 * s)] = 1.0
    proj[u > 1.0 - 1.0 / (2.0 * s)] = -1.0
    proj.mul_(math.sqrt(s / k))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CSR_BETA_NOTICE)
        x = torch.sparse_csr_tensor(indptr, indices, values, size=shape, check_invariants=False)
    return torch.sparse.mm(x, proj).contiguous()


# exact inference's CSR product (no conversion per call, no backward) on the 2-core VM: 2.4x-9x
# faster than the dense one at 0.3-4% non-zero (citeseer to dblp), slower at 35% (amazon_photo)
SPARSE_DENSITY = 0.1
SPARSE_MAX_ELEMENTS = 2**28  # counting the non-zeros reads the matrix: not of features mapped from disk


def sparse_rows(features: Tensor, max_density: float = SPARSE_DENSITY) -> Tensor | None:
    """``features`` as a sparse CSR matrix when at most ``max_density`` of its entries are non-zero
    (bag-of-words inputs), else None; also None for other than float32 features in memory of at
    most ``SPARSE_MAX_ELEMENTS`` entries, whose non-zeros are not counted. A product with the CSR
    matrix costs its non-zeros: on dblp's 1,639 columns (0.3% non-zero) a fraction of a percent
    of the dense one's multiply-adds."""
    if not isinstance(features, Tensor) or features.dtype != torch.float32 or features.dim() != 2:
        return None
    if features.numel() > SPARSE_MAX_ELEMENTS or features.layout != torch.strided:
        return None
    if int(torch.count_nonzero(features)) > max_density * features.numel():
        return None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CSR_BETA_NOTICE)
        return features.to_sparse_csr()


def most_frequent_columns(indices: Tensor, num_cols: int, k: int) -> Tensor:
    """Ids of the ``k`` columns with the most non-zeros (ties: lower id first), ascending."""
    freq = torch.bincount(indices, minlength=num_cols)
    order = torch.argsort(-freq, stable=True)
    return torch.sort(order[:k]).values


def select_columns(
    indptr: Tensor, indices: Tensor, values: Tensor, shape: tuple[int, int], cols: Tensor
) -> Tensor:
    new_id = torch.full((shape[1],), -1, dtype=torch.int64)
    new_id[cols] = torch.arange(cols.numel())
    counts = indptr[1:] - indptr[:-1]
    rows = torch.repeat_interleave(torch.arange(shape[0]), counts)
    keep = new_id[indices] >= 0
    out = torch.zeros(shape[0], cols.numel(), dtype=torch.float32)
    out.index_put_((rows[keep], new_id[indices[keep]]), values[keep], accumulate=True)
    return out


def sparse_to_dense_features(
    indptr: Tensor,
    indices: Tensor,
    values: Tensor,
    shape: tuple[int, int],
    *,
    max_features: int | None = None,
    normalize: bool = False,
    reduction: str = "frequent",
    seed: int = 0,
) -> Tensor:
    """Row-normalise (optional), then densify, or reduce to ``max_features`` columns when wider."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown feature reduction {reduction!r}; expected one of {REDUCTIONS}")
    if max_features is not None and max_features < 1:
        raise ValueError(f"max_features must be positive, got {max_features}")
    values = values.to(torch.float32)
    if normalize:
        values = row_normalize(indptr, values)
    if max_features is None or shape[1] <= max_features:
        return densify(indptr, indices, values, shape)
    if reduction == "projection":
        return sparse_random_projection(indptr, indices, values, shape, max_features, seed)
    cols = most_frequent_columns(indices, shape[1], max_features)
    return select_columns(indptr, indices, values, shape, cols)
