"""Global Neighbor Sampling (GNS, Dong et al. KDD'21; paper eq. 14-16): a feature cache and the
node-wise sampler that prefers it.

Cache. Every ``period`` epochs ``M = fraction·N`` nodes are drawn *with replacement* from a
distribution ``p`` and de-duplicated (GNS's ``new_sample.py``), so node ``u`` is cached with the
known probability ``π_u = 1 - (1 - p_u)^M``. ``p`` is the in-degree (eq. 14) when most nodes are
training nodes (train fraction >= ``DEGREE_RULE_MIN_TRAIN_FRACTION``), else the mass of short
random walks from the training set (eq. 15-16).

Sampling. Upper layers are ``NeighborSampler``'s. At the input layer a destination ``v`` samples
up to ``k`` of its *cached* neighbours uniformly (``q_v = sampled / cached``); neighbour ``u``
gets the Horvitz-Thompson weight ``P_vu / (π_u q_v)``. Over the cache draw and the sampling,
``E[Σ w_uv h_u] = Σ_u P_vu h_u``: the aggregation is unbiased (GNS's estimator; for a fixed cache it
is not). So the input layer only reads cached features, plus the destinations' own rows. With
``sampling="labor"`` every layer samples as ``LaborSampler`` (the input layer among the cached
neighbours), and the within-cache probability ``π_ts`` of LABOR takes the place of ``q_v``.
``estimator="hajek"`` rescales each row's HT weights to the row's exact mass ``Σ_u P_vu``
(self-normalised: consistent, not unbiased): rarely cached nodes no longer arrive with 1/π_u
weights in the hundreds, which on a generated products-like graph cost GCN half its accuracy.

Pipeline API (the cache lives in shared memory; tensors never change shape):
- build once in the main process: ``cache = GNSCache(graph, train_idx, fraction=0.01, period=1,
  fanouts=[5, 5])``; pass it to ``GNSSampler(graph, fanouts, cache)``; pickling the sampler to
  worker processes shares the cache tensors (``share_memory_`` is done here).
- at every epoch start, *while no worker samples*: ``if cache.refresh_(epoch): device_cache =
  cache.resident_features(features, device)``. ``refresh_`` rewrites ``nodes``, ``slot``,
  ``inclusion``, ``num_cached`` and ``version`` in place and returns whether it redrew.
- gather with ``gather(batch, features, labels, cache_slot=cache.slot)``; the device stage calls
  ``batch.input_features(device_cache)``. ``batch.meta["cache_version"]`` is the epoch of the
  cache a batch was sampled against: it must equal ``int(cache.version)`` of the device copy.
- hit rate: ``HitCounter.add(batch)`` per batch, ``.rate`` per epoch (``cache_hits(batch)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import Relabeler, row_positions
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.exact import AGGREGATIONS, gcn_norm, row_mass
from lightning_mqgnn.sampling.labor import (
    CandidateEdges,
    LaborSampler,
    SourceIndex,
    check_labor_arguments,
    draw_layer_seed,
    labor_sample,
)
from lightning_mqgnn.sampling.neighbor import NeighborSampler, sample_neighbor_edges, sampled_block

DEGREE_RULE_MIN_TRAIN_FRACTION = 0.5  # "most nodes are training nodes" -> eq. 14, else eq. 15-16
CACHE_RULES = ("auto", "degree", "random_walk")
LAYER_SAMPLING = ("neighbor", "labor")


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
    deg = graph.in_degrees().to(torch.float64)
    rows = graph.row_ids()
    mass = torch.zeros(n, dtype=torch.float64)
    mass[train_idx] = 1.0 / train_idx.numel()
    for k in reversed(list(fanouts)):
        take = deg if k < 0 else deg.clamp(max=k)
        d = torch.where(deg > 0, take / deg.clamp(min=1.0), torch.zeros_like(deg))
        step = torch.zeros(n, dtype=torch.float64).index_add_(0, graph.indices, (d * mass)[rows])
        mass = mass + step
    return mass / mass.sum()


def choose_rule(graph: CSRGraph, train_idx: Tensor, rule: str = "auto") -> str:
    if rule not in CACHE_RULES:
        raise ValueError(f"GNS cache: unknown rule {rule!r}; expected one of {CACHE_RULES}")
    if rule != "auto":
        return rule
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
    rule: str = "auto",
    p: Tensor | None = None,
) -> CacheDraw:
    """Draw a cache of ``fraction·N`` draws with replacement (eq. 14 or 15-16, see ``choose_rule``).

    ``p`` (the normalised distribution) may be passed to skip recomputing it each epoch.
    """
    if train_idx.numel() == 0:
        raise ValueError("GNS cache: the training split is empty")
    if p is None:
        p = cache_distribution(graph, train_idx, fanouts, rule)
    m = cache_size(graph.num_nodes, fraction)
    cdf = torch.cumsum(p, 0)
    last = int((p > 0).nonzero()[-1])
    u = torch.rand(m, dtype=torch.float64, generator=generator) * cdf[-1]
    nodes = torch.unique(torch.searchsorted(cdf, u, right=True).clamp_(max=last))
    inclusion = -torch.expm1(m * torch.log1p(-p.clamp(max=1.0)))  # 1 - (1-p)^M, accurate for tiny p
    return CacheDraw(nodes=nodes, inclusion=inclusion, num_draws=m)


def cache_distribution(
    graph: CSRGraph, train_idx: Tensor, fanouts: Sequence[int], rule: str = "auto"
) -> Tensor:
    if choose_rule(graph, train_idx, rule) == "degree":
        return degree_distribution(graph)
    return random_walk_distribution(graph, train_idx, fanouts)


@dataclass
class GNSCache:
    """The cached node set in shared memory, redrawn in place every ``period`` epochs.

    ``nodes`` has a fixed ``capacity = fraction·N`` rows: the first ``num_cached`` are the distinct
    cached ids, the rest repeat ``nodes[0]`` (harmless rows, so ``features[nodes]`` keeps one
    shape). ``slot[v]`` is v's row in ``nodes`` or -1; ``inclusion[v]`` = P(v cached).

    ``edge_indptr``/``edge_pos``: for every node, the CSR positions (in ``graph.indices``) of its
    in-edges from cached nodes, rebuilt with each draw. The sampler then reads only those instead of
    scanning every in-edge of its frontier (power-law frontiers hold millions). ``edge_pos`` has
    a fixed length, the most in-edges any ``capacity`` nodes can be the source of.
    """

    graph: CSRGraph
    train_idx: Tensor
    fraction: float = 0.01
    period: int = 1
    fanouts: Sequence[int] = (5, 5)
    rule: str = "auto"
    seed: int = 0
    nodes: Tensor = field(init=False)
    slot: Tensor = field(init=False)
    inclusion: Tensor = field(init=False)
    num_cached: Tensor = field(init=False)
    version: Tensor = field(init=False)  # epoch of the last draw, -1 before the first
    edge_indptr: Tensor = field(init=False)
    edge_pos: Tensor = field(init=False)

    def __post_init__(self) -> None:
        if self.period < 1:
            raise ValueError(f"GNS cache: period must be >= 1 epoch, got {self.period}")
        self.rule = choose_rule(self.graph, self.train_idx, self.rule)
        self._p = cache_distribution(self.graph, self.train_idx, self.fanouts, self.rule)
        n = self.graph.num_nodes
        self.nodes = torch.zeros(cache_size(n, self.fraction), dtype=torch.int64).share_memory_()
        self.slot = torch.full((n,), -1, dtype=torch.int64).share_memory_()
        self.inclusion = torch.zeros(n, dtype=torch.float64).share_memory_()
        self.num_cached = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.version = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        as_source = torch.bincount(self.graph.indices, minlength=n)  # edges each node is the source of
        bound = int(torch.topk(as_source, min(self.capacity, n)).values.sum())
        self.edge_indptr = torch.zeros(n + 1, dtype=torch.int64).share_memory_()
        self.edge_pos = torch.zeros(bound, dtype=torch.int64).share_memory_()
        self.refresh_(0)

    @property
    def capacity(self) -> int:
        return int(self.nodes.numel())

    def refresh_(self, epoch: int, force: bool = False) -> bool:
        """Redraw in place when ``epoch`` starts a period (or ``force``); True if redrawn.

        Deterministic in ``(seed, epoch)``. Not safe while workers sample: call between epochs.
        """
        if not force and int(self.version) >= 0 and epoch % self.period != 0:
            return False
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        draw = draw_cache(self.graph, self.train_idx, self.fraction, gen, self.fanouts, self.rule, p=self._p)
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
        """Rebuild ``edge_indptr``/``edge_pos`` from ``slot``: one pass over the edges, reading a
        boolean mask (1 byte a node: stays in cache) rather than the int64 slots (4x faster)."""
        g = self.graph
        pos = (self.slot >= 0).index_select(0, g.indices).nonzero().squeeze(1)
        rows = torch.searchsorted(g.indptr, pos, right=True) - 1
        torch.cumsum(torch.bincount(rows, minlength=g.num_nodes), 0, out=self.edge_indptr[1:])
        self.edge_pos[: pos.numel()] = pos

    def resident_features(self, features: Tensor, device: torch.device | str = "cpu") -> Tensor:
        """``features[nodes]`` on ``device``: the rows ``cache_slots`` index into."""
        return features.index_select(0, self.nodes).to(device)


class GNSSampler:
    """Node-wise sampler whose input layer samples among cached neighbours (GNS).

    ``fanouts`` input layer first, as ``NeighborSampler``; ``fanouts[0]`` caps the cached
    neighbours taken per node (-1: all). Blocks keep destinations as a source prefix.
    ``sampling="labor"`` samples every layer with LABOR (``LaborSampler``, ``importance_sampling``
    fixed-point rounds): the upper layers as ``LaborSampler`` does, the input layer among each
    node's cached neighbours (``d_s`` = cached neighbours, one shared variate per cached source),
    so ``π_ts`` replaces ``q_v`` in the Horvitz-Thompson weight ``P_vu / (π_u π_ts)``.
    """

    def __init__(
        self,
        graph: CSRGraph,
        fanouts: Sequence[int],
        cache: GNSCache,
        aggregation: str = "mean",
        replace: bool = False,
        estimator: str = "ht",
        sampling: str = "neighbor",
        importance_sampling: int = 0,
    ):
        if sampling not in LAYER_SAMPLING:
            raise ValueError(f"GNS layer sampling must be one of {LAYER_SAMPLING}, got {sampling!r}")
        if sampling == "labor":
            check_labor_arguments(aggregation, estimator, importance_sampling)
        if estimator not in ("ht", "hajek"):
            raise ValueError(f"GNS estimator must be 'ht' or 'hajek', got {estimator!r}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
        fanouts = [int(f) for f in fanouts]
        if not fanouts or any(f == 0 or f < -1 for f in fanouts):
            raise ValueError(f"fanouts must be positive (or -1 for all), got {fanouts}")
        same = cache.graph is graph or (
            torch.equal(cache.graph.indptr, graph.indptr) and torch.equal(cache.graph.indices, graph.indices)
        )
        if not same:  # the cache's edge index holds CSR positions of its own graph
            raise ValueError(
                f"GNS cache was built on another graph ({cache.graph.num_nodes} nodes, "
                f"{cache.graph.num_edges} edges) than the sampler's ({graph.num_nodes}, {graph.num_edges})"
            )
        self.graph = graph
        self.fanouts = fanouts
        self.cache = cache
        self.aggregation = aggregation
        self.num_layers = len(fanouts)
        self.sampling = sampling
        self.importance_sampling = int(importance_sampling)
        self._upper = None
        if len(fanouts) > 1 and sampling == "labor":
            self._upper = LaborSampler(graph, fanouts[1:], aggregation, importance_sampling, estimator)
        elif len(fanouts) > 1:
            self._upper = NeighborSampler(graph, fanouts[1:], aggregation, replace)
        self._sources = SourceIndex(graph.num_nodes)
        self._norm = gcn_norm(graph)
        self._relabel = Relabeler(graph.num_nodes)
        self.estimator = estimator
        if estimator == "hajek":
            self._row_mass = row_mass(graph, aggregation, self._norm)

    def sample(self, seeds: Tensor) -> MiniBatch:
        seeds = seeds.to(torch.int64)
        version = int(self.cache.version)
        if self._upper is not None:
            upper = self._upper.sample(seeds)
            frontier, blocks = upper.input_nodes, upper.blocks
        else:
            frontier, blocks = seeds, []
        block, inputs = self._cached_layer(frontier)
        return MiniBatch(
            input_nodes=inputs, output_nodes=seeds, blocks=[block, *blocks], meta={"cache_version": version}
        )

    def _cached_layer(self, dst: Tensor) -> tuple[Block, Tensor]:
        g, cache = self.graph, self.cache
        deg = g.indptr[dst + 1] - g.indptr[dst]
        sub = cached_edges(cache, dst)
        cached_count = sub.in_degrees()
        if self.sampling == "labor":
            # LABOR among the cached neighbours: one shared variate per cached source
            cand = CandidateEdges(g.indices[sub.indices], sub.row_ids(), cached_count.to(torch.float64))
            keep, taken = labor_sample(  # taken: P(u taken | u cached)
                cand, self.fanouts[0], self.importance_sampling, self._sources, draw_layer_seed()
            )
            nbrs, rows = cand.src.index_select(0, keep), cand.rows.index_select(0, keep)
            counts = torch.bincount(rows, minlength=dst.numel())
        else:
            counts, pos = sample_neighbor_edges(
                sub, torch.arange(dst.numel()), self.fanouts[0], replace=False
            )
            nbrs = g.indices[sub.indices[pos]]
            rows = torch.repeat_interleave(torch.arange(dst.numel()), counts)
            q = counts.to(torch.float64) / cached_count.clamp(min=1).to(torch.float64)
            taken = q[rows]  # P(u taken | u cached)
        ht = 1.0 / (cache.inclusion[nbrs] * taken)  # Horvitz-Thompson factor
        src_nodes, local = self._relabel(dst, nbrs)
        if self.aggregation == "mean":
            p = 1.0 / deg[rows].to(torch.float64)  # P_vu of the neighbour mean (eq. 17)
        else:
            p = self._norm[dst][rows] * self._norm[nbrs]  # P_vu of eq. 2; the self loop stays exact
        w = p * ht
        if self.estimator == "hajek":
            # rescale each row's weights to the row's exact mass Σ_u P_vu
            total = torch.zeros(dst.numel(), dtype=torch.float64).index_add_(0, rows, w)
            w = w * (self._row_mass[dst][rows] / total[rows])
        self_weights = None if self.aggregation == "mean" else self._norm[dst] ** 2
        return sampled_block(src_nodes.numel(), counts, local, w, self_weights=self_weights), src_nodes


def cached_edges(cache: GNSCache, dst: Tensor) -> CSRGraph:
    """The in-edges of ``dst`` from cached nodes, as a CSR over ``len(dst)`` rows whose
    ``indices`` are CSR positions in ``cache.graph`` (so ``sample_neighbor_edges`` can draw from
    it); each row in CSR order. Reads the cache's edge index: O(cached in-edges of ``dst``)."""
    starts = cache.edge_indptr.index_select(0, dst)
    deg = cache.edge_indptr.index_select(0, dst + 1) - starts
    indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    edge = row_positions(starts, deg)
    return CSRGraph(indptr=indptr, indices=cache.edge_pos.index_select(0, edge), num_nodes=dst.numel())


def cache_hits(batch: MiniBatch) -> tuple[int, int]:
    """``(input rows served by the cache, input rows)`` of a gathered batch."""
    if batch.cache_slots is None:
        return 0, int(batch.input_nodes.numel())
    return int((batch.cache_slots >= 0).sum()), int(batch.cache_slots.numel())


@dataclass
class HitCounter:
    """Cache hit rate over an epoch: fraction of input-layer source rows served by the cache."""

    hits: int = 0
    rows: int = 0

    def add(self, batch: MiniBatch) -> None:
        h, r = cache_hits(batch)
        self.hits += h
        self.rows += r

    @property
    def rate(self) -> float:
        return self.hits / self.rows if self.rows else 0.0

    def reset(self) -> None:
        self.hits = self.rows = 0


def gns_sampler(
    graph: CSRGraph,
    train_idx: Tensor,
    fanouts: Sequence[int],
    aggregation: str = "mean",
    fraction: float = 0.01,
    period: int = 1,
    seed: int = 0,
    estimator: str = "ht",
    sampling: str = "neighbor",
    importance_sampling: int = 0,
) -> GNSSampler:
    """A ``GNSSampler`` with its own cache over ``graph``'s training split, for configs: the
    recipe hands ``sampler.cache`` to the DataModule, which refreshes it and keeps it resident."""
    cache = GNSCache(graph, train_idx, fraction=fraction, period=period, fanouts=tuple(fanouts), seed=seed)
    return GNSSampler(
        graph,
        fanouts,
        cache,
        aggregation=aggregation,
        estimator=estimator,
        sampling=sampling,
        importance_sampling=importance_sampling,
    )
