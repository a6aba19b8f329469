"""The mini-batch types every sampler returns and every model consumes.

A ``Block`` is one layer's bipartite graph (DGL calls it an MFG): ``num_dst`` destination rows,
each listing source-local ids with one weight per edge. Weights carry every normalisation and
importance/debias factor, so a layer computes ``out[i] = sum_e w_e * h_src[src_e]`` and never
re-normalises on its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from lightning_mqgnn.graph.features import CSR_BETA_NOTICE
from lightning_mqgnn.sampling.aggregate import transpose_of, weighted_row_sum, weighted_row_sum_with_self

# CSR sparse-dense products are what every layer runs on
warnings.filterwarnings("ignore", message=CSR_BETA_NOTICE)


BLOCK_TENSORS = ("indptr", "indices", "weights", "src_indptr", "src_rows", "src_weights")


@dataclass
class Block:
    """One layer of a mini-batch: CSR of ``dst -> src-local`` with per-edge weights.

    When ``dst_in_src`` is true the first ``num_dst`` source nodes are the destination nodes
    themselves (node-wise samplers), so a layer may read self features as ``h[:num_dst]``.
    """

    num_dst: int
    num_src: int
    indptr: Tensor  # int64 [num_dst + 1]
    indices: Tensor  # int64 [nnz], in [0, num_src)
    weights: Tensor  # float32 [nnz]
    dst_in_src: bool = True
    # the same edges grouped by source (CSC), for the backward of ``aggregate``: ``with_transpose``
    src_indptr: Tensor | None = None  # int64 [num_src + 1]
    src_rows: Tensor | None = None  # int64 [nnz], each edge's destination row
    src_weights: Tensor | None = None  # float32 [nnz]

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def dst_ids(self) -> Tensor:
        """Destination row of every edge (COO row vector)."""
        counts = self.indptr[1:] - self.indptr[:-1]
        return torch.repeat_interleave(
            torch.arange(self.num_dst, device=self.indptr.device), counts, output_size=self.num_edges
        )

    def with_transpose(self) -> Block:
        """This block with its CSC filled in (``src_indptr``, ``src_rows``, ``src_weights``: the
        edges ordered by source). The backward of ``aggregate`` computes ``Aᵀ g`` from it without
        the sort it would otherwise run on the training step; producers build it when they sample."""
        src_indptr, src_rows, src_weights = transpose_of(
            self.indptr, self.indices, self.weights, self.num_src
        )
        return replace(self, src_indptr=src_indptr, src_rows=src_rows, src_weights=src_weights)

    def _transpose(self) -> tuple[Tensor, Tensor, Tensor] | None:
        if self.src_indptr is None:
            return None
        return self.src_indptr, self.src_rows, self.src_weights

    def adjacency(self) -> Tensor:
        """The weighted ``num_dst x num_src`` matrix as a sparse CSR tensor."""
        return torch.sparse_csr_tensor(
            self.indptr, self.indices, self.weights, size=(self.num_dst, self.num_src), check_invariants=False
        )

    def aggregate(self, h_src: Tensor) -> Tensor:
        """Weighted sum of source rows into each destination: ``A_block @ h_src``.

        A fused weighted row sum (``weighted_row_sum``): no per-edge message tensor, so memory
        stays at the output size even for full-neighbourhood inference blocks.
        """
        if h_src.shape[0] != self.num_src:
            raise ValueError(f"block expects {self.num_src} source rows, got {h_src.shape[0]}")
        return weighted_row_sum(self.indptr, self.indices, self.weights, h_src, self._transpose())

    def aggregate_with_self(self, h_src: Tensor) -> Tensor:
        """``[A_block @ h_src, h_src[:num_dst]]`` side by side (needs ``dst_in_src``), for a layer
        that transforms both halves in one GEMM (``weighted_row_sum_with_self``)."""
        if h_src.shape[0] != self.num_src:
            raise ValueError(f"block expects {self.num_src} source rows, got {h_src.shape[0]}")
        if not self.dst_in_src:
            raise ValueError("aggregate_with_self needs destinations as a source prefix (dst_in_src)")
        return weighted_row_sum_with_self(self.indptr, self.indices, self.weights, h_src, self._transpose())

    def map(self, fn: Callable[[Tensor], Tensor]) -> Block:
        """Apply ``fn`` to every tensor (device moves, pinning)."""
        return replace(
            self, **{name: fn(t) for name in BLOCK_TENSORS if (t := getattr(self, name)) is not None}
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Block:
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))


@dataclass
class MiniBatch:
    """A sampled computation graph for ``output_nodes``; ``blocks[0]`` is the input layer.

    ``input_nodes`` are the global ids of ``blocks[0]``'s sources. Samplers fill the structure;
    the gather stage fills ``features`` (rows of ``input_nodes``) and ``labels`` (of
    ``output_nodes``). With a device feature cache, ``cache_slots[i]`` is the cache row of input
    node ``i`` (or -1) and ``features`` holds only the uncached rows, in input order.

    With the input aggregated in the gather stage, ``features`` is None and ``aggregated`` holds
    what the first layer would compute before its weights: ``[A_0 X, X_dst]`` for mean
    aggregation (GraphSAGE, ``Block.aggregate_with_self``), ``A_0 X`` for GCN (``Block.aggregate``).

    Seeded by edges (link prediction, ``sampling.edge_seeds``), ``output_nodes`` are the scored
    pairs' endpoints, each once; ``pairs`` ``[2, P]`` gives each pair's source and destination as
    positions in ``output_nodes``, and ``pair_labels`` ``[P]`` is 1.0 for a true edge, 0.0 for a
    negative.
    """

    input_nodes: Tensor
    output_nodes: Tensor
    blocks: list[Block]
    features: Tensor | None = None
    labels: Tensor | None = None
    cache_slots: Tensor | None = None
    aggregated: Tensor | None = None
    pairs: Tensor | None = None
    pair_labels: Tensor | None = None
    meta: dict = field(default_factory=dict)  # small per-batch facts (batch index, timings)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def _map_tensors(self, fn: Callable[[Tensor], Tensor]) -> MiniBatch:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = fn(value)
            elif f.name == "blocks":
                value = [b.map(fn) for b in value]
            out[f.name] = value
        return replace(self, **out)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MiniBatch:
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def clone(self) -> MiniBatch:
        """A copy of every tensor, in memory of this process's allocator."""
        return self._map_tensors(torch.clone)

    def pin_memory(self) -> MiniBatch:
        return self._map_tensors(lambda t: t.pin_memory())

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        """Tell the caching allocator these tensors are used on ``stream`` (side-stream hand-off)."""
        self._map_tensors(lambda t: (t.record_stream(stream), t)[1])

    def input_features(self, cache: Tensor | None = None) -> Tensor:
        """Feature rows of ``input_nodes``, merging cached rows from ``cache`` when present."""
        if self.features is None:
            if self.aggregated is not None:
                raise ValueError(
                    "mini-batch carries its first layer's aggregation (batch.aggregated), not feature rows: "
                    "build the DataModule with LoaderSettings(aggregate_inputs=False) to get batch.features"
                )
            raise ValueError("mini-batch has no gathered features; run the gather stage first")
        if self.cache_slots is None:
            return self.features
        if cache is None:
            raise ValueError("mini-batch was gathered against a feature cache, but none was given")
        hit = self.cache_slots >= 0
        out = self.features.new_empty(self.input_nodes.numel(), self.features.shape[1])
        out[hit] = cache.index_select(0, self.cache_slots[hit])
        out[~hit] = self.features
        return out


def check_exportable(batch: MiniBatch, reader: str) -> None:
    """Refuse a batch another library's layers (``reader``: "DGL", "PyG") cannot read: one whose
    first layer was aggregated in the gather stage (they read the input rows themselves), or whose
    blocks do not chain (each layer's destinations are the next layer's sources)."""
    if batch.aggregated is not None:
        raise ValueError(
            f"mini-batch carries its first layer's aggregation, not the input rows {reader} layers read: "
            "build the DataModule with LoaderSettings(aggregate_inputs=False)"
        )
    for i, (lower, upper) in enumerate(zip(batch.blocks, batch.blocks[1:])):
        if lower.num_dst != upper.num_src:
            raise ValueError(
                f"mini-batch block {i} has {lower.num_dst} destination nodes but block {i + 1} has "
                f"{upper.num_src} source nodes"
            )
