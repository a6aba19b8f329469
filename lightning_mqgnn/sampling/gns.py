"""Global Neighbor Sampling (GNS, Dong et al. KDD'21): the node-wise sampler that prefers the
device feature cache (``GNSCache``, ``sampling/feature_cache.py``).

Upper layers are ``NeighborSampler``'s. At the input layer a destination ``v`` samples up to ``k``
of its *cached* neighbours uniformly (``q_v = sampled / cached``); neighbour ``u`` gets the
Horvitz-Thompson weight ``P_vu / (π_u q_v)``. Over the cache draw and the sampling,
``E[Σ w_uv h_u] = Σ_u P_vu h_u``: the aggregation is unbiased (GNS's estimator; for a fixed cache it
is not). So the input layer only reads cached features, plus the destinations' own rows. With
``sampling="labor"`` every layer samples as ``LaborSampler`` (the input layer among the cached
neighbours), and the within-cache probability ``π_ts`` of LABOR takes the place of ``q_v``.
``estimator="hajek"`` rescales each row's HT weights to the row's exact mass ``Σ_u P_vu``
(self-normalised: consistent, not unbiased): rarely cached nodes no longer arrive with 1/π_u
weights in the hundreds, which on a generated products-like graph cost GCN half its accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
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
    labor_sample,
)
from lightning_mqgnn.sampling.neighbor import NeighborSampler, sample_neighbor_edges, sampled_block

LAYER_SAMPLING = ("neighbor", "labor")


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
            cand = CandidateEdges(g.indices[sub.indices], cached_count)
            keep, rows, taken = labor_sample(  # taken: P(u taken | u cached)
                cand, self.fanouts[0], self.importance_sampling, self._sources, draw_layer_seed()
            )
            nbrs = cand.src.index_select(0, keep)
            counts = torch.bincount(rows, minlength=dst.numel())
        else:
            counts, pos = sample_neighbor_edges(
                sub, torch.arange(dst.numel(), device=dst.device), self.fanouts[0], replace=False
            )
            nbrs = g.indices[sub.indices[pos]]
            rows = torch.repeat_interleave(
                torch.arange(dst.numel(), device=dst.device), counts, output_size=pos.numel()
            )
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
            total = torch.zeros(dst.numel(), dtype=torch.float64, device=dst.device).index_add_(0, rows, w)
            w = w * (self._row_mass[dst][rows] / total[rows])
        self_weights = None if self.aggregation == "mean" else self._norm[dst] ** 2
        return sampled_block(src_nodes.numel(), counts, local, w, self_weights=self_weights), src_nodes


def cached_edges(cache: GNSCache, dst: Tensor) -> CSRGraph:
    """The in-edges of ``dst`` from cached nodes, as a CSR over ``len(dst)`` rows whose
    ``indices`` are CSR positions in ``cache.graph`` (so ``sample_neighbor_edges`` can draw from
    it); each row in CSR order. Reads the cache's edge index: O(cached in-edges of ``dst``)."""
    starts = cache.edge_indptr.index_select(0, dst)
    deg = cache.edge_indptr.index_select(0, dst + 1) - starts
    indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(deg, 0, out=indptr[1:])
    edge = row_positions(starts, deg)
    return CSRGraph(indptr=indptr, indices=cache.edge_pos.index_select(0, edge), num_nodes=dst.numel())


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
