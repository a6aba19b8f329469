"""Layer-neighbour sampling (LABOR, Balin & Çatalyürek, NeurIPS 2023), a drop-in for node-wise
sampling with the same fan-out ``k`` that samples far fewer distinct vertices per layer.

Poisson sampling with shared variates. Every candidate source ``t`` of a layer draws one uniform
``r_t``, the same for all destinations ``s`` it feeds; edge ``t -> s`` is kept when
``r_t <= π_ts = min(1, c_s π_t)``. Destinations that share a neighbour share its draw, so a vertex
needed by many rows is either taken for all of them or for none, and the number of distinct
sources drops while every row alone behaves as under node-wise sampling. ``r_t`` comes from a
counter-based hash of ``(layer seed, t)`` (MurmurHash3's 32-bit finaliser), the layer seed from
torch's global generator: no sort or unique over the candidates is needed to share the draws,
and a seeded process samples the same blocks. On the CPU a layer runs as compiled loops
(``cpu_kernels``: LABOR-0's kept edges in one pass, LABOR-*'s fixed point row by row); the
vectorised functions here are the GPU's form, and the tests' reference for the loops.

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
  ``MAX_ROUNDS`` rounds; the first few rounds take most of the reduction, the rest refine it.

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
from functools import cached_property

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.base import NodeScratch, Relabeler, Workspace, row_positions, sample_top_down
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.cpu_kernels import importance_probabilities, labor0_kept
from lightning_mqgnn.sampling.exact import AGGREGATIONS, gcn_norm, row_mass
from lightning_mqgnn.sampling.neighbor import NORMALIZATIONS, block_normalization, sampled_block
from lightning_mqgnn.sampling.rng import sampling_generator

ESTIMATORS = ("ht", "hajek")
TOLERANCE = 1e-4
C_ITERATIONS = 100
CLIP_SLACK = 1e-12  # c π_t within this of 1 counts as clipped (c = 1/π_t in floating point)
MAX_ROUNDS = 50
SEARCH_PER_ROW_ID = 24  # a binary search for one row costs about as much as writing this many row ids

# MurmurHash3's 32-bit finaliser (fmix32) and Knuth's multiplicative constant, as signed int32
# 0-dim tensors: int32 products wrap modulo 2^32 and vectorise natively, where int64 products do not
_GOLDEN = torch.tensor(0x9E3779B1 - (1 << 32), dtype=torch.int32)
_MIX = (
    (16, torch.tensor(0x85EBCA6B - (1 << 32), dtype=torch.int32)),
    (13, torch.tensor(0xC2B2AE35 - (1 << 32), dtype=torch.int32)),
    (16, None),
)
_LOW = {b: torch.tensor((1 << b) - 1, dtype=torch.int32) for b in (16, 19)}  # masks of the low b bits
_BITS = 32
_HALF = 1 << 31


def hash_bits(seed: int, ids: Tensor, workspace: Workspace | None = None) -> Tensor:
    """32 random bits per vertex id as int32, the same for every occurrence of an id: fmix32 of
    ``id · golden + seed + 2^31`` (mod 2^32; the 2^31 brings the seed into int32's range). Distinct
    ids below 2^32 get distinct hashes (both steps are bijections). In place on two buffers (a
    ``workspace``'s when given): the candidate edges of a layer run into the millions, and a fresh
    tensor per step costs more than the arithmetic."""
    if workspace is None:
        z = ids.to(torch.int32)
        t = torch.empty_like(z)
    else:
        z = workspace.take("hash", ids.numel(), torch.int32, ids.device).copy_(ids)
        t = workspace.take("hash_shift", ids.numel(), torch.int32, ids.device)
    z.mul_(_GOLDEN).add_(torch.tensor((seed & 0xFFFFFFFF) - _HALF, dtype=torch.int32))
    for bits, mix in _MIX:
        torch.bitwise_right_shift(z, bits, out=t).bitwise_and_(_LOW[_BITS - bits])  # logical shift
        z.bitwise_xor_(t)
        if mix is not None:
            z.mul_(mix)
    return z


def shared_uniforms(seed: int, ids: Tensor) -> Tensor:
    """``r_t`` in ``(0, 1]``: ``(b + 1) / 2^32`` with ``b`` the hash bits read as unsigned."""
    return (hash_bits(seed, ids).to(torch.float64) + (_HALF + 1)) / float(1 << _BITS)


def threshold(prob: Tensor) -> Tensor:
    """The int32 ``l`` with ``r_t <= prob`` exactly when ``hash_bits <= l``: ``b + 1 <= prob 2^32``
    is ``b <= floor(prob 2^32) - 1``, shifted to signed. ``prob`` is thereby rounded down to a
    multiple of 2^-32 (an edge below 2^-32 keeps that chance instead of none)."""
    limit = (prob * float(1 << _BITS)).floor_().sub_(_HALF + 1)
    return limit.clamp_(min=-_HALF).to(torch.int32)


def below(seed: int, ids: Tensor, limit: Tensor, workspace: Workspace | None = None) -> Tensor:
    """Positions (ascending) where ``r_t`` of ``ids`` is at most the probability whose
    ``threshold`` is ``limit``."""
    bits = hash_bits(seed, ids, workspace)
    if workspace is None:
        return torch.nonzero(bits <= limit).squeeze(1)
    kept = workspace.take("kept", ids.numel(), torch.bool, ids.device)
    return torch.nonzero(torch.le(bits, limit, out=kept)).squeeze(1)


def draw_layer_seed() -> int:
    """A layer's hash seed, from ``sampling_generator()`` (seeded per batch by every loader)."""
    generator = sampling_generator()
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 1 << 62, (1,), device=device, generator=generator))


@dataclass(eq=False)
class CandidateEdges:
    """Every edge a layer may keep, grouped by destination row: ``src`` the global source id of each
    edge, ``counts`` the candidates per row (int64). Per-edge row ids are built only when asked
    for: LABOR-0 needs the rows of the kept edges alone."""

    src: Tensor
    counts: Tensor

    @cached_property
    def deg(self) -> Tensor:
        """``d_s`` per row, float64."""
        return self.counts.to(torch.float64)

    @cached_property
    def ends(self) -> Tensor:
        """Where each row's candidates end (exclusive): the cumulative counts."""
        return torch.cumsum(self.counts, 0)

    @cached_property
    def rows(self) -> Tensor:
        """The row of every candidate."""
        rows = torch.arange(self.counts.numel(), device=self.src.device)
        return self.per_edge(rows)

    def per_edge(self, row_values: Tensor, workspace: Workspace | None = None) -> Tensor:
        """A per-row value repeated over the row's candidates. With a ``workspace`` (integer
        values) written into its buffer as a cumulative sum of the jumps between consecutive rows,
        each at its row's first candidate: no per-candidate index is built. Jumps wrap modulo the
        dtype's range and so does their sum, back to the row's value."""
        total = self.src.numel()
        if workspace is None:
            return torch.repeat_interleave(row_values, self.counts, output_size=total)
        first = self.ends - self.counts
        jumps = torch.diff(row_values.to(torch.int64), prepend=row_values.new_zeros(1, dtype=torch.int64))
        # one slot past the end takes the jumps of trailing empty rows
        out = workspace.take("per_edge", total + 1, row_values.dtype, row_values.device).zero_()
        out.index_add_(0, first, jumps.to(row_values.dtype))
        return out.cumsum_(0)[:total]

    def rows_at(self, positions: Tensor) -> Tensor:
        """The rows of the candidates at ``positions``: a binary search over the row ends when
        the positions are few against the candidates, else a look-up in every row id."""
        if "rows" not in self.__dict__ and positions.numel() * SEARCH_PER_ROW_ID < self.src.numel():
            return torch.searchsorted(self.ends, positions, right=True)
        return self.rows.index_select(0, positions)


class SourceIndex(NodeScratch):
    """Numbers the distinct sources of a layer's candidates ``0..U-1`` through an int64 scratch
    array over all nodes (kept at -1 between calls): O(N) once per layer, no sort, so every
    fixed-point round works on U-sized arrays. One per process; the scratch is not pickled."""

    def __call__(self, ids: Tensor) -> tuple[int, Tensor]:
        """``(U, local)``: the number of distinct ``ids`` and each entry's number among them."""
        slot = self.scratch(ids.device)
        slot.index_fill_(0, ids, 0)
        distinct = torch.nonzero(slot == 0).squeeze(1)
        slot.index_copy_(0, distinct, torch.arange(distinct.numel(), device=ids.device))
        local = slot.index_select(0, ids)
        slot.index_fill_(0, distinct, -1)
        return distinct.numel(), local


def solve_row_scale(cand: CandidateEdges, inv_pi: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """``c_s`` with ``Σ_{t->s} 1/min(1, c_s π_t) = d_s² / k_s`` for every row (eq. 15/22, unit
    weights), and ``c_s`` per edge; ``inv_pi`` is ``1/π_t`` per edge.

    Water-filling from below: with ``C`` the edges clipped at 1 (``c π_t >= 1``) the equation is
    ``|C| + Σ_{t∉C} 1/(c π_t) = T``, so ``c = Σ_{t∉C} (1/π_t) / (T - |C|)``. Started at
    ``Σ_t (1/π_t) / T`` (no clipping assumed), every step stays at or below the root and only
    grows ``C``; when no row's ``C`` changes, the ``c`` of every row is exact.
    """
    rows, counts, deg = cand.rows, cand.counts, cand.deg
    target = deg * deg / k.clamp(min=1.0)
    c = row_sums(inv_pi, counts) / target.clamp(min=1.0)
    limit = inv_pi * (1.0 - CLIP_SLACK)  # ties at c π_t = 1 count as clipped despite rounding
    clipped = torch.zeros(inv_pi.numel(), dtype=torch.bool, device=inv_pi.device)
    num_clipped = 0
    c_edge = c.index_select(0, rows)
    for _ in range(C_ITERATIONS):
        clipped = (c_edge >= limit).logical_or_(clipped)  # C only grows
        grown = int(clipped.sum())
        if grown == num_clipped:  # no row's C grew: every c is exact
            break
        num_clipped = grown
        count = row_sums(clipped.to(torch.float64), counts)
        free = row_sums(torch.where(clipped, 0.0, inv_pi), counts)
        c = torch.where(count < deg, free / (target - count).clamp(min=CLIP_SLACK), c)
        c_edge = c.index_select(0, rows)
    return c, c_edge


def labor_probabilities(
    cand: CandidateEdges, fanout: int | Tensor, importance_sampling: int, index: SourceIndex
) -> Tensor:
    """``π_ts = min(1, c_s π_t)`` for every candidate edge, after ``importance_sampling`` rounds of
    the fixed-point iteration (0: LABOR-0, -1: until converged, see the module docstring).
    ``fanout``: ``k`` for every row (-1: all), or one ``k_s >= 1`` per row (``row_fanouts``)."""
    if isinstance(fanout, int) and fanout < 0:
        return torch.ones(cand.src.numel(), dtype=torch.float64, device=cand.src.device)
    if importance_sampling == 0:
        return labor0_probability(cand.deg, fanout).index_select(0, cand.rows)
    rounds = MAX_ROUNDS if importance_sampling < 0 else importance_sampling
    if not cand.src.is_cuda:
        return importance_probabilities_compiled(cand, fanout, rounds, index)
    return importance_probabilities_vectorised(cand, fanout, rounds, index)


def importance_probabilities_compiled(
    cand: CandidateEdges, fanout: int | Tensor, rounds: int, index: SourceIndex
) -> Tensor:
    """``labor_probabilities`` after ``rounds`` rounds, row by row in compiled loops: the CPU's
    form (``cpu_kernels.importance_probabilities``)."""
    scratch = index.scratch(cand.src.device)
    constants = (TOLERANCE, C_ITERATIONS, CLIP_SLACK)
    k = row_fanouts(cand.deg, fanout).to(torch.int64)
    return importance_probabilities(cand.src, cand.counts, k, rounds, scratch, constants)


def importance_probabilities_vectorised(
    cand: CandidateEdges, fanout: int | Tensor, rounds: int, index: SourceIndex
) -> Tensor:
    """``labor_probabilities`` after ``rounds`` rounds, each pass a vectorised operation over all
    candidates: the GPU's form (the CPU runs ``cpu_kernels.importance_probabilities``)."""
    k = row_fanouts(cand.deg, fanout)
    c = torch.where(cand.deg > 0, k / cand.deg.clamp(min=1.0), 0.0)  # LABOR-0: k / d_s
    num_sources, local = index(cand.src)
    pi = torch.ones(num_sources, dtype=torch.float64, device=cand.src.device)
    expected_prev = float("inf")
    c_edge = c.index_select(0, cand.rows)
    for _ in range(rounds):
        # eq. 18: π_t <- π_t max_{t->s} c_s, t's inclusion probability in the layer
        pi = pi * torch.zeros_like(pi).scatter_reduce_(0, local, c_edge, "amax")
        c, c_edge = solve_row_scale(cand, (1.0 / pi).index_select(0, local), k)
        expected = float(pi.clamp(max=1.0).sum())
        if expected >= (1.0 - TOLERANCE) * expected_prev:
            break
        expected_prev = expected
    return (c_edge * pi.index_select(0, local)).clamp_(max=1.0)


def labor_sample(
    cand: CandidateEdges,
    fanout: int | Tensor,
    importance_sampling: int,
    index: SourceIndex,
    seed: int,
    workspace: Workspace | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(keep, rows, prob)``: positions of the kept candidate edges (ascending, so rows stay
    grouped), kept when ``r_t <= π_ts`` with one ``r_t`` per source vertex, their rows and their
    ``π_ts``. LABOR-0 compares each edge with its row's ``min(1, k/d_s)``: no per-edge probability
    and no per-edge row id is built. ``fanout`` as ``labor_probabilities``."""
    if isinstance(fanout, int) and fanout < 0:
        keep = torch.arange(cand.src.numel(), device=cand.src.device)
        return keep, cand.rows, torch.ones(keep.numel(), dtype=torch.float64, device=keep.device)
    if importance_sampling == 0:
        p_row = labor0_probability(cand.deg, fanout)
        keep = below(seed, cand.src, cand.per_edge(threshold(p_row), workspace), workspace)
        rows = cand.rows_at(keep)
        return keep, rows, p_row.index_select(0, rows)
    prob = labor_probabilities(cand, fanout, importance_sampling, index)
    keep = below(seed, cand.src, threshold(prob), workspace)
    return keep, cand.rows_at(keep), prob.index_select(0, keep)


def row_fanouts(deg: Tensor, fanout: int | Tensor) -> Tensor:
    """``k_s = min(k, d_s)`` per row (float64 ``deg``). ``fanout`` is one ``k`` for every row, or
    one per row: a sampler that has already taken part of a row (GNS's cached neighbours) asks
    the rest of it for what is missing."""
    k = fanout.to(deg.dtype) if isinstance(fanout, Tensor) else float(fanout)
    return deg.clamp(max=k)


def labor0_probability(deg: Tensor, fanout: int | Tensor) -> Tensor:
    """LABOR-0's ``π_ts = min(1, k_s / d_s)`` per row (float64 ``deg``; all kept when ``d_s <= k``)."""
    return (row_fanouts(deg, fanout) / deg.clamp(min=1.0)).clamp_(max=1.0)


def in_edge_candidates(
    graph: CSRGraph, dst: Tensor, workspace: Workspace | None = None
) -> tuple[CandidateEdges, Tensor]:
    """All in-edges of ``dst`` as candidates, with their CSR positions; both in the buffers of a
    ``workspace`` when given (valid until its next layer)."""
    starts = graph.indptr.index_select(0, dst)
    deg = graph.indptr.index_select(0, dst + 1) - starts
    if workspace is None:
        pos = row_positions(starts, deg)
        return CandidateEdges(graph.indices.index_select(0, pos), deg), pos
    total = int(deg.sum())
    pos = row_positions(starts, deg, out=workspace.take("positions", total + 1, torch.int64, dst.device))
    src = workspace.take("sources", total, graph.indices.dtype, dst.device)
    return CandidateEdges(torch.index_select(graph.indices, 0, pos, out=src), deg), pos


def row_sums(values: Tensor, counts: Tensor) -> Tensor:
    """Sums of ``values`` grouped in consecutive rows of ``counts`` entries (empty rows sum to 0):
    a segment sum, half the time of a scatter by row id."""
    return torch.segment_reduce(values, "sum", lengths=counts, unsafe=True)


def normalise_rows(weights: Tensor, counts: Tensor, rows: Tensor, mass: Tensor) -> Tensor:
    """Rescale each row's weights (``counts`` per row, ``rows`` of each) to sum to ``mass`` of the
    row (the per-destination normalisation of the paper's estimator); a row without kept edges
    stays empty."""
    total = row_sums(weights, counts)
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
        layer_dependency: bool = False,
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
        self.layer_dependency = bool(layer_dependency)
        self.num_layers = len(self.fanouts)
        self._norm = gcn_norm(graph) if aggregation == "gcn" else None
        exact_mass = estimator == "hajek" and normalization == "graph"
        self._row_mass = row_mass(graph, aggregation, self._norm) if exact_mass else None
        self._relabel = Relabeler(graph.num_nodes)
        self._sources = SourceIndex(graph.num_nodes)
        self._workspace = Workspace()

    def sample(self, seeds: Tensor) -> MiniBatch:
        shared = draw_layer_seed() if self.layer_dependency else None
        return sample_top_down(
            seeds, self.fanouts, lambda dst, fanout: self._sample_layer(dst, fanout, shared)
        )

    def _sample_layer(self, dst: Tensor, fanout: int, seed: int | None = None) -> tuple[Block, Tensor]:
        """One layer's block; ``seed`` the hash seed of its variates (a fresh one when None)."""
        seed = draw_layer_seed() if seed is None else seed
        g = self.graph
        g.prefetch_rows(dst)  # a graph on disk: every row this layer reads, in flight together
        if self.importance_sampling == 0 and fanout > 0 and not dst.is_cuda:
            src, counts, degrees = labor0_kept(g.indptr, g.indices, dst.contiguous(), fanout, seed)
            deg = degrees.to(torch.float64)
            rows = torch.repeat_interleave(torch.arange(dst.numel()), counts, output_size=src.numel())
            prob = labor0_probability(deg, fanout).index_select(0, rows)
        else:
            cand, _ = in_edge_candidates(g, dst, self._workspace)
            keep, rows, prob = labor_sample(
                cand, fanout, self.importance_sampling, self._sources, seed, self._workspace
            )
            src = cand.src.index_select(0, keep)
            counts = torch.bincount(rows, minlength=dst.numel())
            deg = cand.deg
        src_nodes, local = self._relabel(dst, src)
        if self.normalization == "block":
            inv = 1.0 / prob
            imp = normalise_rows(inv, counts, rows, counts.to(torch.float64))  # mean 1 over each row
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
        if self.aggregation == "mean" and self.importance_sampling == 0 and self.estimator == "hajek":
            # LABOR-0's π_ts = min(1, k/d_s) and the mean's P_st = 1/d_s are the same for every
            # edge of a row, so the row's normalised Horvitz-Thompson weights are 1 / (edges kept)
            w = (1.0 / counts.clamp(min=1).to(torch.float64)).index_select(0, rows)
            return sampled_block(src_nodes.numel(), counts, local, w), src_nodes
        if self.aggregation == "mean":
            exact = 1.0 / deg.index_select(0, rows)  # P_st of the neighbour mean
            self_weights = None
        else:
            norm = self._norm
            exact = norm.index_select(0, dst).index_select(0, rows) * norm.index_select(0, src)  # eq. 2
            self_weights = norm.index_select(0, dst) ** 2
        w = exact / prob  # Horvitz-Thompson
        if self.estimator == "hajek":
            w = normalise_rows(w, counts, rows, self._row_mass.index_select(0, dst))
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
