"""Exact full-neighbourhood, layer-by-layer inference for validation and test.

Sampled blocks estimate an exact operator (``Sampler.aggregation``); evaluation applies that
operator without sampling, one layer at a time over every node, as Chen et al. and DGL do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.sampling.base import row_positions
from lightning_mqgnn.sampling.batch import Block
from lightning_mqgnn.sampling.exact import edge_weights, full_block


@dataclass
class FullGraphBatch:
    """The single "batch" of a validation or test loader: score ``nodes`` of ``dataset``."""

    dataset: GraphDataset
    nodes: Tensor
    split: str


class FullGraphInference:
    """Full blocks of one graph, built once per set of scored nodes and reused at every validation.

    Layer ``l`` computes only the rows that the layers after it read: the scored nodes for the
    last layer, and for each layer below the rows above together with their in-neighbours, as long
    as those are fewer than ``CLOSURE_SHARE`` of the graph; every node otherwise (then each chunk's
    rows are a slice of the CSR, used as they are). Validation sets of a few percent of a large
    graph thus skip a third or more of the first layer's work, and a graph whose hidden states of
    every node would not fit in memory can still be scored on a small split. Destinations are
    split into chunks of at most ``MAX_EDGES`` edges so memory stays bounded on graphs with
    hundreds of millions of edges.
    """

    MAX_EDGES = 50_000_000
    CLOSURE_SHARE = 0.8

    def __init__(self, dataset: GraphDataset, aggregation: str):
        self.dataset = dataset
        self.aggregation = aggregation
        self._weights = edge_weights(dataset.graph, aggregation)
        self._all_chunks: list[tuple[Tensor, Block]] | None = None
        # per scored tensor (a loader scores the same tensor each time): each layer's chunks
        self._plans: dict[int, tuple[Tensor, list[list[tuple[Tensor, Block]]]]] = {}

    def rows_per_layer(self, nodes: Tensor, num_layers: int) -> list[Tensor | None]:
        """The global ids of the rows each layer computes (None: every node), the last layer's
        ``nodes``: for each layer below, the rows of the one above and their in-neighbours."""
        graph = self.dataset.graph
        rows: list[Tensor | None] = [nodes]
        for _ in range(num_layers - 1):
            above = rows[0]
            if above is None:
                rows.insert(0, None)
                continue
            starts = graph.indptr[above]
            needed = torch.zeros(graph.num_nodes, dtype=torch.bool)
            needed[above] = True
            needed[graph.indices[row_positions(starts, graph.indptr[above + 1] - starts)]] = True
            below = needed.nonzero().squeeze(1)
            rows.insert(0, below if below.numel() < self.CLOSURE_SHARE * graph.num_nodes else None)
        return rows

    def _plan(self, nodes: Tensor, num_layers: int) -> list[list[tuple[Tensor, Block]]]:
        """Per layer, its chunks: the positions of their destinations among the layer's input rows
        (for their self features), and their blocks over those rows."""
        rows = self.rows_per_layer(nodes, num_layers)
        plan = []
        for inputs, outputs in zip([None, *rows[:-1]], rows):
            if outputs is None:
                if self._all_chunks is None:
                    self._all_chunks = self._chunks(torch.arange(self.dataset.num_nodes))
                plan.append(self._all_chunks)
                continue
            chunks = self._chunks(outputs)
            if inputs is not None:  # global source ids -> positions among the input rows
                chunks = [
                    (
                        torch.searchsorted(inputs, dst),
                        replace(
                            block,
                            num_src=inputs.numel(),
                            indices=torch.searchsorted(inputs, block.indices),
                            dst_in_src=False,
                        ),
                    )
                    for dst, block in chunks
                ]
            plan.append(chunks)
        return plan

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
        entry = self._plans.get(id(nodes))
        if entry is None or entry[0] is not nodes:
            entry = self._plans[id(nodes)] = (nodes, self._plan(nodes, len(layers)))
        h = self.dataset.features.to(device, compute_dtype(self.dataset.features.dtype))
        for i, (layer, chunks) in enumerate(zip(layers, entry[1])):
            outs = [layer(block.to(device), h, h.index_select(0, dst.to(device))) for dst, block in chunks]
            h = torch.cat(outs) if len(outs) > 1 else outs[0]
            if i < len(layers) - 1:
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
