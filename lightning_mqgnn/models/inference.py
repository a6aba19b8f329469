"""Exact full-neighbourhood, layer-by-layer inference for validation and test.

Sampled blocks estimate an exact operator (``Sampler.aggregation``); evaluation applies that
operator without sampling, one layer at a time over every node, as Chen et al. and DGL do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor, nn

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.graph.features import sparse_rows
from lightning_mqgnn.sampling.base import row_positions
from lightning_mqgnn.sampling.batch import Block
from lightning_mqgnn.sampling.exact import exact_operator, full_block


@dataclass
class FullGraphBatch:
    """The single "batch" of a validation or test loader: score ``nodes`` of ``dataset``."""

    dataset: GraphDataset
    nodes: Tensor
    split: str


@dataclass
class LinkEvalBatch(FullGraphBatch):
    """A link split's fixed pairs to score (``EdgeSeeds.eval_batch``): ``nodes`` are their
    endpoints, each once; ``pos`` and ``neg`` (``[2, P]``, ``[2, M]``) the positive and negative
    pairs as positions in ``nodes``; ``neg_per_source`` (``[P, k]``, or None) each positive's own
    negative destinations (the MRR protocol of ogbl-citation2)."""

    pos: Tensor | None = None
    neg: Tensor | None = None
    neg_per_source: Tensor | None = None


@dataclass
class _Layer:
    """One layer of a plan: the global ids of its input rows (None: every node) and its chunks,
    each its destinations' global ids, with their blocks once built (None: built at each run)."""

    inputs: Tensor | None
    chunks: list[Tensor]
    blocks: list[tuple[Tensor, Block]] | None = None


class FullGraphInference:
    """Full blocks of one graph, built once per set of scored nodes and reused at every validation.

    Layer ``l`` computes only the rows that the layers after it read: the scored nodes for the
    last layer, and for each layer below the rows above together with their in-neighbours, as long
    as those are fewer than ``CLOSURE_SHARE`` of the graph; every node otherwise (then each chunk's
    rows are a slice of the CSR, used as they are). Validation sets of a few percent of a large
    graph thus skip a third or more of the first layer's work, and a graph whose hidden states of
    every node would not fit in memory can still be scored on a small split.

    Memory stays bounded on graphs with billions of edges: destinations are split into chunks of
    at most ``MAX_EDGES`` edges, edge weights come from the node-sized ``ExactOperator`` one chunk
    at a time, the blocks of a plan are kept between validations only while they hold at most
    ``CACHED_EDGES`` edges (else rebuilt chunk by chunk at each run), and half-precision features
    whose float32 copy would exceed ``WIDENED_BYTES`` are read and widened a chunk's source rows
    at a time, the first layer's chunks small enough that those rows take at most that.
    """

    MAX_EDGES = 50_000_000
    CLOSURE_SHARE = 0.8
    CACHED_EDGES = 200_000_000
    WIDENED_BYTES = 2**30

    def __init__(self, dataset: GraphDataset, aggregation: str):
        self.dataset = dataset
        self.aggregation = aggregation
        self._operator = exact_operator(dataset.graph, aggregation)
        # the layers over every node, shared by the plans, by their chunks' edge bound
        self._all_nodes: dict[int, _Layer] = {}
        # per scored tensor (a loader scores the same tensor each time): its layers
        self._plans: dict[int, tuple[Tensor, list[_Layer]]] = {}

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

    def _plan(self, nodes: Tensor, num_layers: int) -> list[_Layer]:
        rows = self.rows_per_layer(nodes, num_layers)
        layers = []
        for i, (inputs, outputs) in enumerate(zip([None, *rows[:-1]], rows)):
            max_edges = self._first_layer_edges() if i == 0 else self.MAX_EDGES
            if outputs is None:
                if max_edges not in self._all_nodes:
                    every = torch.arange(self.dataset.num_nodes)
                    self._all_nodes[max_edges] = _Layer(None, self._chunks(every, max_edges))
                layers.append(self._all_nodes[max_edges])
            else:
                layers.append(_Layer(inputs, self._chunks(outputs, max_edges)))
        graph = self.dataset.graph
        edges = sum(
            int((graph.indptr[c + 1] - graph.indptr[c]).sum()) for layer in layers for c in layer.chunks
        )
        if edges <= self.CACHED_EDGES:
            for layer in layers:
                if layer.blocks is None:
                    layer.blocks = list(self._blocks(layer))
        return layers

    def prepare(self, first: nn.Module, device: torch.device) -> None:
        """Build now what the first ``run`` with ``first`` as its first layer on ``device`` would
        build once and keep: the features as a CSR matrix where it multiplies them so (on
        citeseer's 3327 x 1024 features 9 ms on the 2-core VM, 13 ms at a process's first call:
        longer than a validation). A module calls this when its data are set up, so that the
        first validation takes no longer than the others."""
        self._sparse_inputs(first, device)

    def input_nonzeros(self, first: nn.Module, device: torch.device) -> int | None:
        """The features' non-zeros where ``run`` with ``first`` on ``device`` multiplies them as a
        sparse matrix (its first layer's product then costs them), else None."""
        sparse = self._sparse_inputs(first, device)
        return None if sparse is None else int(sparse.values().numel())

    def _sparse_inputs(self, first: nn.Module, device: torch.device) -> Tensor | None:
        """The features as a sparse CSR matrix where the first layer takes them so (``project``)
        and they are sparse enough (``sparse_rows``, decided once), on the CPU; else None. There
        the first layer's product over every node costs its non-zeros instead of its width: on
        bag-of-words features, where most of exact inference's time goes, several times less.
        A GPU keeps the dense product, cheap there."""
        if device.type != "cpu" or not hasattr(first, "project"):
            return None
        return self._sparse_features

    @cached_property
    def _sparse_features(self) -> Tensor | None:
        if self.dataset.num_features == 0:  # a featureless graph: the model gives the inputs
            return None
        return sparse_rows(self.dataset.features)

    def _widened_by_chunk(self) -> bool:
        """Whether the first layer widens its chunks' source rows one chunk at a time: for
        half-precision features whose float32 copy would take more than ``WIDENED_BYTES`` (the
        same sums either way; the copy is about three times faster)."""
        features = self.dataset.features
        half = compute_dtype(features.dtype) != features.dtype
        return half and features.numel() * 4 > self.WIDENED_BYTES

    def _first_layer_edges(self) -> int:
        """The first layer's chunk bound: ``MAX_EDGES``, or when it widens by chunk few enough
        edges that a chunk's source rows in float32 take at most ``WIDENED_BYTES``."""
        if not self._widened_by_chunk():
            return self.MAX_EDGES
        width = self.dataset.features.shape[1]
        return max(1, min(self.MAX_EDGES, self.WIDENED_BYTES // (4 * width)))

    def _chunks(self, dst: Tensor, max_edges: int) -> list[Tensor]:
        """``dst`` in consecutive parts of at most ``max_edges`` edges (self loops counted)."""
        graph = self.dataset.graph
        deg = (graph.indptr[dst + 1] - graph.indptr[dst] + 1).cumsum(0)
        chunk_id = torch.div(deg - 1, max_edges, rounding_mode="floor")
        return [dst[chunk_id == c] for c in torch.unique(chunk_id).tolist()]

    def _blocks(self, layer: _Layer) -> Iterator[tuple[Tensor, Block]]:
        """Per chunk: the positions of its destinations among the layer's input rows (for their
        self features) and its block over those rows."""
        if layer.blocks is not None:
            yield from layer.blocks
            return
        for dst in layer.chunks:
            block, _ = full_block(self.dataset.graph, dst, self._operator)
            if layer.inputs is not None:  # global source ids -> positions among the input rows
                dst = torch.searchsorted(layer.inputs, dst)
                block = replace(
                    block,
                    num_src=layer.inputs.numel(),
                    indices=torch.searchsorted(layer.inputs, block.indices),
                    dst_in_src=False,
                )
            yield dst, block

    @torch.no_grad()
    def run(
        self,
        layers: Sequence[nn.Module],
        between: Callable[[Tensor], Tensor],
        nodes: Tensor,
        device: torch.device,
        inputs: Tensor | None = None,
    ) -> Tensor:
        """Outputs of the last layer for ``nodes``; ``between`` is applied after every other layer,
        to a tensor of its own that it may overwrite (``torch.relu_``: no second copy of every
        node's hidden state). ``inputs``: every node's input rows in place of the dataset's
        features (a model's learnt node embeddings), read as they are."""
        entry = self._plans.get(id(nodes))
        if entry is None or entry[0] is not nodes:
            entry = self._plans[id(nodes)] = (nodes, self._plan(nodes, len(layers)))
        if inputs is not None:
            if inputs.shape[0] != self.dataset.num_nodes:
                raise ValueError(
                    f"inference inputs have {inputs.shape[0]} rows, the graph {self.dataset.num_nodes} nodes"
                )
            features, widened, sparse, h = inputs, inputs.dtype, None, inputs.to(device)
        else:
            features = self.dataset.features
            widened = compute_dtype(features.dtype)
            sparse = self._sparse_inputs(layers[0], device)
            h = None if sparse is not None or self._widened_by_chunk() else features.to(device, widened)
        for i, (layer, plan) in enumerate(zip(layers, entry[1])):
            outs = []
            projected = layer.project(sparse) if i == 0 and sparse is not None else None
            for dst, block in self._blocks(plan):
                if projected is not None:
                    outs.append(layer.from_projected(block, projected, dst))
                    continue
                if h is None:
                    src, local = torch.unique(block.indices, return_inverse=True)
                    block = replace(block, num_src=src.numel(), indices=local, dst_in_src=False)
                    src_h = features.index_select(0, src).to(device, widened)
                    self_h = features.index_select(0, dst).to(device, widened)
                else:
                    src_h, self_h = h, h.index_select(0, dst.to(device))
                outs.append(layer(block.to(device), src_h, self_h))
            h = torch.cat(outs) if len(outs) > 1 else outs[0]
            if i < len(layers) - 1:
                h = between(h)
        return h


class FullGraphLoader:
    """A loader of exactly one ``FullGraphBatch`` (Lightning reads a list as several loaders)."""

    def __init__(self, dataset: GraphDataset, nodes: Tensor, split: str):
        self.batch = FullGraphBatch(dataset, nodes, split)

    @classmethod
    def of(cls, batch: FullGraphBatch) -> FullGraphLoader:
        """The loader of ``batch`` (e.g. a ``LinkEvalBatch``)."""
        loader = cls.__new__(cls)
        loader.batch = batch
        return loader

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        yield self.batch
