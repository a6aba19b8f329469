"""A CSR topology built on disk from edge chunks: an external bucket sort by destination.

A graph whose edge list exceeds the memory (papers100M: 3.2B directed entries, 26 GB of int64)
cannot be sorted in one array. ``EdgeBuckets`` spills every chunk of edges to one file per range
of destination nodes (``add``), then sorts and merges one range at a time (``merge``): memory
holds one chunk or one range, never the graph. The ranges are read back in order as the CSR
column array (``column_chunks``), so ``DatasetWriter`` writes ``indices.npy`` without holding it.

The rows are ``homophilous_chung_lu``'s convention: each row's columns ascending, no duplicates.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

BUCKET_BYTES = 1 << 30  # the int64 keys of one destination range: what a merge sorts at once


class EdgeBuckets:
    """Directed edges of ``num_nodes`` nodes, spilled to ``folder`` by destination range.

    ``expected_entries`` (directed, duplicates included) sizes the ranges so one holds about
    ``BUCKET_BYTES`` of keys. After ``merge``, ``indptr`` and ``num_edges`` describe the merged
    graph and ``column_chunks`` reads its columns; the spill files are removed as they are merged.
    """

    def __init__(self, folder: Path, num_nodes: int, expected_entries: int):
        if num_nodes >= 1 << 31:
            raise ValueError(f"{num_nodes} nodes: keys dst * N + src would overflow int64")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.num_nodes = int(num_nodes)
        buckets = max(1, math.ceil(expected_entries * 8 / BUCKET_BYTES))
        self.rows_per_bucket = max(1, math.ceil(self.num_nodes / buckets))
        self.num_buckets = math.ceil(self.num_nodes / self.rows_per_bucket)
        self.indptr: Tensor | None = None
        self.num_edges = 0

    def _spill(self, b: int) -> Path:
        return self.folder / f"keys-{b:05d}.bin"

    def _merged(self, b: int) -> Path:
        return self.folder / f"merged-{b:05d}.bin"

    def add(self, dst: Tensor, src: Tensor) -> None:
        """Append the edges ``src -> dst`` (int64) to their destinations' ranges."""
        keys = dst.numpy() * self.num_nodes + src.numpy()
        small = np.int16 if self.num_buckets < 1 << 15 else np.int32
        bucket = (dst.numpy() // self.rows_per_bucket).astype(small)
        order = np.argsort(bucket, kind="stable")  # a radix sort for 16-bit keys
        counts = np.bincount(bucket, minlength=self.num_buckets)
        keys = keys[order]
        start = 0
        for b, count in enumerate(counts.tolist()):
            if count:
                with open(self._spill(b), "ab") as f:
                    f.write(keys[start : start + count].data)
                start += count

    def add_undirected(self, a: Tensor, b: Tensor) -> None:
        """Both directions of the edges ``a - b``."""
        self.add(torch.cat([a, b]), torch.cat([b, a]))

    def merge(self) -> Tensor:
        """Sort each range's new edges into its merged ones, without duplicates; returns
        ``indptr`` (int64 ``[N + 1]``). Edges added after a merge join at the next one."""
        degree = np.zeros(self.num_nodes, dtype=np.int64)
        self.num_edges = 0
        for b in range(self.num_buckets):
            spill, merged = self._spill(b), self._merged(b)
            new = np.fromfile(spill, dtype=np.int64) if spill.exists() else np.empty(0, np.int64)
            new.sort()
            if merged.exists():  # two sorted runs: the stable sort (timsort) merges them in one pass
                new = np.concatenate([np.fromfile(merged, dtype=np.int64), new])
                new.sort(kind="stable")
            keys = unique_of_sorted(new)
            first = b * self.rows_per_bucket
            last = min(first + self.rows_per_bucket, self.num_nodes)
            degree[first:last] = np.bincount(keys // self.num_nodes - first, minlength=last - first)
            keys.tofile(merged)
            spill.unlink(missing_ok=True)
            self.num_edges += int(keys.size)
        indptr = torch.zeros(self.num_nodes + 1, dtype=torch.int64)
        torch.cumsum(torch.from_numpy(degree), 0, out=indptr[1:])
        self.indptr = indptr
        return indptr

    def column_chunks(self) -> Iterator[np.ndarray]:
        """The merged graph's column array, one range at a time, each file removed once read."""
        if self.indptr is None:
            raise RuntimeError("column_chunks before merge")
        for b in range(self.num_buckets):
            path = self._merged(b)
            yield np.fromfile(path, dtype=np.int64) % self.num_nodes
            path.unlink()


def unique_of_sorted(keys: np.ndarray) -> np.ndarray:
    """``keys`` (sorted) without repeats; a linear pass (``np.unique`` sorts again, by hashing)."""
    if keys.size == 0:
        return keys
    keep = np.empty(keys.size, dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]
