"""Negative samplers for link prediction: ``k`` corrupted pairs per positive edge.

Each positive ``(u, v)`` gets ``k`` negatives ``(u, v')``: the source is kept and the
destination drawn anew, the corruption of ogbl-citation2's protocol and of DGL's
``PerSourceUniform``. Output pair ``i * k + j`` is the ``j``-th negative of positive ``i``, so
``neg_dst.reshape(E, k)`` lines negatives up with their positive (when nothing is dropped).

Draws come from the generator of ``rng.drawing_from`` (torch's default generator when none is
set), so a batch seeded per index (``rng.batch_rng_seed``) gets the same negatives in every
process. ``strict=True`` rejects pairs that are edges of the prepared graph, or self pairs:
those are drawn again, ``STRICT_REDRAWS`` times at most, and the ones still rejected are dropped
(on a sparse graph almost never; a node joined to nearly every other can lose some).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.edge_keys import contains, graph_keys, pair_keys
from lightning_mqgnn.sampling.rng import sampling_generator

STRICT_REDRAWS = 8


@dataclass
class _Negatives:
    """What both samplers share: ``k``, the strict rejection and the prepared graph's state."""

    k: int = 1
    strict: bool = False
    _num_nodes: int | None = field(default=None, init=False, repr=False, compare=False)
    _keys: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"{type(self).__name__}: k must be a positive count, got {self.k}")

    def prepare(self, graph: CSRGraph) -> None:
        """Precompute what ``sample`` reads of ``graph`` (called once, before sampling)."""
        self._num_nodes = graph.num_nodes
        self._keys = graph_keys(graph) if self.strict else None

    def sample(self, src: Tensor, dst: Tensor, graph: CSRGraph) -> tuple[Tensor, Tensor]:
        """``k`` negatives ``(src[i], v')`` per positive ``(src[i], dst[i])``, as ``(neg_src, neg_dst)``."""
        if self._num_nodes != graph.num_nodes:
            self.prepare(graph)
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(
                f"{type(self).__name__}: src and dst must be 1-D of one length, got {tuple(src.shape)} "
                f"and {tuple(dst.shape)}"
            )
        neg_src = src.repeat_interleave(self.k)
        neg_dst = self._draw(neg_src.numel(), neg_src.device)
        if not self.strict:
            return neg_src, neg_dst
        if self._keys.device != neg_src.device:
            self._keys = self._keys.to(neg_src.device)  # moved once, not per batch
        keys = self._keys
        bad = torch.nonzero(self._rejected(keys, neg_src, neg_dst)).reshape(-1)
        for _ in range(STRICT_REDRAWS):
            if bad.numel() == 0:
                break
            neg_dst[bad] = self._draw(bad.numel(), neg_src.device)
            bad = bad[self._rejected(keys, neg_src[bad], neg_dst[bad])]
        if bad.numel():
            keep = torch.ones(neg_src.numel(), dtype=torch.bool, device=neg_src.device)
            keep[bad] = False
            return neg_src[keep], neg_dst[keep]
        return neg_src, neg_dst

    def _rejected(self, keys: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        return (src == dst) | contains(keys, pair_keys(src, dst, self._num_nodes))

    def _draw(self, count: int, device: torch.device) -> Tensor:
        raise NotImplementedError


@dataclass
class UniformNegatives(_Negatives):
    """Destinations uniform over all nodes (DGL's ``PerSourceUniform``, OGB's citation2 negatives)."""

    def _draw(self, count: int, device: torch.device) -> Tensor:
        return torch.randint(0, self._num_nodes, (count,), device=device, generator=sampling_generator())


@dataclass
class DegreeNegatives(_Negatives):
    """Destinations with probability proportional to ``degree ** power`` (in-degree, the row
    length of the CSR): word2vec's unigram^0.75 noise distribution (Mikolov et al. 2013), as in
    the degree-based negative sampler of DGL's link-prediction guide. Hubs, which a model would
    otherwise learn to score high regardless of the source, appear as negatives often; nodes of
    degree 0 never do."""

    power: float = 0.75
    _cdf: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def prepare(self, graph: CSRGraph) -> None:
        """The cumulative ``degree ** power`` distribution (float64), besides the shared state."""
        super().prepare(graph)
        weights = graph.in_degrees().to(torch.float64).pow(self.power)
        weights[graph.in_degrees() == 0] = 0.0  # 0 ** 0 is 1: an isolated node is never drawn
        if not bool(weights.sum() > 0):
            raise ValueError("DegreeNegatives: the graph has no edges, so no node has a degree to draw by")
        self._cdf = torch.cumsum(weights, 0)

    def _draw(self, count: int, device: torch.device) -> Tensor:
        if self._cdf.device != device:
            self._cdf = self._cdf.to(device)  # moved once, not per batch
        cdf = self._cdf
        u = torch.rand(count, dtype=torch.float64, device=device, generator=sampling_generator())
        return torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=cdf.numel() - 1)
