"""The host tier of features read from disk: the rows most batches read, held in memory.

Features on disk (``data=ondisk``) are read through a mapping, and the page cache keeps what was
read in pages of 4 KiB. A row is a fraction of a page (128 float32 features: 512 bytes), and a
batch reads rows at random, so every hot row the page cache keeps drags the cold rows of its
page with it: the page cache holds a few hot rows per page it spends. ``HostRowCache`` holds
rows, not pages: a budget of ``budget_gb`` holds that many GB of chosen rows, in shared memory
(the sampler workers read it without a copy), drawn once before training. The gather stage
(``TieredFeatures``) takes each row it needs from the host tier when it is there and from the
disk otherwise; the values are the same, so training is the same batch for batch.

Which rows (``policy``), each the expected count of a node among a batch's input rows:

- ``"degree"``: how many in-edges the node is the source of (``CSRGraph.source_counts``), which
  a sampler that reads every in-edge of its frontier meets in proportion to.
- ``"walk"``: the mass of short walks from the training set down the sampler's fan-outs (eq.
  15-16 of the MQ-GNN paper, the GNS cache's distribution, ``random_walk_distribution``): it
  also counts how near the training nodes a node lies.

Both are static: the rows are chosen once, and a batch never writes the tier, so the workers
share it with no locking. Each batch draws fresh seeds, so a row's chance of being read is fixed,
and holding the rows most likely read beats replacing by recency: replayed on the recipe's
batches, ``walk`` holds 1.35x-2.9x the rows LRU or CLOCK would (``recipes/bench.py host_policy``;
BENCHMARKS.md also measures the policies against the page cache alone). A row that the device
cache (GNS) serves never reaches this tier.

One tier per machine: it lies in memory that any process of the machine can map
(``pipeline/machine_memory.py``), so a sampler worker, however started, maps it instead of
copying it, and the ranks of one machine share the one their local rank 0 filled
(``shared_host_row_cache``) instead of each reading the features file for its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.mapped_pages import MappedArray, mapped_source, opened, prefetch_rows, read_rows
from lightning_mqgnn.pipeline.machine_memory import (
    MachineTensor,
    MachineTensorHandle,
    machine_tensor,
    open_machine_tensor,
)
from lightning_mqgnn.sampling.feature_cache import random_walk_distribution

POLICIES = ("degree", "walk")
READ_ROWS = 1 << 16  # rows per read while the tier is filled: the file is read in order, once

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostRowCacheHandle:
    """Where a host tier lies in the machine's memory: what another process needs to map it."""

    nodes: MachineTensorHandle
    rows: MachineTensorHandle
    policy: str
    filled_by: int  # the pid of the process that read the rows from the features


@dataclass
class HostRowCache:
    """The host tier: ``rows[i]`` is the feature row of node ``nodes[i]`` (ids ascending), both in
    memory any process of this machine maps (pickled, it travels as its ``handle``)."""

    node_memory: MachineTensor  # int64 [M], sorted
    row_memory: MachineTensor  # [M, F], the features' dtype
    policy: str
    filled_by: int  # the pid of the process that read the rows from the features

    @property
    def nodes(self) -> Tensor:
        return self.node_memory.tensor

    @property
    def rows(self) -> Tensor:
        return self.row_memory.tensor

    @property
    def handle(self) -> HostRowCacheHandle:
        return HostRowCacheHandle(
            self.node_memory.handle, self.row_memory.handle, self.policy, self.filled_by
        )

    def __reduce__(self):
        return open_host_row_cache, (self.handle,)

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def positions(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(hit, pos)``: which ``ids`` the tier holds, and their rows in it (where ``hit``). A
        binary search in ``nodes``: no table over all nodes."""
        pos = torch.searchsorted(self.nodes, ids).clamp_(max=max(self.nodes.numel() - 1, 0))
        return self.nodes.index_select(0, pos) == ids, pos


def check_policy(policy: str) -> None:
    """ValueError for a policy that is not one of ``POLICIES``."""
    if policy not in POLICIES:
        raise ValueError(f"host cache policy must be one of {POLICIES}, got {policy!r}")


def sampler_fanouts(sampler) -> list[int]:
    """The fan-outs the walk policy follows for ``sampler`` (input layer first): its own, or every
    neighbour in each of its layers for a sampler without fan-outs."""
    return getattr(sampler, "fanouts", None) or [-1] * sampler.num_layers


def host_tier_capacity(dataset: GraphDataset, budget_gb: float, policy: str) -> int:
    """How many of ``dataset``'s feature rows ``budget_gb`` GB hold; ValueError for a policy that is
    not one of ``POLICIES`` or a budget that holds no row."""
    check_policy(policy)
    if not budget_gb > 0:
        raise ValueError(f"host cache budget must be a positive number of GB, got {budget_gb}")
    features = dataset.features
    if features.shape[1] == 0:
        raise ValueError(
            f"{dataset.name} has no features: a host cache of feature rows has nothing to hold "
            f"(host_cache_gb={budget_gb})"
        )
    row_bytes = features[0].numel() * features.element_size()
    capacity = min(dataset.graph.num_nodes, int(budget_gb * 1e9) // row_bytes)
    if capacity == 0:
        raise ValueError(f"host cache budget {budget_gb} GB holds no row of {row_bytes} bytes")
    return capacity


def host_tier_scores(dataset: GraphDataset, policy: str, fanouts: list[int] | None = None) -> Tensor:
    """How ``policy`` ranks ``dataset``'s nodes for the tier (module docstring): float64 [N], the
    higher the sooner held. ``fanouts`` (input layer first) weight the walk policy's steps as the
    sampler draws; None: every neighbour."""
    check_policy(policy)
    if policy == "degree":
        return dataset.graph.source_counts().to(torch.float64)
    layers = fanouts if fanouts is not None else [-1, -1]
    return random_walk_distribution(dataset.graph, dataset.train_idx, layers)


def host_row_cache(
    dataset: GraphDataset, budget_gb: float, policy: str = "walk", fanouts: list[int] | None = None
) -> HostRowCache:
    """The ``budget_gb`` GB of ``dataset``'s feature rows that ``policy`` ranks first (module
    docstring), read from its features in one pass in row order, which leaves none of its pages in
    the page cache where the file is read at random (``read_rows(keep_cached=False)``). ``fanouts``
    as ``host_tier_scores`` takes them."""
    capacity = host_tier_capacity(dataset, budget_gb, policy)
    graph, features = dataset.graph, dataset.features
    score = host_tier_scores(dataset, policy, fanouts)
    node_memory = machine_tensor((capacity,), torch.int64, "host-tier-nodes")
    nodes = node_memory.tensor
    torch.sort(torch.topk(score, capacity, sorted=False).indices, out=(nodes, torch.empty_like(nodes)))
    row_memory = machine_tensor((capacity, *features.shape[1:]), features.dtype, "host-tier-rows")
    rows = row_memory.tensor
    bounds = torch.searchsorted(nodes, torch.arange(0, graph.num_nodes + READ_ROWS, READ_ROWS))
    for i, start in enumerate(range(0, graph.num_nodes, READ_ROWS)):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if hi > lo:
            # the batches read the other rows of these pages from the disk, if at all: the pass
            # leaves the page cache to the pages they read
            block = read_rows(features, start, min(start + READ_ROWS, graph.num_nodes), keep_cached=False)
            torch.index_select(block, 0, nodes[lo:hi] - start, out=rows[lo:hi])
    return HostRowCache(node_memory, row_memory, policy, os.getpid())


def open_host_row_cache(handle: HostRowCacheHandle) -> HostRowCache:
    """The host tier ``handle`` names, mapped in this process."""
    nodes, rows = open_machine_tensor(handle.nodes), open_machine_tensor(handle.rows)
    return HostRowCache(nodes, rows, handle.policy, handle.filled_by)


def shared_host_row_cache(build: Callable[[], HostRowCache], local_rank: int, node_rank: int) -> HostRowCache:
    """One host tier per machine for the ranks of the default process group: local rank 0 calls
    ``build``, every rank learns the handles (``all_gather_object``), and the others map their
    machine's. A collective: every rank calls it. If local rank 0 fails, every rank of its machine
    raises (none waits for a tier that will not come); a rank that may not open the tier's memory
    (another user's process, a hardened ``/proc``) builds its own, with a warning."""
    tier, failure = None, None
    if local_rank == 0:
        try:
            tier = build()
        except Exception as err:  # re-raised below, once the other ranks know
            failure = err
    entry = (node_rank, tier.handle if tier is not None else None, None if failure is None else repr(failure))
    entries: list = [None] * dist.get_world_size()
    dist.all_gather_object(entries, entry)
    if failure is not None:
        raise failure
    if tier is not None:
        return tier
    same_node = [(handle, error) for node, handle, error in entries if node == node_rank]
    error = next((error for _, error in same_node if error is not None), None)
    if error is not None:
        raise RuntimeError(f"host tier: local rank 0 of node {node_rank} failed to build it: {error}")
    handle = next((handle for handle, _ in same_node if handle is not None), None)
    if handle is None:
        raise RuntimeError(f"host tier: node {node_rank} has no local rank 0 to build it")
    try:
        return open_host_row_cache(handle)
    except OSError as err:
        log.warning("host tier: cannot map local rank 0's (%s); this rank builds its own", err)
        return build()


@dataclass
class TieredFeatures:
    """A feature matrix read through two tiers: ``host`` first, ``disk`` (the mapped features,
    or where they lie, ``MappedArray``, on the way to a worker) for the rest."""

    host: HostRowCache
    disk: Tensor | MappedArray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.disk.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.host.rows.dtype

    def for_workers(self) -> TieredFeatures:
        """What goes to a sampler worker: the disk part as its file where it is mapped."""
        return replace(self, disk=mapped_source(self.disk) or self.disk)

    def opened(self) -> TieredFeatures:
        """In a worker: the disk part mapped here."""
        return replace(self, disk=opened(self.disk))

    def read(self, ids: Tensor, out: Tensor | None = None) -> Tensor:
        """``features[ids]``: the rows the host tier holds from it, the others from the disk
        (their reads asked for together, ``prefetch_rows``)."""
        hit, pos = self.host.positions(ids)
        out = torch.empty((ids.numel(), *self.shape[1:]), dtype=self.dtype) if out is None else out
        miss = torch.nonzero(~hit).squeeze(1)
        missing = ids.index_select(0, miss)
        prefetch_rows(self.disk, missing)
        found = torch.nonzero(hit).squeeze(1)
        out.index_copy_(0, found, self.host.rows.index_select(0, pos.index_select(0, found)))
        out.index_copy_(0, miss, self.disk.index_select(0, missing))
        return out

    def hits(self, ids: Tensor) -> int:
        """How many of ``ids`` the host tier holds."""
        return int(self.host.positions(ids)[0].sum())


def worker_features(features: Tensor | TieredFeatures) -> Tensor | MappedArray | TieredFeatures:
    """``features`` as sent to a sampler worker: mapped arrays as their files (``MappedArray``)."""
    if isinstance(features, TieredFeatures):
        return features.for_workers()
    return mapped_source(features) or features


def opened_features(features: Tensor | MappedArray | TieredFeatures) -> Tensor | TieredFeatures:
    """In a worker: what ``worker_features`` sent, mapped here."""
    return features.opened() if isinstance(features, TieredFeatures) else opened(features)
