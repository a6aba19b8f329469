"""The CPU samplers' inner loops, compiled by numba: one pass over a layer's rows each.

Vectorised torch spends a layer of a few thousand rows in dozens of small operators (each a
dispatch and a fresh array) and a layer of millions of candidate edges in full-size intermediate
arrays (positions, gathered sources, hashes, masks); a compiled loop reads each edge once and
writes only what it keeps. The kernels release the GIL, so producer threads sample in parallel,
and take their random input from the caller (draws made with torch's generator, or a hash
seed), so the seeding (``rng.drawing_from``) is that of the vectorised forms a GPU runs. Each
kernel is compiled for its one signature when this module is imported (numba caches the machine
code on disk, so later imports load it): no compilation lands inside a training epoch.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

_HALF = 1 << 31
_WORD = 0xFFFFFFFF


@njit("int64(int64[::1], int64[::1], int64)", nogil=True, cache=True)
def _rows_over(indptr, nodes, k):
    """How many of ``nodes`` have more than ``k`` in-edges."""
    over = 0
    for v in nodes:
        if indptr[v + 1] - indptr[v] > k:
            over += 1
    return over


@njit(
    "Tuple((int64[::1], int64[::1]))(int64[::1], int64[::1], int64, float64[:, ::1])", nogil=True, cache=True
)
def _floyd_positions(indptr, nodes, k, draws):
    """Node-wise sampling without replacement: every row keeps all its edges when it has at most
    ``k``, else a uniform ``k``-subset of them by Floyd's algorithm (Bentley & Floyd 1987): for
    ``j = d - k .. d - 1`` take ``t = floor(u (j + 1))``, or ``j`` when ``t`` is already taken.
    ``draws[step, p]`` is the uniform of ``step`` for the ``p``-th row with more than ``k`` edges.
    Returns the edges kept per row and their CSR positions, grouped by row, in draw order."""
    counts = np.empty(nodes.size, np.int64)
    total = 0
    for r in range(nodes.size):
        v = nodes[r]
        counts[r] = min(indptr[v + 1] - indptr[v], k)
        total += counts[r]
    out = np.empty(total, np.int64)
    chosen = np.empty(k, np.int64)
    at = 0
    p = 0
    for r in range(nodes.size):
        v = nodes[r]
        start = indptr[v]
        d = indptr[v + 1] - start
        if d <= k:
            for i in range(d):
                out[at + i] = start + i
        else:
            for step in range(k):
                j = d - k + step
                t = np.int64(draws[step, p] * (j + 1))
                taken = False
                for earlier in range(step):  # no early exit: a branch per collision mispredicts
                    taken |= chosen[earlier] == t
                t = j if taken else t
                chosen[step] = t
                out[at + step] = start + t
            p += 1
        at += counts[r]
    return counts, out


def floyd_positions(
    indptr: Tensor, nodes: Tensor, k: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """``(counts, positions)`` of ``_floyd_positions``, its uniforms drawn as ``torch.rand(k, P,
    dtype=float64)`` from ``generator`` (P: the rows with more than ``k`` edges)."""
    ip, ids = indptr.numpy(), nodes.numpy()
    draws = torch.rand(k, _rows_over(ip, ids, k), dtype=torch.float64, generator=generator)
    counts, out = _floyd_positions(ip, ids, k, draws.numpy())
    return torch.from_numpy(counts), torch.from_numpy(out)


@njit("Tuple((int64[::1], int64[::1]))(int64[::1], int64[::1], int64[::1], int64)", nogil=True, cache=True)
def _relabel(prefix, others, slot, scan_per_sorted_id):
    """``nodes`` = ``prefix`` then the distinct ``others`` not in it, ascending; ``local`` = each
    entry of ``others``' position in ``nodes``. ``slot`` (-1 over all nodes) is scratch, left at -1.
    The new ids are put in order by a scan of ``slot`` when the graph is small against them, else
    by a sort. The loops over ids are branch-free (a select instead of an ``if``): whether an id
    is new is a coin toss the CPU cannot predict."""
    size = prefix.size
    for i in range(size):
        slot[prefix[i]] = i
    new = np.empty(others.size + 1, np.int64)
    m = 0
    for v in others:  # flag the new ids -2, in order of first appearance
        s = slot[v]
        fresh = np.int64(s == -1)
        new[m] = v
        m += fresh
        slot[v] = s - fresh
    if slot.size <= scan_per_sorted_id * m:
        m = 0
        for v in range(slot.size):  # number them in id order as they are found
            s = slot[v]
            fresh = s == -2
            new[m] = v
            slot[v] = size + m if fresh else s
            m += np.int64(fresh)
    else:
        new[:m] = np.sort(new[:m])
        for j in range(m):
            slot[new[j]] = size + j
    nodes = np.empty(size + m, np.int64)
    nodes[:size] = prefix
    nodes[size:] = new[:m]
    local = np.empty(others.size, np.int64)
    for e in range(others.size):
        local[e] = slot[others[e]]
    for v in nodes:
        slot[v] = -1
    return nodes, local


# Scanning the scratch array of all nodes costs about as much as sorting the new ids when there is
# one new id per this many nodes (measured at 1M nodes: they cross near 64 nodes a new id)
SCAN_PER_SORTED_ID = 64


def relabel(prefix: Tensor, others: Tensor, slot: Tensor) -> tuple[Tensor, Tensor]:
    """``(nodes, local)`` of ``_relabel`` on int64 CPU tensors; ``slot`` is the caller's scratch."""
    nodes, local = _relabel(prefix.numpy(), others.numpy(), slot.numpy(), SCAN_PER_SORTED_ID)
    return torch.from_numpy(nodes), torch.from_numpy(local)


@njit(nogil=True, cache=True, inline="always")
def _hash_bits(seed_word, v):
    """``labor.hash_bits`` of one id: fmix32 of ``v · golden + seed_word`` (mod 2^32; the seed
    word is ``seed + 2^31``), read as a signed 32-bit integer. Products are taken in int64, which
    wraps, and masked to their low 32 bits, which the wrap leaves exact."""
    z = (v * 0x9E3779B1 + seed_word) & _WORD
    z ^= z >> 16
    z = (z * 0x85EBCA6B) & _WORD
    z ^= z >> 13
    z = (z * 0xC2B2AE35) & _WORD
    z ^= z >> 16
    return z - (1 << 32) if z >= _HALF else z


@njit(
    "Tuple((int64[::1], int64[::1], int64[::1]))(int64[::1], int64[::1], int64[::1], int64, int64)",
    nogil=True,
    cache=True,
)
def _labor0_kept(indptr, indices, nodes, k, seed_word):
    """LABOR-0 on the in-edges of ``nodes``: edge ``t -> s`` is kept when ``t``'s hash is at most
    the threshold of ``min(1, k / d_s)`` (``labor.threshold``). Returns the kept sources, grouped
    by row in CSR order, the kept edges per row and each row's in-degree ``d_s``."""
    degrees = np.empty(nodes.size, np.int64)
    for r in range(nodes.size):
        degrees[r] = indptr[nodes[r] + 1] - indptr[nodes[r]]
    src = np.empty(degrees.sum(), np.int64)
    counts = np.empty(nodes.size, np.int64)
    at = 0
    for r in range(nodes.size):
        start = indptr[nodes[r]]
        d = degrees[r]
        p = min(min(d, k) / max(d, 1), 1.0)
        limit = max(np.floor(p * 4294967296.0) - (_HALF + 1), -float(_HALF))
        first = at
        for e in range(start, start + d):
            t = indices[e]
            if _hash_bits(seed_word, t) <= limit:
                src[at] = t
                at += 1
        counts[r] = at - first
    return src[:at], counts, degrees


def labor0_kept(
    indptr: Tensor, indices: Tensor, nodes: Tensor, k: int, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``(src, counts, degrees)`` of ``_labor0_kept``: the same edges as ``labor.labor_sample``
    keeps with ``importance_sampling=0`` and hash seed ``seed``, and the rows' in-degrees."""
    seed_word = (seed + _HALF) & _WORD
    out = _labor0_kept(indptr.numpy(), indices.numpy(), nodes.numpy(), k, seed_word)
    return tuple(torch.from_numpy(a) for a in out)


@njit("Tuple((int64[::1], int64))(int64[::1], int64[::1])", nogil=True, cache=True)
def _source_numbers(src, slot):
    """Each entry of ``src`` numbered among the distinct ids (in order of first appearance), and
    how many there are; ``slot`` (-1 over all nodes) is scratch, left at -1."""
    local = np.empty(src.size, np.int64)
    distinct = 0
    for e in range(src.size):
        s = slot[src[e]]
        if s < 0:
            s = distinct
            slot[src[e]] = s
            distinct += 1
        local[e] = s
    for t in src:
        slot[t] = -1
    return local, distinct


@njit(
    "float64(float64[::1], int64, int64, int64, int64, boolean[::1], int64, float64)", nogil=True, cache=True
)
def _solve_row(inv_pi, start, end, d, k, clipped, c_iterations, clip_slack):
    """``labor.solve_row_scale`` for one row's edges ``start .. end``: water-filling from below
    until the row's clipped set stops growing (eq. 15/22). Rows are independent, so a row stops
    where the vectorised form, which iterates until no row's set grows, leaves it unchanged."""
    target = d * d / max(k, 1.0)
    total = 0.0
    for e in range(start, end):
        total += inv_pi[e]
        clipped[e] = False
    c = total / max(target, 1.0)
    num_clipped = 0
    for _ in range(c_iterations):
        grown = 0
        free = 0.0
        for e in range(start, end):
            clipped[e] = clipped[e] or c >= inv_pi[e] * (1.0 - clip_slack)
            grown += clipped[e]
            free += 0.0 if clipped[e] else inv_pi[e]
        if grown == num_clipped:
            break
        num_clipped = grown
        if grown < d:
            c = free / max(target - grown, clip_slack)
    return c


@njit(
    "float64[::1](int64[::1], int64[::1], int64[::1], int64, int64[::1], float64, int64, float64)",
    nogil=True,
    cache=True,
)
def _importance_probabilities(src, counts, fanouts, rounds, slot, tolerance, c_iterations, clip_slack):
    """``labor.labor_probabilities``' fixed point, each pass over the edges one loop."""
    local, distinct = _source_numbers(src, slot)
    rows = counts.size
    c = np.empty(rows)
    for r in range(rows):
        d = counts[r]
        c[r] = min(d, fanouts[r]) / d if d > 0 else 0.0
    pi = np.ones(distinct)
    most = np.empty(distinct)
    inv_pi = np.empty(src.size)
    clipped = np.empty(src.size, np.bool_)
    expected_prev = np.inf
    for _ in range(rounds):
        most[:] = 0.0
        start = 0
        for r in range(rows):  # eq. 18: π_t <- π_t max_{t->s} c_s
            for e in range(start, start + counts[r]):
                most[local[e]] = max(most[local[e]], c[r])
            start += counts[r]
        expected = 0.0
        for u in range(distinct):
            pi[u] *= most[u]
            expected += min(pi[u], 1.0)
        for e in range(src.size):
            inv_pi[e] = 1.0 / pi[local[e]]
        start = 0
        for r in range(rows):
            d = counts[r]
            c[r] = _solve_row(
                inv_pi, start, start + d, d, min(d, fanouts[r]), clipped, c_iterations, clip_slack
            )
            start += d
        if expected >= (1.0 - tolerance) * expected_prev:
            break
        expected_prev = expected
    prob = np.empty(src.size)
    start = 0
    for r in range(rows):
        for e in range(start, start + counts[r]):
            prob[e] = min(c[r] * pi[local[e]], 1.0)
        start += counts[r]
    return prob


def importance_probabilities(
    src: Tensor,
    counts: Tensor,
    fanouts: Tensor,
    rounds: int,
    slot: Tensor,
    constants: tuple[float, int, float],
) -> Tensor:
    """``labor.labor_probabilities`` with ``rounds`` (> 0) fixed-point rounds over the candidates
    ``src`` grouped in rows of ``counts``, one row at a time, with ``fanouts`` (int64) each row's
    ``k``: ``π_ts`` per candidate (float64).
    ``constants``: the tolerance, the water-filling's iteration cap and its clipping slack."""
    tolerance, c_iterations, clip_slack = constants
    prob = _importance_probabilities(
        src.numpy(),
        counts.numpy(),
        fanouts.numpy(),
        rounds,
        slot.numpy(),
        tolerance,
        c_iterations,
        clip_slack,
    )
    return torch.from_numpy(prob)


@njit(
    "Tuple((int64[::1], int64[::1], float32[::1]))(int64[::1], int64[::1], float32[::1], int64)",
    nogil=True,
    cache=True,
)
def _transpose(indptr, indices, weights, num_src):
    """The CSC of a block by a counting sort of its entries by source: each source's entries keep
    their row order (what a stable sort gives), each with its row and weight."""
    src_indptr = np.zeros(num_src + 1, np.int64)
    for u in indices:
        src_indptr[u + 1] += 1
    for u in range(num_src):
        src_indptr[u + 1] += src_indptr[u]
    fill = src_indptr[:-1].copy()
    rows = np.empty(indices.size, np.int64)
    src_weights = np.empty(indices.size, np.float32)
    for r in range(indptr.size - 1):
        for e in range(indptr[r], indptr[r + 1]):
            at = fill[indices[e]]
            rows[at] = r
            src_weights[at] = weights[e]
            fill[indices[e]] = at + 1
    return src_indptr, rows, src_weights


def transpose(
    indptr: Tensor, indices: Tensor, weights: Tensor, num_src: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``(src_indptr, src_rows, src_weights)`` of ``_transpose`` on CPU tensors (float32 weights)."""
    out = _transpose(
        indptr.contiguous().numpy(), indices.contiguous().numpy(), weights.contiguous().numpy(), num_src
    )
    return tuple(torch.from_numpy(a) for a in out)
