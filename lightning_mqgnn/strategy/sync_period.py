"""Model-synchronisation period of RaCoM (paper eq. 23) and the DataModule contract that feeds it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Scale factor k of eq. 23. The paper fixes k = 1, which gives P = 1 on every real graph
# (sqrt(|V| / (|G| |E|)) = 1 / sqrt(|G| * mean degree) < 1), i.e. a blocking parameter all-reduce after
# every step, which would undo what the gradient queue hides. In MQGNNStrategy every rank applies the
# same fully averaged gradient (eq. 21), so parameters only drift through rank-local buffers and float
# non-determinism; the sync is a consistency guard whose blocking cost must be amortised. With k = 100,
# P = ceil(100 / sqrt(|G| * mean degree)): on 2 ranks cora 36, arxiv 20, amazon_photo 13, products 10,
# tolokers 8, Reddit 4 -- a sync (params + Adam moments = 3 gradient-sized all-reduces) then costs at most
# ~3/P of one blocking all-reduce per step on the sparse graphs where staleness hurts least.
DEFAULT_SYNC_SCALE = 100.0

# Used when neither ``sync_period`` is given nor the DataModule describes a graph (non-GNN modules).
FALLBACK_SYNC_PERIOD = 50


@dataclass(frozen=True)
class GraphSize:
    """Node and edge counts of the training graph (edges as stored: CSR entries)."""

    num_nodes: int
    num_edges: int


def sync_period(num_nodes: int, num_edges: int, world_size: int, k: float = DEFAULT_SYNC_SCALE) -> int:
    """P = ceil(k * sqrt(|V|) / sqrt(|G| * |E|)) (eq. 23, with the scale factor k; paper: k = 1)."""
    for field, value in (("num_nodes", num_nodes), ("num_edges", num_edges), ("world_size", world_size)):
        if int(value) != value or value < 1:
            raise ValueError(f"sync_period: {field} must be a positive integer, got {value!r}")
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"sync_period: scale factor k must be positive and finite, got {k!r}")
    return max(1, math.ceil(k * math.sqrt(num_nodes) / math.sqrt(world_size * num_edges)))


def graph_size_from_datamodule(datamodule: Any) -> GraphSize | None:
    """Read the graph size a DataModule offers, or None.

    Contract (first match wins):
      1. ``datamodule.graph_stats()`` returning ``(num_nodes, num_edges)`` or a mapping with those keys;
      2. ``datamodule.graph`` with ``num_nodes`` and ``num_edges`` attributes (e.g. ``CSRGraph``);
      3. ``datamodule.num_nodes`` and ``datamodule.num_edges`` attributes.
    """
    if datamodule is None:
        return None
    stats = getattr(datamodule, "graph_stats", None)
    if callable(stats):
        value = stats()
        if isinstance(value, Mapping) and "num_nodes" in value and "num_edges" in value:
            return GraphSize(int(value["num_nodes"]), int(value["num_edges"]))
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return GraphSize(int(value[0]), int(value[1]))
        raise ValueError(
            f"{type(datamodule).__name__}.graph_stats() must return (num_nodes, num_edges) or a mapping with "
            f"'num_nodes' and 'num_edges', got {value!r}"
        )
    for holder in (getattr(datamodule, "graph", None), datamodule):
        if holder is not None and hasattr(holder, "num_nodes") and hasattr(holder, "num_edges"):
            return GraphSize(int(holder.num_nodes), int(holder.num_edges))
    return None
