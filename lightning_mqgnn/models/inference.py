"""Exact full-neighbourhood, layer-by-layer inference for validation and test.

Sampled blocks estimate an exact operator (``Sampler.aggregation``); evaluation applies that
operator without sampling, one layer at a time over every node, as Chen et al. and DGL do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.sampling.batch import Block
from lightning_mqgnn.sampling.exact import edge_weights, full_block


@dataclass
class FullGraphBatch:
    """The single "batch" of a validation or test loader: score ``nodes`` of ``dataset``."""

    dataset: GraphDataset
    nodes: Tensor
    split: str


class FullGraphInference:
    """Full blocks of one graph, built once and reused at every validation.

    Destinations are split into chunks of at most ``MAX_EDGES`` edges so memory stays bounded on
    graphs with hundreds of millions of edges.
    """

    MAX_EDGES = 50_000_000

    def __init__(self, dataset: GraphDataset, aggregation: str):
        self.dataset = dataset
        self.aggregation = aggregation
        self._weights = edge_weights(dataset.graph, aggregation)
        self._all_chunks: list[tuple[Tensor, Block]] | None = None
        # the last layer's, for the nodes of the latest call (a loader scores the same tensor each time)
        self._scored: tuple[Tensor, list[tuple[Tensor, Block]]] | None = None

    def _chunks(self, dst: Tensor) -> list[tuple[Tensor, Block]]:
        graph = self.dataset.graph
        deg = (graph.indptr[dst + 1] - graph.indptr[dst] + 1).cumsum(0)
        chunk_id = torch.div(deg - 1, self.MAX_EDGES, rounding_mode="floor")
        out = []
        for c in torch.unique(chunk_id).tolist():
            part = dst[chunk_id == c]
            block, _ = full_block(graph, part, *self._weights)
            out.append((part, block))
        return out

    @torch.no_grad()
    def run(
        self,
        layers: Sequence[nn.Module],
        between: Callable[[Tensor], Tensor],
        nodes: Tensor,
        device: torch.device,
    ) -> Tensor:
        """Outputs of the last layer for ``nodes``; ``between`` is applied after every other layer,
        to a tensor of its own that it may overwrite (``torch.relu_``: no second copy of every
        node's hidden state)."""
        h = self.dataset.features.to(device)
        for i, layer in enumerate(layers):
            last = i == len(layers) - 1
            if last:
                if self._scored is None or self._scored[0] is not nodes:
                    self._scored = (nodes, self._chunks(nodes))
                chunks = self._scored[1]
            else:
                if self._all_chunks is None:
                    self._all_chunks = self._chunks(torch.arange(self.dataset.num_nodes))
                chunks = self._all_chunks
            outs = [layer(block.to(device), h, h.index_select(0, dst.to(device))) for dst, block in chunks]
            h = torch.cat(outs) if len(outs) > 1 else outs[0]
            if not last:
                h = between(h)
        return h


class FullGraphLoader:
    """A loader of exactly one ``FullGraphBatch`` (Lightning reads a list as several loaders)."""

    def __init__(self, dataset: GraphDataset, nodes: Tensor, split: str):
        self.batch = FullGraphBatch(dataset, nodes, split)

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        yield self.batch
