"""Successive sampling (PPSWOR): ``s`` distinct draws without replacement, in draw order.

Chen et al. draw layer-wise samples with ``np.random.choice(n, s, replace=False, p=p)``: each draw
picks item ``j`` with probability ``p_j / (1 - S)``, ``S`` the mass already drawn. The debias
weights (eq. 13) depend on that *order*, so both routines here return positions in draw order.

Two exact, vectorised forms of the same distribution:
- Gumbel-top-k: keys ``log p_j + Gumbel``; the ``s`` largest, sorted descending, are the draws.
  O(support) per call.
- Rejection: draw with replacement from the cumulative distribution and keep first occurrences.
  Drawing with replacement and skipping repeats picks the next new item with probability
  ``p_j / (1 - S)``, i.e. successive sampling itself. O(s log n) per call with a precomputed CDF,
  which is what makes FastGCN's global distribution over millions of nodes cheap.
Successive sampling is Markov in its ordered prefix, so when rejection stalls (mass concentrated
on few items) the remaining draws continue by Gumbel-top-k over the not-yet-drawn items, exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

_REJECTION_ROUNDS = 4  # rejection rounds before continuing by Gumbel-top-k


def gumbel_top_k(p: Tensor, s: int, generator: torch.Generator | None = None) -> Tensor:
    """Positions of ``s`` successive draws from ``p`` (unnormalised, >= 0), in draw order."""
    if s <= 0:
        return torch.empty(0, dtype=torch.int64)
    gumbel = -torch.empty(p.numel(), dtype=torch.float64).exponential_(generator=generator).log()
    keys = p.to(torch.float64).log() + gumbel  # p_j = 0 gives -inf: never drawn while s <= nnz
    return torch.topk(keys, s, sorted=True).indices


def _first_occurrences(draws: Tensor) -> Tensor:
    """Distinct values of ``draws`` in order of first appearance."""
    uniq, inverse = torch.unique(draws, return_inverse=True)
    first = torch.full((uniq.numel(),), draws.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(draws.numel()), reduce="amin")
    return draws[torch.sort(first).values]


def successive_sample(
    p: Tensor,
    s: int,
    generator: torch.Generator | None = None,
    cdf: Tensor | None = None,
    nnz: int | None = None,
    last: int | None = None,
) -> Tensor:
    """Positions of ``min(s, nnz(p))`` successive draws from ``p`` (unnormalised, >= 0), in draw order.

    When ``p`` is reused across calls, pass its ``cdf`` (``cumsum(p)``, float64), ``nnz`` (count of
    positive entries) and ``last`` (index of the last positive entry) to skip O(len(p)) work.
    """
    if p.dim() != 1:
        raise ValueError(f"successive_sample: p must be a vector, got shape {tuple(p.shape)}")
    if nnz is None or last is None:
        positive = (p > 0).nonzero()
        nnz = positive.numel()
        last = int(positive[-1]) if nnz else -1
    s = min(int(s), nnz)
    if s <= 0:
        return torch.empty(0, dtype=torch.int64)
    if 4 * s > nnz:  # a large share of the support: the O(support) form is as cheap and never stalls
        return gumbel_top_k(p, s, generator)
    if cdf is None:
        cdf = torch.cumsum(p.to(torch.float64), 0)
    total = cdf[-1]
    drawn = torch.empty(0, dtype=torch.int64)
    for _ in range(_REJECTION_ROUNDS):
        need = s - drawn.numel()
        u = torch.rand(2 * need + 16, dtype=torch.float64, generator=generator) * total
        # right=True skips p_j = 0; the clamp guards u * total rounding up to total
        cand = torch.searchsorted(cdf, u, right=True).clamp_(max=last)
        drawn = _first_occurrences(torch.cat([drawn, cand]))
        if drawn.numel() >= s:
            return drawn[:s]
    # continue the same successive process over what is left (Markov in the ordered prefix)
    rest = p.to(torch.float64).clone()
    rest[drawn] = 0.0
    return torch.cat([drawn, gumbel_top_k(rest, s - drawn.numel(), generator)])
