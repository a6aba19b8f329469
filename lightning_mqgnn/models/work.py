"""The work of a training batch and of exact inference, counted from the data and the model's
widths: the unit in which the validation schedule weighs validating against training
(``ValidationWorkBudget``).

A layer over a block does two kinds of work: its dense maps (multiply-adds, one per weight
element per row they map) and its aggregation (every edge sums one source row into its
destination, an element per column). It takes the cheaper order, aggregating its inputs first or
transforming its sources first, as ``layers.transform_first`` decides. Counted from the blocks,
the graph and the parameters' shapes, the same batches and the same graph weigh the same on any
machine, at any load, so a schedule drawn in this unit validates after the same batches wherever
it runs.

The constants weigh the kinds of work against each other as the 2-core VM runs them (SAGE 5,5,
hidden 128, ten graphs from 3k to 200k nodes, 10 to 8,415 features: measured validation over
batch time within a factor 1.9 of this estimate on all ten). A multiply-add of a dense product
is the unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor, nn

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.batch import MiniBatch

# an aggregated element (a source row's column read at random and added to its destination's)
# costs about as much as 16 multiply-adds of a dense product, which streams cached operands
EDGE_ELEMENT_WORK = 16
# a non-zero of sparse features multiplied by a layer's weights (``layers.unbiased_linear``) adds
# a row of the weights per output column: read in the order of the non-zeros' columns from a
# matrix small enough to stay cached, each about 4 multiply-adds' worth
SPARSE_ELEMENT_WORK = 4
# a training step's fixed cost (Python, kernel launches, the optimiser's step): about 2.5 ms,
# what a dense product does in multiply-adds in that time
STEP_WORK = 80_000_000
# a layer's forward, then its backward (the gradients of its inputs and of its weights: about two
# forwards); the input layer needs no input gradient (its inputs are data): two passes
TRAINING_PASSES = 3
INPUT_LAYER_PASSES = 2


@dataclass(frozen=True)
class LayerWidth:
    """What a layer's work scales with: its input and output widths, and the multiply-adds its
    dense maps do per row (the elements of its weight matrices: ``2 in out`` for SAGE's two
    halves, ``in out`` for GCN)."""

    inputs: int
    outputs: int
    multiply_adds: int


def layer_widths(layers: Iterable[nn.Module]) -> list[LayerWidth]:
    """Each layer's ``LayerWidth`` from the shapes of its matrix parameters (``[out, in]``, as
    ``nn.Linear`` stores them): the first gives the widths, all of them the multiply-adds per row.
    So our layers, PyG's and GCNII's are weighed alike, whatever their maps are called."""
    widths = []
    for i, layer in enumerate(layers):
        matrices = [p for p in layer.parameters() if p.dim() == 2]
        if not matrices:
            raise ValueError(f"layer {i} ({type(layer).__name__}) has no weight matrix to weigh its work by")
        outputs, inputs = matrices[0].shape
        widths.append(LayerWidth(int(inputs), int(outputs), sum(p.numel() for p in matrices)))
    return widths


def layer_work(num_src: int, num_dst: int, num_edges: int, width: LayerWidth) -> float:
    """A layer's forward over a block, in the cheaper of its two orders: aggregate the sources'
    inputs then map the destinations, or map the sources then aggregate their outputs."""
    aggregate_first = num_edges * width.inputs * EDGE_ELEMENT_WORK + num_dst * width.multiply_adds
    transform_first = num_src * width.multiply_adds + num_edges * width.outputs * EDGE_ELEMENT_WORK
    return float(min(aggregate_first, transform_first))


def batch_work(batch: MiniBatch, widths: list[LayerWidth]) -> float:
    """A training step on ``batch``: each block's layer forward and backward, plus the step's fixed
    cost. With the first layer aggregated in the gather stage (``MiniBatch.aggregated``) that
    aggregation runs once, and the step maps its destinations forward and for the weights'
    gradient."""
    work = float(STEP_WORK)
    for i, (block, width) in enumerate(zip(batch.blocks, widths, strict=True)):
        if i == 0 and batch.aggregated is not None:
            work += block.num_edges * width.inputs * EDGE_ELEMENT_WORK
            work += INPUT_LAYER_PASSES * block.num_dst * width.multiply_adds
        else:
            passes = INPUT_LAYER_PASSES if i == 0 else TRAINING_PASSES
            work += passes * layer_work(block.num_src, block.num_dst, block.num_edges, width)
    return work


def inference_work(
    graph: CSRGraph,
    rows_per_layer: list[Tensor | None],
    widths: list[LayerWidth],
    input_nonzeros: int | None = None,
) -> float:
    """Exact inference computing ``rows_per_layer`` (global ids per layer, None: every node;
    ``FullGraphInference.rows_per_layer``): each layer over its rows' in-edges, its sources the
    rows below (every node for the input layer). ``input_nonzeros``: the features' non-zeros
    where the first layer maps them as a sparse matrix (``FullGraphInference``: every node's
    rows, at the cost of their non-zeros), then aggregates the mapped rows."""
    degrees = graph.indptr[1:] - graph.indptr[:-1]
    work = 0.0
    num_src = graph.num_nodes
    for i, (rows, width) in enumerate(zip(rows_per_layer, widths, strict=True)):
        if rows is None:
            num_dst, num_edges = graph.num_nodes, graph.num_edges
        else:
            num_dst, num_edges = rows.numel(), int(degrees[rows].sum())
        if i == 0 and input_nonzeros is not None:
            per_input = width.multiply_adds / max(1, width.inputs) * SPARSE_ELEMENT_WORK
            work += input_nonzeros * per_input + num_edges * width.outputs * EDGE_ELEMENT_WORK
        else:
            work += layer_work(num_src, num_dst, num_edges, width)
        num_src = num_dst
    return work
