"""The work of a training batch and of exact inference, in rows and edges touched: the unit in
which the validation schedule weighs validating against training (``ValidationWorkBudget``).

Each layer of a sampled batch reads its block's source rows and aggregates over its edges;
exact inference does the same over the rows it computes (every node, or the in-neighbourhood
closure of the scored nodes) and their in-edges. Counted from the data alone, the same batches
and the same graph weigh the same on any machine, at any load, so a schedule drawn in this unit
validates after the same batches wherever it runs. Feature widths are left out, so a row and an
edge weigh the same at any width: where exact inference is mostly edges at a small width
(tolokers: a million edges, 10 features), a validation weighs about ten times its share of the
time.
"""

from __future__ import annotations

from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.batch import MiniBatch

# a training batch's forward, then its backward (the gradients of the inputs and of the
# weights: about two forwards' work); inference runs the forward alone
TRAINING_PASSES = 3


def batch_work(batch: MiniBatch) -> int:
    """Rows and edges a training step touches: each block's source rows and edges, forward and
    backward."""
    return TRAINING_PASSES * sum(block.num_src + block.num_edges for block in batch.blocks)


def inference_work(graph: CSRGraph, rows_per_layer: list[Tensor | None]) -> int:
    """Rows and edges exact inference touches computing ``rows_per_layer`` (global ids per layer,
    None: every node; ``FullGraphInference.rows_per_layer``): each computed row and its in-edges."""
    degrees = graph.indptr[1:] - graph.indptr[:-1]
    work = 0
    for rows in rows_per_layer:
        if rows is None:
            work += graph.num_nodes + graph.num_edges
        else:
            work += rows.numel() + int(degrees[rows].sum())
    return work
