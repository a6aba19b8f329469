"""Homophilous Chung-Lu random graphs: power-law degrees plus class-assortative edges.

Chung-Lu gives node ``v`` an expected degree ``w_v``; Pareto weights make the degrees follow a
power law. We use its Poisson "stub" form, which needs no per-edge search: node ``v`` gets
Poisson(h w_v) stubs to be paired inside its class and Poisson((1 - h) w_v) stubs to be paired
with any node; stubs are shuffled within their group and consecutive stubs become edges. Pair
counts are then proportional to ``w_u w_v`` as in Chung-Lu, and a fraction ``h`` of edges is
intra-class by construction (homophily). Self loops are dropped and duplicates merged.

Everything is a handful of vectorised passes; the two sorts run in numpy, which sorts int64
about twice as fast as torch on CPU (``np.unique`` is avoided: it is hash-based and slow here).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.edge_buckets import EdgeBuckets, unique_of_sorted


def pareto_weights(num_nodes: int, alpha: float, mean_degree: float, generator: torch.Generator) -> Tensor:
    """Expected degrees ``w`` with a Pareto(alpha) tail (degree exponent alpha + 1), mean ``mean_degree``.

    Capped at the Chung-Lu structural cut-off ``sqrt(sum w)`` so no pair is expected more than
    once (few duplicate edges), then rescaled to the requested mean.
    """
    if alpha <= 1.0:
        raise ValueError(f"power-law alpha must be > 1 (finite mean degree), got {alpha}")
    u = torch.rand(num_nodes, generator=generator, dtype=torch.float64)
    w = (1.0 - u).pow(-1.0 / alpha)  # Pareto with x_min = 1
    for _ in range(3):  # cap and rescale; settles in a couple of rounds
        w = w * (mean_degree / w.mean())
        w = w.clamp(max=math.sqrt(mean_degree * num_nodes))
    return w * (mean_degree / w.mean())


def _sorted_unique(keys: Tensor) -> Tensor:
    return torch.from_numpy(unique_of_sorted(np.sort(keys.numpy())))


def _pair_stubs_within_groups(
    node_group: Tensor, stubs_per_node: Tensor, num_nodes: int, num_groups: int, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Node ``i mod N`` of group ``node_group[i]`` gets ``stubs_per_node[i]`` stubs; shuffle the stubs
    within their group and pair consecutive ones.

    One int64 sort of ``group | random | node`` keys does every group's shuffle at once (ties in
    the random bits, rarer than 2^-20, fall back to node order).
    """
    nbits = max(1, (num_nodes - 1).bit_length())
    gbits = max(1, (num_groups - 1).bit_length())
    rbits = 63 - nbits - gbits
    if rbits < 20:
        raise ValueError(f"graph too large to generate: {num_nodes} nodes x {num_groups} classes")
    ids = torch.arange(node_group.numel()) % num_nodes
    key = torch.repeat_interleave((node_group << (rbits + nbits)) | ids, stubs_per_node)
    key |= torch.randint(0, 1 << rbits, key.shape, generator=gen) << nbits
    key = torch.from_numpy(np.sort(key.numpy()))
    counts = torch.bincount(key >> (rbits + nbits), minlength=num_groups)
    key &= (1 << nbits) - 1  # now the node id
    ends = torch.cumsum(counts, 0)
    keep = torch.ones(key.numel(), dtype=torch.bool)
    keep[ends[counts % 2 == 1] - 1] = False  # odd group: drop its last stub so pairs stay in-group
    node = key[keep]
    return node[0::2], node[1::2]


def _paired_stubs(
    weights: Tensor, classes: Tensor, num_classes: int, homophily: float, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Undirected edges ``(a, b)``, ``a != b``, of one round of stub pairing (duplicates kept)."""
    n = classes.numel()
    intra = torch.poisson(weights * homophily, generator=gen).to(torch.int64)
    inter = torch.poisson(weights * (1.0 - homophily), generator=gen).to(torch.int64)
    groups = torch.cat([classes, torch.full((n,), num_classes)])  # group num_classes: "pair with anyone"
    a, b = _pair_stubs_within_groups(groups, torch.cat([intra, inter]), n, num_classes + 1, gen)
    keep = a != b  # no self loops
    return a[keep], b[keep]


def _draw_edge_keys(
    weights: Tensor, classes: Tensor, num_classes: int, homophily: float, gen: torch.Generator
) -> Tensor:
    """Sorted unique directed keys ``dst * N + src`` (both directions) of one round of stub pairing."""
    n = classes.numel()
    a, b = _paired_stubs(weights, classes, num_classes, homophily, gen)
    return _sorted_unique(torch.cat([b * n + a, a * n + b]))


STUBS_PER_CHUNK = 1 << 27  # 1 GiB of int64 sort keys per round of ``chung_lu_edge_chunks``


def chung_lu_edge_chunks(
    weights: Tensor,
    classes: Tensor,
    num_classes: int,
    homophily: float,
    generator: torch.Generator,
    stubs_per_chunk: int | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """The stub pairing of ``homophilous_chung_lu`` in ``C`` rounds of rates ``weights / C``, so
    that one round's stubs are about ``stubs_per_chunk`` (default ``STUBS_PER_CHUNK``): the edges
    of a graph whose edge list does not fit in memory, a round at a time (undirected ``(a, b)``,
    ``a != b``, duplicates and both directions left to whoever merges them, see ``edge_buckets``).

    Node ``v`` gets Poisson(``w_v``) stubs over all rounds, as in one round, and a pair of
    stubs meets in a round with probability proportional to ``w_u w_v``, so the expected degrees
    and the homophily are ``homophilous_chung_lu``'s.
    """
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    rounds = max(1, math.ceil(float(weights.sum()) / (stubs_per_chunk or STUBS_PER_CHUNK)))
    rate = weights / rounds
    for _ in range(rounds):
        yield _paired_stubs(rate, classes, num_classes, homophily, generator)


TOP_UP_ROUNDS = 3  # redraws of the degree shortfall that merged duplicate edges leave


def homophilous_chung_lu(
    weights: Tensor,
    classes: Tensor,
    num_classes: int,
    homophily: float,
    generator: torch.Generator,
) -> CSRGraph:
    """Symmetric simple graph with expected degrees ``weights`` and intra-class edge fraction ``homophily``.

    Merged duplicates lower the degree a little; the shortfall is drawn again (rates scaled
    down) for up to ``TOP_UP_ROUNDS`` rounds, so the mean degree ends within ~1% of
    ``weights.mean()`` unless the graph is too dense to hold it.
    """
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    n = classes.numel()
    target = float(weights.sum())  # directed entries = 2 x undirected edges
    keys = _draw_edge_keys(weights, classes, num_classes, homophily, generator)
    for _ in range(TOP_UP_ROUNDS):
        missing = target - keys.numel()
        if missing <= 0.01 * target:
            break
        extra = _draw_edge_keys(weights * (missing / target), classes, num_classes, homophily, generator)
        keys = _sorted_unique(torch.cat([keys, extra]))
    rows, cols = keys // n, keys % n
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=n), 0, out=indptr[1:])
    return CSRGraph(indptr=indptr, indices=cols, num_nodes=n)


def homophilous_chung_lu_on_disk(
    weights: Tensor,
    classes: Tensor,
    num_classes: int,
    homophily: float,
    generator: torch.Generator,
    scratch: Path,
) -> EdgeBuckets:
    """``homophilous_chung_lu``'s model drawn in rounds (``chung_lu_edge_chunks``) and merged in
    ``scratch`` (``EdgeBuckets``), the shortfall of merged duplicates redrawn as there: memory
    holds one round or one destination range, never the edge list. Returns the merged buckets
    (``indptr``, ``num_edges``, ``column_chunks``). Not the same graph as ``homophilous_chung_lu``'s
    for the same generator: the stubs are paired in other groups."""
    target = float(weights.sum())
    buckets = EdgeBuckets(scratch, classes.numel(), expected_entries=int(target))
    rate = weights
    for _ in range(TOP_UP_ROUNDS + 1):
        for a, b in chung_lu_edge_chunks(rate, classes, num_classes, homophily, generator):
            buckets.add_undirected(a, b)
        buckets.merge()
        missing = target - buckets.num_edges
        if missing <= 0.01 * target:
            break
        rate = weights * (missing / target)
    return buckets
