"""Graph partitions for full-graph training: which rank owns which node, and what each rank
must receive (halo) from and send to every other rank before a layer can aggregate.

A rank's local node order is ``[inner nodes ; halo from rank 0 ; halo from rank 1 ; ...]``, inner
and each halo block sorted by global id. ``send_idx[p]`` lists the inner positions whose rows rank
``p`` needs, in ``p``'s halo order, so one message per peer and layer carries exactly the rows the
peer expects.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import row_positions
from lightning_mqgnn.sampling.batch import Block
from lightning_mqgnn.sampling.exact import edge_weights

PARTITIONERS = ("metis", "random")


def graph_fingerprint(graph: CSRGraph) -> str:
    """SHA-256 of the graph's structure: a partition book is only valid for the graph it was made for."""
    digest = hashlib.sha256()
    digest.update(str(graph.num_nodes).encode())
    digest.update(graph.indptr.to(torch.int64).contiguous().numpy().tobytes())
    digest.update(graph.indices.to(torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()


def import_pymetis():
    """pymetis, imported on first use: only the metis partitioner needs it."""
    try:
        import pymetis
    except ImportError as err:
        raise ImportError(
            "metis partitioning needs pymetis: pip install 'lightning_mqgnn[fullgraph]' "
            "(or pass partitioner='random')"
        ) from err
    return pymetis


def metis_partition(graph: CSRGraph, num_parts: int, seed: int = 0) -> Tensor:
    """Owner of every node from METIS k-way partitioning (minimal edge cut, balanced parts)."""
    pymetis = import_pymetis()
    if num_parts == 1:
        return torch.zeros(graph.num_nodes, dtype=torch.int64)
    adjacency = pymetis.CSRAdjacency(graph.indptr.numpy(), graph.indices.numpy())
    options = pymetis.Options(seed=seed)
    _, parts = pymetis.part_graph(num_parts, adjacency=adjacency, options=options)
    return torch.as_tensor(parts, dtype=torch.int64)


def random_partition(graph: CSRGraph, num_parts: int, seed: int = 0) -> Tensor:
    """Owner of every node drawn uniformly at random in equal shares. A fallback when pymetis is
    missing: it cuts about ``(P - 1) / P`` of all edges, so halos and messages are far larger."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randperm(graph.num_nodes, generator=gen) % num_parts).to(torch.int64)


@dataclass(frozen=True)
class LocalPartition:
    """One rank's view: its inner nodes, its halo per peer, what it sends to each peer, and the
    local aggregation block (destinations = inner nodes, sources = local order)."""

    rank: int
    num_parts: int
    inner: Tensor  # global ids of the inner nodes, sorted
    halo: list[Tensor]  # halo[p]: global ids owned by p that inner nodes aggregate (empty for p == rank)
    send_idx: list[Tensor]  # send_idx[p]: inner positions whose rows rank p receives, in p's halo order
    block: Block  # num_dst = len(inner), num_src = len(inner) + total halo, dst_in_src

    @property
    def num_inner(self) -> int:
        return int(self.inner.numel())

    @property
    def recv_counts(self) -> list[int]:
        return [int(h.numel()) for h in self.halo]

    @property
    def num_halo(self) -> int:
        return sum(self.recv_counts)

    def local_ids(self) -> Tensor:
        """Global id of every local row: inner first, then each peer's halo block."""
        return torch.cat([self.inner, *self.halo])

    def to(self, device: torch.device | str) -> LocalPartition:
        """The partition with what computation indexes (block, send lists) on ``device``; the
        global ids stay where they are."""
        return replace(self, block=self.block.to(device), send_idx=[i.to(device) for i in self.send_idx])


@dataclass(frozen=True)
class PartitionBook:
    """The owner of every node of one graph (``parts``), with the graph's fingerprint."""

    parts: Tensor  # int64 [N]: owning rank of every node
    num_parts: int
    fingerprint: str
    method: str

    @classmethod
    def build(cls, graph: CSRGraph, num_parts: int, method: str = "metis", seed: int = 0) -> PartitionBook:
        if method not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {method!r}; expected one of {PARTITIONERS}")
        if not 1 <= num_parts <= graph.num_nodes:
            raise ValueError(
                f"cannot split a graph of {graph.num_nodes} nodes into {num_parts} partitions "
                "(one partition per rank, each needs at least one node)"
            )
        partition = metis_partition if method == "metis" else random_partition
        book = cls(partition(graph, num_parts, seed), num_parts, graph_fingerprint(graph), method)
        book.check_nonempty()
        return book

    def check_nonempty(self) -> None:
        sizes = torch.bincount(self.parts, minlength=self.num_parts)
        empty = (sizes == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"partitioning {self.parts.numel()} nodes into {self.num_parts} parts left parts {empty} "
                "empty: use fewer ranks for this graph"
            )

    def check_graph(self, graph: CSRGraph, source: str = "partition book") -> None:
        """Refuse a book made for another graph (different structure)."""
        if self.parts.numel() != graph.num_nodes or self.fingerprint != graph_fingerprint(graph):
            raise ValueError(
                f"{source} was made for another graph (fingerprint {self.fingerprint[:12]}, "
                f"{self.parts.numel()} nodes) than this one ({graph_fingerprint(graph)[:12]}, "
                f"{graph.num_nodes} nodes): rebuild it"
            )

    def save(self, path: str | Path) -> None:
        torch.save(
            {
                "parts": self.parts,
                "num_parts": self.num_parts,
                "fingerprint": self.fingerprint,
                "method": self.method,
            },
            Path(path),
        )

    @classmethod
    def load(cls, path: str | Path, graph: CSRGraph) -> PartitionBook:
        """Load a saved book and check it belongs to ``graph``."""
        state = torch.load(Path(path), weights_only=True)
        missing = {"parts", "num_parts", "fingerprint", "method"} - set(state)
        if missing:
            raise ValueError(f"{path}: not a partition book (missing {sorted(missing)})")
        book = cls(state["parts"], int(state["num_parts"]), str(state["fingerprint"]), str(state["method"]))
        book.check_graph(graph, source=str(path))
        return book

    def edge_cut(self, graph: CSRGraph) -> int:
        """Directed edges whose endpoints have different owners."""
        return int((self.parts[graph.row_ids()] != self.parts[graph.indices]).sum())

    def local(self, graph: CSRGraph, rank: int, aggregation: str) -> LocalPartition:
        """Rank ``rank``'s partition, with exact full-graph edge weights (``aggregation``: 'gcn' or
        'mean', as ``edge_weights``): aggregating the local block over ``[inner ; halo]`` rows gives
        exactly the full graph's rows of the inner nodes."""
        if not 0 <= rank < self.num_parts:
            raise ValueError(f"rank {rank} has no partition: the book has {self.num_parts} parts")
        self.check_graph(graph)
        weights, self_weights = edge_weights(graph, aggregation)
        inner = (self.parts == rank).nonzero().flatten()
        starts, ends = graph.indptr[inner], graph.indptr[inner + 1]
        counts = ends - starts
        edge_pos = row_positions(starts, counts)
        src = graph.indices[edge_pos]
        halo = [
            torch.unique(src[self.parts[src] == p]) if p != rank else torch.empty(0, dtype=torch.int64)
            for p in range(self.num_parts)
        ]
        local_of = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
        local_ids = torch.cat([inner, *halo])
        local_of[local_ids] = torch.arange(local_ids.numel())
        # sending side: what each peer's inner nodes read from my inner nodes, in the peer's halo order
        send_idx = []
        for p in range(self.num_parts):
            if p == rank:
                send_idx.append(torch.empty(0, dtype=torch.int64))
                continue
            peer = (self.parts == p).nonzero().flatten()
            p_src = graph.indices[
                row_positions(graph.indptr[peer], graph.indptr[peer + 1] - graph.indptr[peer])
            ]
            needed = torch.unique(p_src[self.parts[p_src] == rank])
            send_idx.append(local_of[needed])
        # local block: edges plus self loops (gcn), destinations = inner prefix of the sources
        local_dst = torch.repeat_interleave(torch.arange(inner.numel()), counts)
        local_src, w = local_of[src], weights[edge_pos]
        if bool((self_weights != 0).any()):
            local_dst = torch.cat([local_dst, torch.arange(inner.numel())])
            local_src = torch.cat([local_src, torch.arange(inner.numel())])
            w = torch.cat([w, self_weights[inner]])
            order = torch.argsort(local_dst * local_ids.numel() + local_src)
            local_dst, local_src, w = local_dst[order], local_src[order], w[order]
        indptr = torch.zeros(inner.numel() + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(local_dst, minlength=inner.numel()), 0, out=indptr[1:])
        block = Block(
            num_dst=inner.numel(),
            num_src=local_ids.numel(),
            indptr=indptr,
            indices=local_src.contiguous(),
            weights=w.contiguous(),
            dst_in_src=True,
        )
        return LocalPartition(rank, self.num_parts, inner, halo, send_idx, block)
