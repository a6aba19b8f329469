"""Compressed sparse row graph storage: the one graph type every sampler reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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
