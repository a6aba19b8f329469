"""Edge membership by sorted int64 keys: one ``searchsorted`` answers "is ``u -> v`` an edge?"
for a whole batch of pairs, with no Python loop over edges.

An edge ``u -> v`` has key ``v * N + u``: a ``CSRGraph`` lists its edges in exactly that order
(rows by destination, sources sorted within each row), so a graph's keys need no sort.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph


def pair_keys(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """The key ``dst * N + src`` of each pair ``src -> dst``."""
    return dst.to(torch.int64) * num_nodes + src.to(torch.int64)


def undirected_keys(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """The key of each unordered pair ``{src, dst}``: that of ``min -> max``."""
    return pair_keys(torch.minimum(src, dst), torch.maximum(src, dst), num_nodes)


def graph_keys(graph: CSRGraph) -> Tensor:
    """Sorted keys of every edge of ``graph`` (its CSR order, so no sort)."""
    return pair_keys(graph.indices, graph.row_ids(), graph.num_nodes)


def sorted_keys(keys: Tensor) -> Tensor:
    """``keys`` sorted and without repeats, as ``contains`` reads them."""
    return torch.unique(keys)


def contains(sorted_table: Tensor, keys: Tensor) -> Tensor:
    """Whether each of ``keys`` is in ``sorted_table`` (ascending int64), as a bool tensor."""
    if sorted_table.numel() == 0:
        return torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)
    pos = torch.searchsorted(sorted_table, keys).clamp_(max=sorted_table.numel() - 1)
    return sorted_table.index_select(0, pos.reshape(-1)).reshape(keys.shape) == keys
