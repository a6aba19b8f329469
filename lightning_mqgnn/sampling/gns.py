"""Global Neighbor Sampling (GNS, Dong et al. KDD'21, arXiv:2106.06150): a sampler whose input
layer prefers the device feature cache (``GNSCache``, ``sampling/feature_cache.py``).

Where it follows the paper. The cache is a fraction of the nodes drawn per period by degree or by
short random walks (eq. 14-16 of the MQ-GNN paper), its rows resident on the device. As in the
paper, only the input layer reads the cache (its rows are the ones gathered and moved; the upper
layers' nodes are computed, not read); the upper layers sample as ``NeighborSampler`` or, with
``sampling="labor"``, as ``LaborSampler``. Two rules for the input layer:

- ``rule="cached_first"`` (the default; the paper's Algorithm 1 as its text states it, "sample
  cached neighbours first, fill up with uncached ones"): a destination ``v`` with ``c_v`` cached of
  its ``d_v`` in-neighbours takes ``k`` of the cached ones when ``c_v >= k``; else all ``c_v`` and
  ``m = min(k - c_v, d_v - c_v)`` of the uncached ones. Weights are importance weights given the
  cache, ``P_vu / P(u sampled | cache)``: the aggregation is unbiased for every row with
  ``c_v < k``, and a row with ``c_v >= k`` estimates the cached neighbours' part of its sum only
  (the stated bias: ``test_gns`` bounds it by that part). No weight exceeds ``P_vu d_v``, the size
  of node-wise sampling's weights.
- ``rule="cached_only"``: the GNS authors' code, which reads cached neighbours only, with the
  Horvitz-Thompson weight ``P_vu / (π_u q_v)`` over the cache draw (``π_u``: u's inclusion
  probability, ``q_v = sampled / cached``). Unbiased over cache draws, but a destination without a
  cached neighbour aggregates nothing, and ``1/π_u`` reaches the hundreds (BENCHMARKS.md, GNS).

Where it departs, and why. The paper draws each row's neighbours independently. Here the uncached
fill draws one variate per uncached source for the whole layer (``hash_bits`` of a layer seed),
and each row takes the ``m`` uncached neighbours with the smallest variates (``bottom_k``): each
row alone is still a uniform sample without replacement, so the weights and the unbiasedness
above are unchanged, but rows that share a neighbour take it together, and fewer distinct rows
cross to the device (the device of LABOR, Balin & Çatalyürek 2023). With ``sampling="labor"``
both parts are LABOR's Poisson draws with shared variates: among the cached neighbours at fan-out
``k`` (``π_ts`` replaces ``q_v``; every cached neighbour is kept when ``c_v < k``), and among the
uncached ones at each row's shortfall ``k - c_v`` (``labor_sample`` with a fan-out per row), with
``importance_sampling`` rounds of LABOR's fixed point in each; weights ``P_vu / π_ts``. The paper
fills each row up to ``k``; ``fill_weight`` ``w`` caps a row's fill at ``ceil((d_v - c_v) / w)``,
at least one: no drawn uncached neighbour stands for more than about ``w`` of them (its weight is
``P_vu (d_v - c_v) / m``), so rows of low degree take one or two while rows whose neighbours are
many keep the full fill. Still unbiased given the cache, with more variance on the capped rows;
the models ship ``w = 10``, which halves node-wise sampling's rows on graphs of low degree where
the full fill moves two thirds of them (BENCHMARKS.md, GNS).

``estimator="hajek"`` rescales each row's weights to the row's exact mass ``Σ_u P_vu``
(self-normalised: consistent, not unbiased); under ``cached_first`` it turns a ``c_v >= k`` row into
a mean over cached neighbours at the row's full mass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.mapped_pages import prefetch_rows
from lightning_mqgnn.sampling.base import Relabeler, row_positions
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.exact import AGGREGATIONS, gcn_norm, row_mass
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.labor import (
    CandidateEdges,
    LaborSampler,
    SourceIndex,
    check_labor_arguments,
    draw_layer_seed,
    hash_bits,
    labor_sample,
)
from lightning_mqgnn.sampling.neighbor import NeighborSampler, sample_neighbor_edges, sampled_block

LAYER_SAMPLING = ("neighbor", "labor")
RULES = ("cached_first", "cached_only")


class GNSSampler:
    """Sampler whose input layer takes cached neighbours first (GNS; module docstring).

    ``fanouts`` input layer first, as ``NeighborSampler``; ``fanouts[0]`` is the input layer's
    fan-out (-1: all). Blocks keep destinations as a source prefix. ``rule``: ``"cached_first"``
    or ``"cached_only"``; ``sampling``: ``"neighbor"`` (node-wise upper layers) or ``"labor"``
    (every layer LABOR, ``importance_sampling`` fixed-point rounds, as ``LaborSampler``); ``fill_weight``:
    under ``cached_first``, one uncached neighbour per ``fill_weight`` of them at most (at least one;
    None: up to the fan-out, as the paper).
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
        rule: str = "cached_first",
        fill_weight: float | None = None,
    ):
        if fill_weight is not None and not fill_weight >= 1:
            raise ValueError(
                f"GNS fill_weight must be at least 1 (or None: fill up to the fan-out), got {fill_weight}"
            )
        if rule not in RULES:
            raise ValueError(f"GNS rule must be one of {RULES}, got {rule!r}")
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
        self.rule = rule
        self.fill_weight = fill_weight
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
        seed = draw_layer_seed()  # the layer's shared variates (LABOR's, and the uncached fill's)
        if self.sampling == "labor":
            # LABOR among the cached neighbours: one shared variate per cached source
            cand = CandidateEdges(sub.indices, cached_count)
            keep, rows, taken = labor_sample(  # taken: P(u taken | u cached)
                cand, self.fanouts[0], self.importance_sampling, self._sources, seed
            )
            nbrs = cand.src.index_select(0, keep)
            counts = torch.bincount(rows, minlength=dst.numel())
        else:
            counts, pos = sample_neighbor_edges(
                sub, torch.arange(dst.numel(), device=dst.device), self.fanouts[0], replace=False
            )
            nbrs = sub.indices.index_select(0, pos)
            rows = torch.repeat_interleave(
                torch.arange(dst.numel(), device=dst.device), counts, output_size=pos.numel()
            )
            q = counts.to(torch.float64) / cached_count.clamp(min=1).to(torch.float64)
            taken = q[rows]  # P(u taken | u cached)
        if self.rule == "cached_only":
            inv = 1.0 / (cache.inclusion[nbrs] * taken)  # Horvitz-Thompson over cache draw and sample
        else:
            short, uncached, need = uncached_candidates(
                g, cache.slot, dst, deg, cached_count, self.fanouts[0], self.fill_weight
            )
            if self.sampling == "labor":
                keep, fill_rows, fill_taken = labor_sample(
                    uncached, need, self.importance_sampling, self._sources, seed
                )
            else:
                keep, fill_rows, fill_taken = bottom_k(uncached, need, seed)
            rows, order = torch.sort(torch.cat([rows, short[fill_rows]]), stable=True)
            nbrs = torch.cat([nbrs, uncached.src[keep]])[order]
            inv = (1.0 / torch.cat([taken, fill_taken]))[order]  # importance weight given the cache
            counts = torch.bincount(rows, minlength=dst.numel())
        src_nodes, local = self._relabel(dst, nbrs)
        if self.aggregation == "mean":
            p = 1.0 / deg[rows].to(torch.float64)  # P_vu of the neighbour mean (eq. 17)
        else:
            p = self._norm[dst][rows] * self._norm[nbrs]  # P_vu of eq. 2; the self loop stays exact
        w = p * inv
        if self.estimator == "hajek":
            # rescale each row's weights to the row's exact mass Σ_u P_vu
            total = torch.zeros(dst.numel(), dtype=torch.float64, device=dst.device).index_add_(0, rows, w)
            w = w * (self._row_mass[dst][rows] / total[rows])
        self_weights = None if self.aggregation == "mean" else self._norm[dst] ** 2
        return sampled_block(src_nodes.numel(), counts, local, w, self_weights=self_weights), src_nodes


def cached_edges(cache: GNSCache, dst: Tensor) -> CSRGraph:
    """The in-edges of ``dst`` from cached nodes, as a CSR over ``len(dst)`` rows whose
    ``indices`` are the cached sources (int64), each row in CSR order. Reads the cache's edge
    index only: O(cached in-edges of ``dst``)."""
    starts = cache.edge_indptr.index_select(0, dst)
    deg = cache.edge_indptr.index_select(0, dst + 1) - starts
    indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(deg, 0, out=indptr[1:])
    sources = cache.edge_src.index_select(0, row_positions(starts, deg)).to(torch.int64)
    return CSRGraph(indptr=indptr, indices=sources, num_nodes=dst.numel())


def uncached_candidates(
    graph: CSRGraph,
    slot: Tensor,
    dst: Tensor,
    deg: Tensor,
    cached_count: Tensor,
    fanout: int,
    fill_weight: float | None = None,
) -> tuple[Tensor, CandidateEdges, Tensor]:
    """What fills each destination's sample up to ``fanout`` (-1: all) when fewer of its
    neighbours are cached: ``(short, candidates, need)``, the destinations (positions in ``dst``)
    with uncached neighbours and a shortfall, their uncached neighbours grouped by row, and each
    row's fill (int64): its shortfall ``fanout - c_v``, or with ``fill_weight`` ``w`` at most
    ``ceil((d_v - c_v) / w)`` (at least one). Reads the whole rows of these destinations only."""
    need = deg - cached_count if fanout < 0 else (fanout - cached_count).clamp(min=0)
    if fill_weight is not None:
        stands_for = torch.ceil((deg - cached_count).to(torch.float64) / fill_weight).to(torch.int64)
        need = torch.minimum(need, stands_for.clamp(min=1))
    short = torch.nonzero((need > 0) & (deg > cached_count)).reshape(-1)
    starts = graph.indptr.index_select(0, dst.index_select(0, short))
    row_deg = deg.index_select(0, short)
    prefetch_rows(graph.indices, starts, row_deg)  # a graph on disk: these rows' reads together
    nbrs = graph.indices.index_select(0, row_positions(starts, row_deg))
    rows = torch.repeat_interleave(torch.arange(short.numel(), device=dst.device), row_deg)
    uncached = slot.index_select(0, nbrs) < 0
    available = torch.bincount(rows[uncached], minlength=short.numel())
    return short, CandidateEdges(nbrs[uncached], available), need.index_select(0, short)


def bottom_k(cand: CandidateEdges, need: Tensor, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """``m_s = min(need_s, d_s)`` candidates of each row, uniform without replacement: the ``m_s``
    with the smallest shared variates ``r_t`` (``hash_bits``, one per source for the whole
    layer). Each row alone is a uniform sample; rows that share a neighbour take it together or
    not at all, so fewer distinct sources are drawn than with independent draws per row (LABOR's
    device, with a fixed sample size). Returns ``(keep, rows, taken)``: candidate positions, their
    rows, and ``P(u taken) = m_s / d_s``."""
    rows = cand.rows
    r_bits = hash_bits(seed, cand.src).to(torch.int64) + (1 << 31)  # r_t's order, as unsigned ints
    order = torch.argsort(rows * (1 << 32) + r_bits)  # by row, then by r_t: no ties (distinct sources)
    rank = torch.arange(rows.numel(), device=rows.device) - (cand.ends - cand.counts).index_select(0, rows)
    m = torch.minimum(need, cand.counts)
    keep = order[rank < m.index_select(0, rows)]  # ranks are positional: rows stay grouped in `order`
    rows = rows.index_select(0, keep)
    taken = (m.to(torch.float64) / cand.deg.clamp(min=1.0)).index_select(0, rows)
    return keep, rows, taken


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
    rule: str = "cached_first",
    fill_weight: float | None = None,
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
        rule=rule,
        fill_weight=fill_weight,
    )
