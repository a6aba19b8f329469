"""Export a ``MiniBatch`` in PyTorch Geometric's bipartite form, so PyG layers run on our batches.

Each block becomes an ``edge_index`` under PyG's default ``source_to_target`` flow: row 0 holds
source-local ids (into the block's ``num_src`` input rows), row 1 destination-local ids (into
its ``num_dst`` output rows), with ``size = (num_src, num_dst)`` and one ``edge_weight`` per edge.
The weights carry every normalisation and importance weight (eq. 2-3, 17): give them to layers
that take ``edge_weight`` and do not normalise again, e.g. ``GCNConv(normalize=False)``. With
node-wise samplers the destinations are the first ``num_dst`` sources, so the destination rows
of a layer's input are ``x[:num_dst]``, as PyG's bipartite layers expect.

Only tensors are built here: PyG itself is not imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.sampling.batch import Block, MiniBatch, check_exportable


@dataclass
class PyGBlock:
    """One layer in PyG's form: ``conv((x, x[:size[1]]), edge_index)``, or with ``edge_weight``."""

    edge_index: Tensor  # int64 [2, E]: source-local ids, destination-local ids
    edge_weight: Tensor  # float32 [E]
    size: tuple[int, int]  # (num_src, num_dst)


@dataclass
class PyGBatch:
    """A mini-batch in PyG's form: ``blocks[0]`` is the input layer; ``x`` the input rows (global
    ids ``n_id``), ``y`` the labels of the ``batch_size`` output nodes ``output_nodes``."""

    blocks: list[PyGBlock]
    n_id: Tensor
    output_nodes: Tensor
    x: Tensor | None
    y: Tensor | None

    @property
    def batch_size(self) -> int:
        return int(self.output_nodes.numel())


def block_to_pyg(block: Block) -> PyGBlock:
    """Edge ``i`` is entry ``i`` of the block's CSR: (source ``indices[i]``, its destination row)."""
    edge_index = torch.stack([block.indices, block.dst_ids()])
    return PyGBlock(edge_index=edge_index, edge_weight=block.weights, size=(block.num_src, block.num_dst))


def to_pyg(batch: MiniBatch, cache: Tensor | None = None) -> PyGBatch:
    """All layers, input layer first, with the gathered input features (merged with ``cache``
    rows when gathered against a feature cache) and labels.

    Refuses a batch whose first layer was aggregated in the gather stage (``batch.aggregated``):
    PyG layers read the input rows themselves.
    """
    check_exportable(batch, "PyG")
    return PyGBatch(
        blocks=[block_to_pyg(b) for b in batch.blocks],
        n_id=batch.input_nodes,
        output_nodes=batch.output_nodes,
        x=batch.input_features(cache) if batch.features is not None else None,
        y=batch.labels,
    )
