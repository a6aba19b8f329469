"""Layer-neighbour sampling (LABOR, Balin & Çatalyürek, NeurIPS 2023), a drop-in for node-wise
sampling with the same fan-out ``k`` that samples far fewer distinct vertices per layer.

Poisson sampling with shared variates. Every candidate source ``t`` of a layer draws one uniform
``r_t``, the same for all destinations ``s`` it feeds; edge ``t -> s`` is kept when
``r_t <= π_ts = min(1, c_s π_t)``. Destinations that share a neighbour share its draw, so a vertex
needed by many rows is either taken for all of them or for none, and the number of distinct
sources drops while every row alone behaves as under node-wise sampling. ``r_t`` comes from a
counter-based hash of ``(layer seed, t)`` (SplitMix64), the layer seed from torch's global
generator: no sort or unique over the candidates is needed to share the draws, and a seeded
process samples the same blocks.

Probabilities (equation numbers of the paper's arXiv version, arXiv:2210.13339).
- LABOR-0: ``π_t = 1``, ``c_s = k / d_s``: ``k`` sampled neighbours per destination in
  expectation, all ``d_s`` of them when ``d_s <= k``.
- LABOR-i: ``i`` rounds of the fixed-point iteration. Each round sets ``π_t <- π_t max_{t->s} c_s``
  (eq. 18: ``π_t`` becomes t's inclusion probability in the layer) and then solves every ``c_s``
  from the variance constraint ``Σ_{t->s} 1 / min(1, c_s π_t) = d_s² / k_s`` (eq. 15, and eq. 22
  with unit edge weights; ``k_s = min(k, d_s)``): each row's estimator keeps node-wise sampling's
  variance while vertices few destinations need get lower probabilities. ``c_s`` is solved
  exactly by water-filling over the probabilities clipped at 1 (``solve_row_scale``, 2-4 passes
  over the edges).
  ``importance_sampling=-1`` (LABOR-*) iterates until the expected number of sampled vertices
  ``Σ_t min(1, π_t)`` falls by less than a fraction ``TOLERANCE`` in a round, at most
  ``MAX_ROUNDS`` rounds: 13-14 rounds per layer on amazon_photo at fan-out 5 and batch 1024,
  where the first 3 rounds already take 97% of the reduction.

Estimator. The Horvitz-Thompson weight of a kept edge is ``P_st / π_ts``, with ``P`` the operator
the block estimates: the neighbour mean ``1/d_s`` (eq. 17 of the MQ-GNN paper, SAGE) or GCN's
``1/sqrt(d̂_s d̂_t)`` (eq. 2; the self loop keeps its exact weight ``1/d̂_s``, as in the node-wise
sampler). ``estimator="ht"`` uses it as is: unbiased, like eq. 3's node-wise estimate.
``estimator="hajek"`` (the paper's variant) rescales each row to the row's exact mass
``Σ_t P_st`` (1 for the mean), i.e. normalises the ``1/π_ts`` weights per destination: consistent,
not unbiased, with far less variance (a row's weights no longer depend on how many of its
candidates were drawn). ``normalization="block"`` (GCN only) normalises the sampled block by its
own degrees as ``NeighborSampler`` does, each entry also carrying its ``1/π_ts`` weight normalised
to mean 1 over its row (1 for LABOR-0), as ``GraphConv(norm="both")`` with LABOR's edge weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import Relabeler, row_positions, sample_top_down
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.exact import AGGREGATIONS, gcn_norm, row_mass
from lightning_mqgnn.sampling.neighbor import NORMALIZATIONS, block_normalization, sampled_block
from lightning_mqgnn.sampling.rng import sampling_generator

ESTIMATORS = ("ht", "hajek")
TOLERANCE = 1e-4
C_ITERATIONS = 100
CLIP_SLACK = 1e-12  # c π_t within this of 1 counts as clipped (c = 1/π_t in floating point)
MAX_ROUNDS = 50

# SplitMix64 constants (Steele, Lea & Flood 2014) as signed int64 0-dim tensors: multiplying by a
# Python int beyond 32 bits takes a slow scalar path (~30x slower per element)
_GOLDEN = torch.tensor(0x9E3779B97F4A7C15 - (1 << 64))
_MIX1 = torch.tensor(0xBF58476D1CE4E5B9 - (1 << 64))
_MIX2 = torch.tensor(0x94D049BB133111EB - (1 << 64))
_LOW = {b: torch.tensor((1 << b) - 1) for b in (53, 34, 37, 33)}  # masks of the low b bits
_SCALE = float(1 << 53)
_UNIT = 1.0 / (1 << 53)


def hash_bits(seed: int, ids: Tensor) -> Tensor:
    """53 random bits per vertex id, the same for every occurrence of an id: SplitMix64 of
    ``seed + id · golden`` (int64 arithmetic wraps), its top 53 bits. In place on two buffers: the
    candidate edges of a layer run into the millions, and a fresh tensor per step costs more than
    the arithmetic."""
    z = ids.to(torch.int64) * _GOLDEN
    z.add_(torch.tensor(seed))
    t = torch.empty_like(z)
    for bits, mix in ((30, _MIX1), (27, _MIX2), (31, None)):
        torch.bitwise_right_shift(z, bits, out=t).bitwise_and_(_LOW[64 - bits])  # logical shift
        z.bitwise_xor_(t)
        if mix is not None:
            z.mul_(mix)
    return torch.bitwise_right_shift(z, 11, out=t).bitwise_and_(_LOW[53])


def shared_uniforms(seed: int, ids: Tensor) -> Tensor:
    """``r_t`` in ``(0, 1]``: ``(hash_bits + 1) / 2^53``."""
    return (hash_bits(seed, ids) + 1).to(torch.float64) * _UNIT


def threshold(prob: Tensor) -> Tensor:
    """``floor(prob 2^53)`` as int64: ``r_t <= prob`` is ``hash_bits < threshold`` (``bits + 1 <=
    prob 2^53``, exact in float64 for ``prob <= 1``), compared without a float copy of the bits."""
    return (prob * _SCALE).floor_().to(torch.int64)


def below(seed: int, ids: Tensor, limit: Tensor) -> Tensor:
    """Positions (ascending) where ``r_t`` of ``ids`` is below its ``threshold`` ``limit``."""
    return torch.nonzero(hash_bits(seed, ids) < limit).squeeze(1)


def draw_layer_seed() -> int:
    """A layer's hash seed, from ``sampling_generator()`` (seeded per batch by every loader)."""
    generator = sampling_generator()
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 1 << 62, (1,), device=device, generator=generator))


@dataclass
class CandidateEdges:
    """Every edge a layer may keep, grouped by destination row: ``src`` the global source id of each
    edge, ``rows`` its row, ``deg`` the candidates per row (float64: ``d_s``)."""

    src: Tensor
    rows: Tensor
    deg: Tensor


class SourceIndex:
    """Numbers the distinct sources of a layer's candidates ``0..U-1`` through an int64 scratch
    array over all nodes (kept at -1 between calls): O(N) once per layer, no sort, so every
    fixed-point round works on U-sized arrays. One per process; the scratch is not pickled."""

    def __init__(self, num_nodes: int):
        self.num_nodes = num_nodes
        self._slot: Tensor | None = None

    def __getstate__(self) -> dict:
        return {"num_nodes": self.num_nodes, "_slot": None}

    def __call__(self, ids: Tensor) -> tuple[int, Tensor]:
        """``(U, local)``: the number of distinct ``ids`` and each entry's number among them."""
        if self._slot is None or self._slot.device != ids.device:
            self._slot = torch.full((self.num_nodes,), -1, dtype=torch.int64, device=ids.device)
        slot = self._slot
        slot.index_fill_(0, ids, 0)
        distinct = torch.nonzero(slot == 0).squeeze(1)
        slot.index_copy_(0, distinct, torch.arange(distinct.numel(), device=ids.device))
        local = slot.index_select(0, ids)
        slot.index_fill_(0, distinct, -1)
        return distinct.numel(), local


def solve_row_scale(cand: CandidateEdges, inv_pi: Tensor, k: Tensor) -> Tensor:
    """``c_s`` with ``Σ_{t->s} 1/min(1, c_s π_t) = d_s² / k_s`` for every row (eq. 15/22, unit
    weights); ``inv_pi`` is ``1/π_t`` per edge.

    Water-filling from below: with ``C`` the edges clipped at 1 (``c π_t >= 1``) the equation is
    ``|C| + Σ_{t∉C} 1/(c π_t) = T``, so ``c = Σ_{t∉C} (1/π_t) / (T - |C|)``. Started at
    ``Σ_t (1/π_t) / T`` (no clipping assumed), every step stays at or below the root and only
    grows ``C``; when no row's ``C`` changes, the ``c`` of every row is exact.
    """
    rows = cand.rows
    target = cand.deg * cand.deg / k.clamp(min=1.0)
    c = row_sums(rows, inv_pi, cand.deg.numel()) / target.clamp(min=1.0)
    clipped = torch.zeros(inv_pi.numel(), dtype=torch.bool, device=inv_pi.device)
    count_prev = None
    for _ in range(C_ITERATIONS):
        # C only grows (ties at c π_t = 1 would otherwise flip with rounding)
        clipped |= c.index_select(0, rows) >= inv_pi * (1.0 - CLIP_SLACK)
        count = row_sums(rows, clipped.to(torch.float64), c.numel())
        if count_prev is not None and torch.equal(count, count_prev):
            break
        free = row_sums(rows, torch.where(clipped, 0.0, inv_pi), c.numel())
        c = torch.where(count < cand.deg, free / (target - count).clamp(min=CLIP_SLACK), c)
        count_prev = count
    return c


def labor_probabilities(
    cand: CandidateEdges, fanout: int, importance_sampling: int, index: SourceIndex
) -> Tensor:
    """``π_ts = min(1, c_s π_t)`` for every candidate edge, after ``importance_sampling`` rounds of
    the fixed-point iteration (0: LABOR-0, -1: until converged, see the module docstring)."""
    if fanout < 0:
        return torch.ones(cand.src.numel(), dtype=torch.float64, device=cand.src.device)
    k = cand.deg.clamp(max=float(fanout))
    c = torch.where(cand.deg > 0, k / cand.deg.clamp(min=1.0), 0.0)  # LABOR-0: k / d_s
    if importance_sampling == 0:
        return c.index_select(0, cand.rows).clamp_(max=1.0)
    num_sources, local = index(cand.src)
    pi = torch.ones(num_sources, dtype=torch.float64, device=cand.src.device)
    rounds = MAX_ROUNDS if importance_sampling < 0 else importance_sampling
    expected_prev = float("inf")
    for _ in range(rounds):
        # eq. 18: π_t <- π_t max_{t->s} c_s, t's inclusion probability in the layer
        pi = pi * torch.zeros_like(pi).scatter_reduce_(0, local, c.index_select(0, cand.rows), "amax")
        c = solve_row_scale(cand, (1.0 / pi).index_select(0, local), k)
        expected = float(pi.clamp(max=1.0).sum())
        if expected >= (1.0 - TOLERANCE) * expected_prev:
            break
        expected_prev = expected
    return (c.index_select(0, cand.rows) * pi.index_select(0, local)).clamp_(max=1.0)


def labor_sample(
    cand: CandidateEdges, fanout: int, importance_sampling: int, index: SourceIndex, seed: int
) -> tuple[Tensor, Tensor]:
    """``(keep, prob)``: positions of the kept candidate edges (ascending, so rows stay grouped),
    kept when ``r_t <= π_ts`` with one ``r_t`` per source vertex, and their ``π_ts``. LABOR-0
    compares each edge with its row's ``min(1, k/d_s)``: no per-edge probability is built."""
    if fanout < 0:
        device = cand.src.device
        return (
            torch.arange(cand.src.numel(), device=device),
            torch.ones(cand.src.numel(), dtype=torch.float64, device=device),
        )
    if importance_sampling == 0:
        p_row = (cand.deg.clamp(max=float(fanout)) / cand.deg.clamp(min=1.0)).clamp_(max=1.0)
        keep = below(seed, cand.src, threshold(p_row).index_select(0, cand.rows))
        return keep, p_row.index_select(0, cand.rows.index_select(0, keep))
    prob = labor_probabilities(cand, fanout, importance_sampling, index)
    keep = below(seed, cand.src, threshold(prob))
    return keep, prob.index_select(0, keep)


def in_edge_candidates(graph: CSRGraph, dst: Tensor) -> tuple[CandidateEdges, Tensor]:
    """All in-edges of ``dst`` as candidates, with their CSR positions."""
    starts = graph.indptr.index_select(0, dst)
    deg = graph.indptr.index_select(0, dst + 1) - starts
    pos = row_positions(starts, deg)
    rows = torch.repeat_interleave(torch.arange(dst.numel(), device=dst.device), deg, output_size=pos.numel())
    return CandidateEdges(graph.indices.index_select(0, pos), rows, deg.to(torch.float64)), pos


def row_sums(rows: Tensor, values: Tensor, num_rows: int) -> Tensor:
    return torch.zeros(num_rows, dtype=values.dtype, device=values.device).index_add_(0, rows, values)


def normalise_rows(weights: Tensor, rows: Tensor, mass: Tensor) -> Tensor:
    """Rescale each row's weights to sum to ``mass`` of the row (the per-destination normalisation
    of the paper's estimator); a row without kept edges stays empty."""
    total = row_sums(rows, weights, mass.numel())
    scale = torch.where(total > 0, mass / total.clamp(min=torch.finfo(torch.float64).tiny), 0.0)
    return weights * scale.index_select(0, rows)


class LaborSampler:
    """LABOR-0 / LABOR-i / LABOR-* with per-layer fan-outs, a drop-in for ``NeighborSampler``.

    ``fanouts`` input layer first (-1 takes every neighbour); ``importance_sampling`` the number of
    fixed-point rounds (0: LABOR-0, -1: LABOR-*, until converged); ``aggregation`` and
    ``normalization`` as in ``NeighborSampler``; ``estimator`` "hajek" (the paper's per-destination
    normalisation) or "ht" (unbiased). Blocks keep destinations as a source prefix.
    """

    def __init__(
        self,
        graph: CSRGraph,
        fanouts: list[int],
        aggregation: str = "mean",
        importance_sampling: int = 0,
        estimator: str = "hajek",
        normalization: str = "graph",
    ):
        check_labor_arguments(aggregation, estimator, importance_sampling)
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")
        if normalization == "block" and aggregation != "gcn":
            raise ValueError(f"normalization='block' is GCN's; aggregation {aggregation!r} has none")
        if not fanouts or any(int(f) == 0 or int(f) < -1 for f in fanouts):
            raise ValueError(f"fanouts must be positive (or -1 for all), got {list(fanouts)}")
        self.graph = graph
        self.fanouts = [int(f) for f in fanouts]
        self.aggregation = aggregation
        self.importance_sampling = int(importance_sampling)
        self.estimator = estimator
        self.normalization = normalization
        self.num_layers = len(self.fanouts)
        self._norm = gcn_norm(graph) if aggregation == "gcn" else None
        exact_mass = estimator == "hajek" and normalization == "graph"
        self._row_mass = row_mass(graph, aggregation, self._norm) if exact_mass else None
        self._relabel = Relabeler(graph.num_nodes)
        self._sources = SourceIndex(graph.num_nodes)

    def sample(self, seeds: Tensor) -> MiniBatch:
        return sample_top_down(seeds, self.fanouts, self._sample_layer)

    def _sample_layer(self, dst: Tensor, fanout: int) -> tuple[Block, Tensor]:
        cand, _ = in_edge_candidates(self.graph, dst)
        keep, prob = labor_sample(cand, fanout, self.importance_sampling, self._sources, draw_layer_seed())
        src, rows = cand.src.index_select(0, keep), cand.rows.index_select(0, keep)
        counts = torch.bincount(rows, minlength=dst.numel())
        src_nodes, local = self._relabel(dst, src)
        if self.normalization == "block":
            inv = 1.0 / prob
            imp = normalise_rows(inv, rows, counts.to(torch.float64))  # mean 1 over each row
            block = sampled_block(
                src_nodes.numel(),
                counts,
                local,
                torch.ones_like(inv),
                self_weights=torch.ones(dst.numel(), device=dst.device),
            )
            w = block_normalization(block).to(torch.float64)
            # the self loop leads each row; the sampled entries follow it in ``local``'s order
            nbr_pos = row_positions(block.indptr[:-1] + 1, counts)
            w[nbr_pos] = w[nbr_pos] * imp
            block.weights = w.to(torch.float32)
            return block, src_nodes
        if self.aggregation == "mean":
            exact = 1.0 / cand.deg.index_select(0, rows)  # P_st of the neighbour mean
            self_weights = None
        else:
            norm = self._norm
            exact = norm.index_select(0, dst).index_select(0, rows) * norm.index_select(0, src)  # eq. 2
            self_weights = norm.index_select(0, dst) ** 2
        w = exact / prob  # Horvitz-Thompson
        if self.estimator == "hajek":
            w = normalise_rows(w, rows, self._row_mass.index_select(0, dst))
        return sampled_block(src_nodes.numel(), counts, local, w, self_weights=self_weights), src_nodes


def check_labor_arguments(aggregation: str, estimator: str, importance_sampling: int) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"LABOR estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if int(importance_sampling) < -1:
        raise ValueError(
            f"importance_sampling is a number of fixed-point rounds (>= 0, or -1 until converged), "
            f"got {importance_sampling}"
        )
