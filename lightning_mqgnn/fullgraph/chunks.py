"""Chunks of a partition for layer pipelining: the inner nodes cut into ``num_chunks`` dependent
pieces that flow through the pipeline stages one after the other.

Each chunk carries the block of its rows over ``[chunk rows ; ext rows]``: ``ext`` are the local
rows (inner rows of other chunks, or halo rows) its nodes aggregate. A stage reads those from its
history of the layer's input, fresh when their chunk went through earlier in the epoch, from the
previous epoch otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.fullgraph.partition import (
    PARTITIONERS,
    LocalPartition,
    import_pymetis,
    metis_partition,
    random_partition,
)
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import row_positions
from lightning_mqgnn.sampling.batch import Block


@dataclass(frozen=True)
class Chunk:
    """``rows``: the chunk's inner positions (sorted); ``ext``: the other local rows they aggregate
    (sorted); ``block``: destinations = ``rows``, sources = ``[rows ; ext]``."""

    rows: Tensor
    ext: Tensor
    block: Block

    @property
    def num_rows(self) -> int:
        return int(self.rows.numel())

    def source_rows(self) -> Tensor:
        return torch.cat([self.rows, self.ext])

    def to(self, device: torch.device | str) -> Chunk:
        return Chunk(self.rows.to(device), self.ext.to(device), self.block.to(device))


@dataclass(frozen=True)
class HistorySlots:
    """Where a chunk's rows live in a history that keeps only the rows some chunk (or a peer)
    reads: ``ext_slots`` for its ext rows, and ``write_slots`` for its rows at ``write_pos``
    (positions within the chunk) that others read."""

    ext_slots: Tensor
    write_pos: Tensor
    write_slots: Tensor

    def to(self, device: torch.device | str) -> HistorySlots:
        return HistorySlots(self.ext_slots.to(device), self.write_pos.to(device), self.write_slots.to(device))


def history_slots(
    chunks: list[Chunk], also_read: Tensor, num_local: int
) -> tuple[Tensor, Tensor, list[HistorySlots]]:
    """The local rows a history must keep (every chunk's ext rows and ``also_read``), sorted; the
    slot of every local row in it (-1: not kept); and each chunk's slots. A row no other chunk
    reads needs no history: with METIS chunks most rows are such interior rows, so the history is
    a fraction of the partition."""
    kept = torch.unique(torch.cat([*(c.ext for c in chunks), also_read]))
    slot = torch.full((num_local,), -1, dtype=torch.int64)
    slot[kept] = torch.arange(kept.numel())
    slots = []
    for c in chunks:
        own = slot[c.rows]
        write_pos = (own >= 0).nonzero().flatten()
        slots.append(HistorySlots(slot[c.ext], write_pos, own[write_pos]))
    return kept, slot, slots


def inner_graph(part: LocalPartition) -> CSRGraph:
    """The subgraph the partition's block induces on its inner rows (no self loops)."""
    block = part.block
    dst = block.dst_ids()
    keep = (block.indices < part.num_inner) & (block.indices != dst)
    counts = torch.bincount(dst[keep], minlength=part.num_inner)
    indptr = torch.zeros(part.num_inner + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    return CSRGraph(indptr, block.indices[keep].contiguous(), part.num_inner)


def chunk_of_rows(part: LocalPartition, num_chunks: int, method: str = "metis", seed: int = 0) -> Tensor:
    """Chunk id of every inner row: METIS on the inner subgraph (few edges between chunks, so few
    historical reads), or a random split."""
    if method not in PARTITIONERS:
        raise ValueError(f"unknown chunking {method!r}; expected one of {PARTITIONERS}")
    if not 1 <= num_chunks <= part.num_inner:
        raise ValueError(
            f"cannot cut {part.num_inner} inner nodes of partition {part.rank} into {num_chunks} chunks "
            "(each chunk needs at least one node)"
        )
    if method == "metis":
        import_pymetis()
    partition = metis_partition if method == "metis" else random_partition
    assign = partition(inner_graph(part), num_chunks, seed)
    empty = (torch.bincount(assign, minlength=num_chunks) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"cutting partition {part.rank} ({part.num_inner} inner nodes) into {num_chunks} chunks left "
            f"chunks {empty} empty: use fewer chunks"
        )
    return assign


def chunk_partition(
    part: LocalPartition, num_chunks: int, method: str = "metis", seed: int = 0
) -> list[Chunk]:
    """The chunks of ``part`` (``chunk_of_rows``), each with its block cut from the partition's."""
    assign = chunk_of_rows(part, num_chunks, method, seed)
    block = part.block
    num_local = block.num_src
    position = torch.full((num_local,), -1, dtype=torch.int64)
    chunks = []
    for c in range(num_chunks):
        rows = (assign == c).nonzero().flatten()
        starts, counts = block.indptr[rows], block.indptr[rows + 1] - block.indptr[rows]
        edges = row_positions(starts, counts)
        src = block.indices[edges]
        inside = torch.zeros(num_local, dtype=torch.bool)
        inside[rows] = True
        ext = torch.unique(src[~inside[src]])
        position[rows] = torch.arange(rows.numel())
        position[ext] = rows.numel() + torch.arange(ext.numel())
        indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        chunk_block = Block(
            num_dst=int(rows.numel()),
            num_src=int(rows.numel() + ext.numel()),
            indptr=indptr,
            indices=position[src],
            weights=block.weights[edges],
            dst_in_src=True,
        )
        chunks.append(Chunk(rows, ext, chunk_block))
    return chunks
