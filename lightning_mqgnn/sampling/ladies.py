"""LADIES (Zou et al. 2019) as calibrated by Chen et al. (TMLR): layer-dependent importance.

``p_j ∝ Σ_{i∈prev} L_ij²`` (eq. 7), or ``∝ sqrt`` of it with ``flat`` (eq. 10): only neighbours of
``prev`` and ``prev`` itself (the self loop) have mass, so the support is the union of their rows
(eq. 6). It is found in O(edges of prev) without a sort or a dense N-vector of probabilities.

Without ``flat`` the draws need no per-column sums at all: an entry of ``L[prev, :]`` drawn with
probability ∝ ``L_ij²`` lands in column ``j`` with probability exactly ``p_j`` of eq. 7, so the
successive draws take first occurrences of columns of entries drawn that way, and ``p_j`` is summed
only for the drawn columns, from the entries the block keeps anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_mqgnn.graph.huge_pages import advise_huge_pages
from lightning_mqgnn.sampling.layerwise import (
    LayerDistribution,
    LayerDraw,
    LayerwiseSampler,
    RowEntries,
    normalise,
)
from lightning_mqgnn.sampling.rng import sampling_generator
from lightning_mqgnn.sampling.successive import continue_by_gumbel, rejection_draws, successive_sample

# Clear the whole accumulator rather than the entries set, while it is at most this many times
# longer than the entries: a sequential clear of N floats costs about what ~30 random writes do.
_SWEEP_RATIO = 32


class LADIESSampler(LayerwiseSampler):
    """LADIES / +flat / +debias / +flat+debias; ``samples`` input layer first."""

    _acc: Tensor | None = None  # float32 [N], all zero between layers

    def layer_distribution(self, prev: Tensor, cols: Tensor, values: Tensor) -> LayerDistribution:
        support, inverse = self._distinct(cols)
        pi = torch.zeros(support.numel(), dtype=torch.float64, device=support.device)
        pi.index_add_(0, inverse, values.to(torch.float64).square())  # eq. 7 numerator
        if self.flat:
            pi = pi.sqrt()  # eq. 10
        p = normalise(pi, f"LADIES layer over {prev.numel()} rows")
        # every support entry has mass: squares of positive L entries (no O(support) recount)
        return LayerDistribution(support=support, p=p, nnz=support.numel(), last=support.numel() - 1)

    def draw_layer(self, prev: Tensor, rows: RowEntries, s: int) -> LayerDraw:
        values = self.entry_values(prev, rows)
        sq = values.square()  # L_ij² of every entry (eq. 7)
        if 4 * s > sq.numel():  # few entries: a large share of the support, the exact per-column form
            return self._draw_by_columns(rows.cols, sq, values, s, prev.numel())
        weights = self._flat_entry_weights(rows.cols, sq) if self.flat else None  # column sums sqrt(π_j)
        return self._draw_by_entries(rows.cols, sq, values, s, prev.numel(), weights)

    def _flat_entry_weights(self, cols: Tensor, sq: Tensor) -> Tensor:
        """``L_ij² / sqrt(π_j)`` (float32), π_j summed in the float32 [N] accumulator (all zero
        again on return): the random-access passes over it are the cost here, and 4-byte sums keep
        more of it in cache (relative error ~1e-7, far below the sampling noise)."""
        acc = self.accumulator()
        acc.scatter_add_(0, cols, sq)  # π_j of eq. 7 (faster than index_add_ here)
        weights = acc.index_select(0, cols).rsqrt_().mul_(sq)
        if acc.numel() <= _SWEEP_RATIO * cols.numel():
            acc.zero_()
        else:
            acc.index_fill_(0, cols, 0.0)
        return weights

    def accumulator(self) -> Tensor:
        """The float32 [N] scratch of ``_flat_entry_weights`` (its only user), reused."""
        if self._acc is None:
            self._acc = torch.zeros(self.graph.num_nodes, dtype=torch.float32, device=self.device)
            advise_huge_pages(self._acc)
        return self._acc

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_acc"] = None  # per-process scratch, rebuilt on first use
        return state

    def _draw_by_columns(
        self, cols: Tensor, sq: Tensor, values: Tensor, s: int, num_rows: int, drawn: Tensor | None = None
    ) -> LayerDraw:
        """Sum ``L_ij²`` per distinct column (eq. 7), take the root with ``flat`` (eq. 10), draw;
        with ``drawn`` (global ids already drawn, in order) continue that successive sample."""
        support, inverse = self._distinct(cols)
        device = support.device
        pi = torch.zeros(support.numel(), dtype=torch.float64, device=device)
        pi.scatter_add_(0, inverse, sq.to(torch.float64))
        if self.flat:
            pi.sqrt_()
        p = normalise(pi, f"LADIES layer over {num_rows} rows")
        if drawn is None:
            # every support entry has mass: squares of positive L entries (no O(support) recount)
            pos = successive_sample(p, s, nnz=support.numel(), last=support.numel() - 1, slot=self.scratch())
        else:
            pos = continue_by_gumbel(p, self.positions_in(support, drawn), min(s, support.numel()))
        rank = torch.full((support.numel(),), -1, dtype=torch.int64, device=device)
        rank[pos] = torch.arange(pos.numel(), device=device)
        local = rank.gather(0, inverse)
        kept = (local >= 0).nonzero().squeeze(1)
        return LayerDraw(
            support.index_select(0, pos),
            p.index_select(0, pos),
            kept,
            local.index_select(0, kept),
            values[kept],
        )

    def _draw_by_entries(
        self, cols: Tensor, sq: Tensor, values: Tensor, s: int, num_rows: int, weights: Tensor | None = None
    ) -> LayerDraw:
        """Successive draws of columns from entries drawn ∝ ``weights`` (default ``sq``), whose
        column sums are ∝ ``p``: the column probabilities are the kept entries' weight sums."""
        weights = sq if weights is None else weights
        cdf = torch.cumsum(weights, 0, dtype=torch.float64)
        total = cdf[-1]
        if not bool(total > 0):
            raise ValueError(f"LADIES layer over {num_rows} rows: sampling distribution has no positive mass")
        last = cdf.numel() - 1
        generator = sampling_generator()

        def draw(n: int) -> Tensor:
            u = torch.rand(n, dtype=torch.float64, device=cdf.device, generator=generator).mul_(total)
            return cols.index_select(0, torch.searchsorted(cdf, u, right=True).clamp_(max=last))

        chosen = rejection_draws(draw, s, self.scratch())
        if chosen.numel() < s:  # stalled (few distinct columns): continue exactly, per column
            return self._draw_by_columns(cols, sq, values, s, num_rows, drawn=chosen)
        kept, local = self.kept_entries(chosen, cols)
        mass = torch.zeros(s, dtype=torch.float64, device=cdf.device)
        mass.scatter_add_(0, local, weights.index_select(0, kept).to(torch.float64))
        return LayerDraw(chosen, mass / total, kept, local, values.index_select(0, kept))

    def _distinct(self, cols: Tensor) -> tuple[Tensor, Tensor]:
        """``(support, inverse)`` with ``support[inverse] == cols``, via the scratch array.

        Every entry writes its own position; exactly one write per distinct id survives, and
        that entry becomes the representative. O(len(cols)), no sort.
        """
        slot = self.scratch()
        pos = torch.arange(cols.numel(), device=cols.device)
        slot.scatter_(0, cols, pos)  # duplicates: one write per id survives
        support = cols[slot.gather(0, cols) == pos]
        slot.scatter_(0, support, torch.arange(support.numel(), device=cols.device))
        inverse = slot.gather(0, cols)
        slot.scatter_(0, support, -1)
        return support, inverse
