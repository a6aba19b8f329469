"""Export a ``MiniBatch`` as DGL blocks (MFGs), so ``dgl.nn`` layers run on our samplers' batches.

Counts are set explicitly (DGL would otherwise infer ``num_src`` from the largest index) and the
per-edge weights travel in ``block.edata["w"]``: they carry every normalisation and importance
weight (eq. 2-3, 17), so use ``GraphConv(norm="none")`` with ``edge_weight=block.edata["w"]``.
DGL is optional and imported inside the function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from lightning_mqgnn.graph.dgl_graph import import_dgl
from lightning_mqgnn.sampling.batch import Block, MiniBatch, check_exportable

if TYPE_CHECKING:
    import dgl


def block_to_dgl(block: Block) -> dgl.Block:
    """One layer: edge ``i`` of the DGL block is entry ``i`` of our CSR (dst -> src-local)."""
    dgl = import_dgl()
    blk = dgl.create_block(
        (block.indices, block.dst_ids()),
        num_src_nodes=block.num_src,
        num_dst_nodes=block.num_dst,
        idtype=block.indices.dtype,
        device=block.indices.device,
    )
    blk.edata["w"] = block.weights
    return blk


def to_dgl_blocks(batch: MiniBatch, cache: Tensor | None = None) -> list[dgl.Block]:
    """All layers, input layer first. When the batch was gathered, ``blocks[0].srcdata["feat"]``
    holds the input features (merged with ``cache`` rows when gathered against a feature cache)
    and ``blocks[-1].dstdata["label"]`` the labels; global ids are in ``srcdata/dstdata[dgl.NID]``
    of the first and last block."""
    dgl = import_dgl()
    check_exportable(batch, "DGL")
    blocks = [block_to_dgl(b) for b in batch.blocks]
    blocks[0].srcdata[dgl.NID] = batch.input_nodes
    blocks[-1].dstdata[dgl.NID] = batch.output_nodes
    if batch.features is not None:
        blocks[0].srcdata["feat"] = batch.input_features(cache)
    if batch.labels is not None:
        blocks[-1].dstdata["label"] = batch.labels
    return blocks
