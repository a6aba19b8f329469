"""The device feature cache (GNS, Dong et al. KDD'21; paper eq. 14-16): which nodes' feature rows
live on the device, and how a batch's input rows are split between the cache and host memory.

Cache. Every ``period`` epochs ``M = fraction·N`` nodes are drawn *with replacement* from a
distribution ``p`` and de-duplicated (the GNS paper's cache draw), so node ``u`` is cached with the
known probability ``π_u = 1 - (1 - p_u)^M``. ``p`` is the in-degree (eq. 14) when most nodes are
training nodes (train fraction >= ``DEGREE_RULE_MIN_TRAIN_FRACTION``), else the mass of short
random walks from the training set (eq. 15-16). ``GNSSampler`` (``sampling/gns.py``) samples the
input layer among cached nodes.

Life of a cache (it lives in shared memory; its tensors never change shape):
- build once in the main process; pickling it to worker processes shares its tensors.
- at every epoch start, *while no worker samples*: ``cache.refresh_(epoch)`` rewrites ``nodes``,
  ``slot``, ``inclusion``, ``num_cached`` and ``version`` in place; ``resident_rows`` puts
  ``features[nodes]`` on the device.
- the gather stage (``lookup``) gathers only the uncached input rows and records every input
  row's cache slot in ``batch.cache_slots``; the device stage (``merge_cached_rows``) fills in
  the rest from the resident rows, so the model sees full feature rows.
- ``batch.meta["cache_version"]`` is the epoch of the cache a batch was sampled against;
  ``batch.meta["cache_hits"]`` the input rows the cache served (the per-epoch hit rate that
  ``StageTimingCallback`` logs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.graph.mapped_pages import prefetch_rows
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.rng import epoch_seed


@runtime_checkable
class FeatureCache(Protocol):
    """What the loaders need of a device feature cache: ``nodes`` are the cached ids, ``slot[v]``
    the cache row of node v or -1; ``refresh_(epoch)`` redraws both in place (shared memory)."""

    nodes: Tensor
    slot: Tensor

    def refresh_(self, epoch: int) -> bool: ...


def resident_rows(cache: FeatureCache, features: Tensor, device: torch.device | str = "cpu") -> Tensor:
    """``features[cache.nodes]`` on ``device`` (float32 for half-precision features): the rows
    ``batch.cache_slots`` index into. From features on disk, every row's read is asked for first
    (``prefetch_rows``): a cache is a fraction of the nodes, so its rows are as many reads as rows."""
    prefetch_rows(features, cache.nodes)
    return features.index_select(0, cache.nodes).to(device, compute_dtype(features.dtype))


def lookup(batch: MiniBatch, cache_slot: Tensor) -> Tensor:
    """The input nodes whose rows must come from host memory (the uncached ones, in input order).

    Sets ``batch.cache_slots`` (every input row's cache row, or -1) and ``meta["cache_hits"]``.
    """
    slots = cache_slot.index_select(0, batch.input_nodes)
    batch.cache_slots = slots
    batch.meta["cache_hits"] = int((slots >= 0).sum())
    return batch.input_nodes[slots < 0]


def merge_cached_rows(batch: MiniBatch, resident: Tensor) -> MiniBatch:
    """Fill ``batch.features`` with every input row, the cached ones from ``resident`` (in place;
    a batch gathered without a cache is left as it is)."""
    if batch.cache_slots is not None:
        batch.features = batch.input_features(resident)
        batch.cache_slots = None  # the model sees full feature rows and never knows about the cache
    return batch


DEGREE_RULE_MIN_TRAIN_FRACTION = 0.5  # "most nodes are training nodes" -> eq. 14, else eq. 15-16


def degree_distribution(graph: CSRGraph) -> Tensor:
    """eq. 14: ``p_v = deg⁻(v) / Σ deg⁻`` (float64)."""
    deg = graph.in_degrees().to(torch.float64)
    if not bool(deg.sum() > 0):
        raise ValueError(f"GNS cache: graph of {graph.num_nodes} nodes has no edges to weight by degree")
    return deg / deg.sum()


def random_walk_distribution(graph: CSRGraph, train_idx: Tensor, fanouts: Sequence[int]) -> Tensor:
    """eq. 15-16: ``P⁰`` uniform on the training set, then one step per layer, output layer first.

    A node ``v`` reached with mass ``P_v`` samples each in-neighbour ``u`` with probability
    ``d_v = min(k, deg v) / deg v`` (eq. 15), so ``P_u += d_v P_v``: ``P ← (Aᵀ D + I) P``. On the
    paper's symmetric graphs this is eq. 16's ``(D A + I) P`` read as reachability, and GNS's
    ``A (p / deg) + p`` up to the fan-out factor.
    """
    n = graph.num_nodes
    deg = graph.in_degrees()
    deg_f = deg.to(torch.float64)
    mass = torch.zeros(n, dtype=torch.float64)
    mass[train_idx] = 1.0 / train_idx.numel()
    for k in reversed(list(fanouts)):
        take = deg_f if k < 0 else deg_f.clamp(max=k)
        sent = torch.where(deg_f > 0, take / deg_f.clamp(min=1.0), torch.zeros_like(deg_f)) * mass
        step = torch.zeros(n, dtype=torch.float64)
        for chunk in graph.row_chunks():  # per-edge values a chunk at a time: E may not fit
            per_edge = torch.repeat_interleave(sent[chunk.lo : chunk.hi], deg[chunk.lo : chunk.hi])
            step.index_add_(0, chunk.sources, per_edge)
        mass = mass + step
    return mass / mass.sum()


def choose_rule(graph: CSRGraph, train_idx: Tensor) -> str:
    """``"degree"`` (eq. 14) when most nodes are training nodes, else ``"random_walk"`` (eq. 15-16)."""
    frac = train_idx.numel() / max(graph.num_nodes, 1)
    return "degree" if frac >= DEGREE_RULE_MIN_TRAIN_FRACTION else "random_walk"


@dataclass
class CacheDraw:
    """One cache draw: distinct ``nodes`` (sorted) and each node's inclusion probability."""

    nodes: Tensor  # int64 [<= num_draws]
    inclusion: Tensor  # float64 [N]: P(v in cache) = 1 - (1 - p_v)^num_draws
    num_draws: int


def cache_size(num_nodes: int, fraction: float) -> int:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"GNS cache: fraction must be in (0, 1], got {fraction}")
    return max(1, int(fraction * num_nodes))


def draw_cache(
    graph: CSRGraph,
    train_idx: Tensor,
    fraction: float,
    generator: torch.Generator | None = None,
    fanouts: Sequence[int] = (5, 5),
    p: Tensor | None = None,
) -> CacheDraw:
    """Draw a cache of ``fraction·N`` draws with replacement (eq. 14 or 15-16, see ``choose_rule``).

    ``p`` (the normalised distribution) may be passed to skip recomputing it each epoch.
    """
    if train_idx.numel() == 0:
        raise ValueError("GNS cache: the training split is empty")
    if p is None:
        p = cache_distribution(graph, train_idx, fanouts)
    m = cache_size(graph.num_nodes, fraction)
    cdf = torch.cumsum(p, 0)
    last = int((p > 0).nonzero()[-1])
    u = torch.rand(m, dtype=torch.float64, generator=generator) * cdf[-1]
    nodes = torch.unique(torch.searchsorted(cdf, u, right=True).clamp_(max=last))
    inclusion = -torch.expm1(m * torch.log1p(-p.clamp(max=1.0)))  # 1 - (1-p)^M, accurate for tiny p
    return CacheDraw(nodes=nodes, inclusion=inclusion, num_draws=m)


def cache_distribution(graph: CSRGraph, train_idx: Tensor, fanouts: Sequence[int]) -> Tensor:
    if choose_rule(graph, train_idx) == "degree":
        return degree_distribution(graph)
    return random_walk_distribution(graph, train_idx, fanouts)


@dataclass
class GNSCache:
    """The cached node set in shared memory, redrawn in place every ``period`` epochs.

    ``nodes`` has a fixed ``capacity = fraction·N`` rows: the first ``num_cached`` are the distinct
    cached ids, the rest repeat ``nodes[0]`` (harmless rows, so ``features[nodes]`` keeps one
    shape). ``slot[v]`` is v's row in ``nodes`` or -1; ``inclusion[v]`` = P(v cached).

    ``edge_indptr``/``edge_src``: for every node, its cached in-neighbours in CSR order, rebuilt
    with each draw. The sampler then reads only those instead of scanning every in-edge of its
    frontier (power-law frontiers hold millions), and never reads ``graph.indices`` for them (on a
    graph on disk, random reads of the topology file). ``edge_src`` has a fixed length, the most
    in-edges any ``capacity`` nodes can be the source of, and is int32 when the node ids fit: the
    cache's sources are the hubs, so it holds a large share of all edges (31% on a papers100M-shaped
    graph at a 1% cache).
    """

    graph: CSRGraph
    train_idx: Tensor
    fraction: float = 0.01
    period: int = 1
    fanouts: Sequence[int] = (5, 5)
    seed: int = 0
    rule: str = field(init=False)  # "degree" or "random_walk", from the training fraction
    nodes: Tensor = field(init=False)
    slot: Tensor = field(init=False)
    inclusion: Tensor = field(init=False)
    num_cached: Tensor = field(init=False)
    version: Tensor = field(init=False)  # epoch of the last draw, -1 before the first
    edge_indptr: Tensor = field(init=False)
    edge_src: Tensor = field(init=False)

    def __post_init__(self) -> None:
        if self.period < 1:
            raise ValueError(f"GNS cache: period must be >= 1 epoch, got {self.period}")
        self.rule = choose_rule(self.graph, self.train_idx)
        self._p = cache_distribution(self.graph, self.train_idx, self.fanouts)
        n = self.graph.num_nodes
        self.nodes = torch.zeros(cache_size(n, self.fraction), dtype=torch.int64).share_memory_()
        self.slot = torch.full((n,), -1, dtype=torch.int64).share_memory_()
        self.inclusion = torch.zeros(n, dtype=torch.float64).share_memory_()
        self.num_cached = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.version = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        as_source = self.graph.source_counts()
        bound = int(torch.topk(as_source, min(self.capacity, n)).values.sum())
        self.edge_indptr = torch.zeros(n + 1, dtype=torch.int64).share_memory_()
        id_dtype = torch.int32 if n <= torch.iinfo(torch.int32).max else torch.int64
        self.edge_src = torch.zeros(bound, dtype=id_dtype).share_memory_()
        self.refresh_(0)

    @property
    def capacity(self) -> int:
        return int(self.nodes.numel())

    def refresh_(self, epoch: int) -> bool:
        """Redraw in place when ``epoch`` starts a period; True if redrawn.

        Deterministic in ``(seed, epoch)``. Not safe while workers sample: call between epochs.
        """
        if int(self.version) >= 0 and epoch % self.period != 0:
            return False
        gen = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        draw = draw_cache(self.graph, self.train_idx, self.fraction, gen, self.fanouts, p=self._p)
        c = draw.nodes.numel()
        self.slot[self.nodes[: int(self.num_cached)]] = -1
        self.nodes[:c] = draw.nodes
        self.nodes[c:] = draw.nodes[0]
        self.slot[draw.nodes] = torch.arange(c)
        self.inclusion.copy_(draw.inclusion)
        self.num_cached.fill_(c)
        self._index_cached_edges()
        self.version.fill_(epoch)
        return True

    def _index_cached_edges(self) -> None:
        """Rebuild ``edge_indptr``/``edge_src`` from ``slot``: one pass over the edges, a chunk of
        rows at a time (``row_chunks``), reading a boolean mask (1 byte a node: stays in cache)
        rather than the int64 slots (8 bytes a node)."""
        g = self.graph
        cached = self.slot >= 0
        counts = torch.zeros(g.num_nodes, dtype=torch.int64)
        filled = 0
        for chunk in g.row_chunks():
            hit = cached.index_select(0, chunk.sources).nonzero().squeeze(1)
            local_rows = torch.searchsorted(chunk.indptr, hit, right=True) - 1
            counts[chunk.lo : chunk.hi] = torch.bincount(local_rows, minlength=chunk.hi - chunk.lo)
            self.edge_src[filled : filled + hit.numel()] = chunk.sources.index_select(0, hit)
            filled += hit.numel()
        torch.cumsum(counts, 0, out=self.edge_indptr[1:])
