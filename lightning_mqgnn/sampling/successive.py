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

The with-replacement stream may come from anything with the law ``p``: ``GuidedCDF`` (a fixed
distribution over millions of items) or draws of weighted entries mapped to the item they belong to
(LADIES: an entry ``L_ij`` of ``L[prev, :]`` drawn ∝ ``L_ij²`` gives column ``j`` with probability
``p_j``, eq. 7, without first summing the entries per column).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_mqgnn.sampling.rng import sampling_generator

_REJECTION_ROUNDS = 4  # rejection rounds before continuing by Gumbel-top-k
_EARLIER = 1 << 62  # first_occurrences keys: _EARLIER - position, larger = earlier


def gumbel_top_k(p: Tensor, s: int, generator: torch.Generator | None = None) -> Tensor:
    """Positions of ``s`` successive draws from ``p`` (unnormalised, >= 0), in draw order;
    ``generator`` None: ``sampling_generator()``."""
    if s <= 0:
        return torch.empty(0, dtype=torch.int64, device=p.device)
    generator = generator if generator is not None else sampling_generator()
    gumbel = (
        -torch.empty(p.numel(), dtype=torch.float64, device=p.device).exponential_(generator=generator).log()
    )
    keys = p.to(torch.float64).log() + gumbel  # p_j = 0 gives -inf: never drawn while s <= nnz
    return torch.topk(keys, s, sorted=True).indices


def _first_occurrences(draws: Tensor, slot: Tensor | None = None) -> Tensor:
    """Distinct values of ``draws`` in order of first appearance.

    With ``slot`` (an all ``-1`` int64 array longer than the largest value, left as found) it is
    O(len(draws)) scatter/gather, no sort: each value keeps the largest key ``_EARLIER - position``.
    """
    if slot is None:
        uniq, inverse = torch.unique(draws, return_inverse=True)
        first = torch.full((uniq.numel(),), draws.numel(), dtype=torch.int64, device=draws.device)
        first.scatter_reduce_(0, inverse, torch.arange(draws.numel(), device=draws.device), reduce="amin")
        return draws[torch.sort(first).values]
    key = _EARLIER - torch.arange(draws.numel(), device=draws.device)
    slot.scatter_reduce_(0, draws, key, reduce="amax")
    first = slot.gather(0, draws) == key
    slot.scatter_(0, draws, -1)
    return draws[first]


def rejection_draws(draw: Callable[[int], Tensor], s: int, slot: Tensor | None = None) -> Tensor:
    """Up to ``s`` distinct items in successive-sampling order from an i.i.d. stream ``draw(n)``.

    Keeps first occurrences of the with-replacement stream; returns fewer than ``s`` when the
    stream stalls for ``_REJECTION_ROUNDS`` rounds (the caller continues by Gumbel-top-k).
    """
    drawn = draw(s + s // 4 + 16)  # the first round; its device is that of every later draw
    for round_ in range(_REJECTION_ROUNDS):
        if round_:
            # how many to draw changes only the cost, not the law; repeats are rare over big supports
            need = s - drawn.numel()
            drawn = torch.cat([drawn, draw(2 * need + 16)])
        drawn = _first_occurrences(drawn, slot)
        if drawn.numel() >= s:
            return drawn[:s]
    return drawn


class GuidedCDF:
    """Inverse-CDF draws from a fixed distribution with a guide table (Chen & Asau 1974).

    ``torch.searchsorted`` costs ~20 mispredicted branches per draw over millions of items. The
    answer for ``u`` in cell ``k`` of a uniform grid over the total mass lies in
    ``[guide[k-1], guide[k+2]]`` (one cell of slack for rounding); when that range fits a window of
    ``window`` entries a batched search over the window finds it, else the full search does. Both
    give exactly ``searchsorted(cdf, u, right=True)``: the same draws as the plain inverse CDF.
    """

    def __init__(self, cdf: Tensor, last: int, window: int = 16):
        self.cdf = cdf  # float64, non-decreasing
        self.last = last  # index of the last positive entry (guards u * total rounding up)
        self.window = window
        self.total = cdf[-1]
        self.cells = cdf.numel()
        self.scale = self.cells / float(self.total)
        grid = torch.arange(self.cells + 1, dtype=torch.float64, device=cdf.device) * (
            float(self.total) / self.cells
        )
        self.guide = torch.searchsorted(cdf, grid, right=True)
        inf = torch.full((window,), float("inf"), dtype=torch.float64, device=cdf.device)
        self.padded = torch.cat([cdf, inf])

    @property
    def windows(self) -> Tensor:
        """``[n + 1, window]`` overlapping windows of the CDF: a view, never a copy (so the table
        moves to a device at the size of the CDF)."""
        return self.padded.unfold(0, self.window, 1)

    def positions(self, u: Tensor) -> Tensor:
        """``searchsorted(cdf, u, right=True)`` clamped to ``last``, for ``u`` in ``[0, total]``."""
        cell = (u * self.scale).to(torch.int64)
        lo = self.guide.index_select(0, (cell - 1).clamp_(0, self.cells))
        hi = self.guide.index_select(0, (cell + 2).clamp_(0, self.cells))
        rows = self.windows.index_select(0, lo)
        pos = lo + torch.searchsorted(rows, u.unsqueeze(1), right=True).squeeze(1)
        wide = (hi - lo >= self.window).nonzero().squeeze(1)
        if wide.numel():
            pos[wide] = torch.searchsorted(self.cdf, u[wide], right=True)
        return pos.clamp_(max=self.last)

    def draw(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` i.i.d. positions with probability ``p_j = (cdf_j - cdf_{j-1}) / total``."""
        generator = generator if generator is not None else sampling_generator()
        u = torch.rand(n, dtype=torch.float64, device=self.cdf.device, generator=generator)
        return self.positions(u * self.total)


def successive_sample(
    p: Tensor,
    s: int,
    generator: torch.Generator | None = None,
    cdf: Tensor | None = None,
    nnz: int | None = None,
    last: int | None = None,
    slot: Tensor | None = None,
    table: GuidedCDF | None = None,
) -> Tensor:
    """Positions of ``min(s, nnz(p))`` successive draws from ``p`` (unnormalised, >= 0), in draw order.

    When ``p`` is reused across calls, pass its ``cdf`` (``cumsum(p)``, float64), ``nnz`` (count of
    positive entries) and ``last`` (index of the last positive entry) to skip O(len(p)) work, or a
    ``GuidedCDF`` ``table`` over it. ``slot``: an all ``-1`` int64 scratch of length >= len(p),
    left as found, for sort-free de-duplication.
    """
    if p.dim() != 1:
        raise ValueError(f"successive_sample: p must be a vector, got shape {tuple(p.shape)}")
    if nnz is None or last is None:
        positive = (p > 0).nonzero()
        nnz = positive.numel()
        last = int(positive[-1]) if nnz else -1
    s = min(int(s), nnz)
    if s <= 0:
        return torch.empty(0, dtype=torch.int64, device=p.device)
    generator = generator if generator is not None else sampling_generator()
    if 4 * s > nnz:  # a large share of the support: the O(support) form is as cheap and never stalls
        return gumbel_top_k(p, s, generator)
    if table is not None:
        return continue_by_gumbel(
            p, rejection_draws(lambda n: table.draw(n, generator), s, slot), s, generator
        )
    if cdf is None:
        cdf = torch.cumsum(p.to(torch.float64), 0)
    total = cdf[-1]

    def draw(n: int) -> Tensor:
        u = torch.rand(n, dtype=torch.float64, device=cdf.device, generator=generator) * total
        # right=True skips p_j = 0; the clamp guards u * total rounding up to total
        return torch.searchsorted(cdf, u, right=True).clamp_(max=last)

    return continue_by_gumbel(p, rejection_draws(draw, s, slot), s, generator)


def continue_by_gumbel(p: Tensor, drawn: Tensor, s: int, generator: torch.Generator | None = None) -> Tensor:
    """``drawn`` followed by the rest of the ``s`` successive draws from ``p`` (Markov in the
    ordered prefix: the rest is successive sampling from ``p`` without the drawn items)."""
    if drawn.numel() >= s:
        return drawn
    rest = p.to(torch.float64).clone()
    rest[drawn] = 0.0
    return torch.cat([drawn, gumbel_top_k(rest, s - drawn.numel(), generator)])
