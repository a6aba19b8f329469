"""Compressed sparse row graph storage: the one graph type every sampler reads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.graph.mapped_pages import (
    MappedArray,
    mapped_source,
    prefetch_rows,
    read_at_random,
    read_rows,
)

ROW_CHUNK_EDGES = 1 << 24  # 128 MiB of int64 sources per ``row_chunks`` chunk


@dataclass(frozen=True)
class RowChunk:
    """Rows ``[lo, hi)`` of a ``CSRGraph``: their edges ``[start, end)``, ``indptr`` local to the
    chunk (``hi - lo + 1`` entries from 0) and ``sources`` (``indices[start:end]``)."""

    lo: int
    hi: int
    start: int
    end: int
    indptr: Tensor
    sources: Tensor


@dataclass(frozen=True)
class CSRGraph:
    """Adjacency in CSR form. Row ``v`` lists the in-neighbours of ``v``: the nodes whose
    messages ``v`` aggregates. For the undirected graphs of the paper rows and columns agree.

    ``indptr`` has ``num_nodes + 1`` int64 entries, ``indices`` one int64 source id per edge,
    sorted within each row.
    """

    indptr: Tensor
    indices: Tensor
    num_nodes: int

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def in_degrees(self) -> Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def source_counts(self) -> Tensor:
        """How many in-edges each node is the source of (its count in ``indices``; its out-degree),
        a chunk of rows at a time (``row_chunks``): how often a sampler that reads every in-edge
        of its frontier meets it."""
        counts = torch.zeros(self.num_nodes, dtype=torch.int64)
        for chunk in self.row_chunks():
            counts.index_add_(
                0, chunk.sources, torch.ones(1, dtype=torch.int64).expand(chunk.sources.numel())
            )
        return counts

    def __reduce_ex__(self, protocol):
        """A memory-mapped graph goes to another process (a spawned sampler worker, the GNS cache
        it holds) as its files, mapped again there, not pickled into shared memory whole."""
        sources = (mapped_source(self.indptr), mapped_source(self.indices))
        if sources[0] is None or sources[1] is None:
            return super().__reduce_ex__(protocol)
        return _mapped_graph, (*sources, self.num_nodes)

    def prefetch_rows(self, nodes: Tensor) -> None:
        """On a graph mapped from disk, start reading the in-edges of ``nodes`` before a sampler
        reads them (``mapped_pages.prefetch_rows``), so their reads are in flight together;
        nothing for a graph in memory or whose topology the page cache can hold."""
        if nodes.numel() == 0 or not read_at_random(self.indices):
            return  # in memory, or in the page cache after its first reads
        prefetch_rows(self.indptr, torch.cat([nodes, nodes + 1]))
        starts = self.indptr.index_select(0, nodes)
        prefetch_rows(self.indices, starts, self.indptr.index_select(0, nodes + 1) - starts)

    def share_memory_(self) -> CSRGraph:
        """Move the arrays to shared memory so sampler processes read them without a copy."""
        self.indptr.share_memory_()
        self.indices.share_memory_()
        return self

    def row_ids(self) -> Tensor:
        """Destination id of every edge, in CSR order (the COO row vector)."""
        return torch.repeat_interleave(
            torch.arange(self.num_nodes, device=self.indptr.device), self.in_degrees()
        )

    def row_chunks(self, max_edges: int | None = None) -> Iterator[RowChunk]:
        """Consecutive row ranges of at most ``max_edges`` edges each (default ``ROW_CHUNK_EDGES``;
        a row with more is a chunk of its own), in order, with their edges: a pass over the edges
        of a graph whose edge list is on disk or too large for its per-edge temporaries reads and
        holds one chunk at a time, its ``indices`` read through their file (``read_rows``) where
        they are memory-mapped."""
        n, lo, max_edges = self.num_nodes, 0, max_edges or ROW_CHUNK_EDGES
        while lo < n:
            start = int(self.indptr[lo])
            hi = int(torch.searchsorted(self.indptr, start + max_edges, right=True)) - 1
            hi = min(max(hi, lo + 1), n)
            end = int(self.indptr[hi])
            sources = read_rows(self.indices, start, end)
            yield RowChunk(lo, hi, start, end, self.indptr[lo : hi + 1] - start, sources)
            lo = hi

    def is_symmetric(self) -> bool:
        rows = self.row_ids()
        key = rows * self.num_nodes + self.indices
        key_t = self.indices * self.num_nodes + rows
        return bool(torch.equal(torch.sort(key).values, torch.sort(key_t).values))

    @classmethod
    def from_edges(
        cls,
        src: Tensor,
        dst: Tensor,
        num_nodes: int,
        *,
        symmetrize: bool = False,
        remove_self_loops: bool = True,
    ) -> CSRGraph:
        """Build from an edge list ``src -> dst``; duplicates are merged (policy: a simple graph),
        self loops dropped unless asked to keep them (models add their own, eq. 2)."""
        src = torch.as_tensor(src, dtype=torch.int64).reshape(-1)
        dst = torch.as_tensor(dst, dtype=torch.int64).reshape(-1)
        if symmetrize:
            src, dst = torch.cat([src, dst]), torch.cat([dst, src])
        if remove_self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
        key = torch.unique(dst * num_nodes + src)  # sorted by (dst, src), duplicates merged
        rows, cols = key // num_nodes, key % num_nodes
        counts = torch.bincount(rows, minlength=num_nodes)
        indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        return cls(indptr=indptr, indices=cols.contiguous(), num_nodes=int(num_nodes))


def _mapped_graph(indptr: MappedArray, indices: MappedArray, num_nodes: int) -> CSRGraph:
    return CSRGraph(indptr=indptr.open(), indices=indices.open(), num_nodes=num_nodes)
