"""Mini-batches seeded by edges: link prediction's positives and their negatives, sampled through
any node sampler.

A batch of training edges draws its negatives, asks the node sampler for the blocks of the pairs'
endpoints (each once), and removes the seed edges themselves from those blocks, so no message
carries the label the batch is scored on (PyG's and DGL's ``exclude`` options). The node
samplers, the gather stage and every loader see an ordinary batch of nodes; the pairs and their
labels ride along in ``MiniBatch.pairs`` and ``MiniBatch.pair_labels``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Protocol

import torch
from torch import Tensor

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.edge_keys import contains, pair_keys, sorted_keys
from lightning_mqgnn.graph.link_dataset import LinkDataset
from lightning_mqgnn.graph.link_split import LinkSplit, check_link_split, load_link_split, random_link_split
from lightning_mqgnn.models.inference import FullGraphLoader, LinkEvalBatch
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import Block, MiniBatch

EXCLUDE = ("none", "self", "reverse")


def describe(negatives: object) -> str:
    """A negative sampler as its dataclass fields say, e.g. ``UniformNegatives(k=1, strict=False)``."""
    shown = [f.name for f in fields(negatives) if f.init] if is_dataclass(negatives) else []
    return (
        f"{type(negatives).__name__}({', '.join(f'{name}={getattr(negatives, name)!r}' for name in shown)})"
    )


class NegativeSampler(Protocol):
    """Draws the negatives of a batch's positive pairs (``sampling.negative``)."""

    def prepare(self, graph: CSRGraph) -> None: ...

    def sample(self, src: Tensor, dst: Tensor, graph: CSRGraph) -> tuple[Tensor, Tensor]: ...


@dataclass
class EdgeSeeds:
    """What seeds link-prediction batches: the training positives of ``split``
    (``graph.link_split.LinkSplit``), ``negatives`` drawn for each batch, and which edges a
    batch's message passing leaves out: ``"reverse"`` each seed edge in both directions (an
    undirected graph holds both), ``"self"`` the seed edge alone (a directed graph), ``"none"``
    neither (the positives' own edges then carry their labels into the messages). Validation and
    test score the split's fixed positives and negatives (``eval_batch``)."""

    split: LinkSplit
    negatives: NegativeSampler
    exclude: str = "reverse"

    def __post_init__(self) -> None:
        if self.exclude not in EXCLUDE:
            raise ValueError(f"EdgeSeeds.exclude must be one of {EXCLUDE}, got {self.exclude!r}")

    @property
    def edges(self) -> Tensor:
        return self.split.train

    @property
    def num_seeds(self) -> int:
        return int(self.edges.shape[1])

    def summary(self, dataset: GraphDataset) -> str:
        """One line: the graph messages pass over, and the split's edges and negatives."""
        split = self.split

        def held_out(name: str) -> str:
            per_source = getattr(split, f"{name}_neg_per_source")
            own = "" if per_source is None else f", {per_source.shape[1]} own negatives each"
            pos, neg = getattr(split, f"{name}_pos"), getattr(split, f"{name}_neg")
            return f"{pos.shape[1]:,} positives / {neg.shape[1]:,} negatives{own}"

        kind = "undirected" if split.undirected else "directed"
        features = f"{dataset.num_features} features" if dataset.num_features else "no features"
        return (
            f"{dataset.name}: {dataset.num_nodes:,} nodes, {features}; link split: "
            f"{self.num_seeds:,} {kind} training edges ({dataset.graph.num_edges:,} directed edges pass "
            f"messages), validation {held_out('val')}, test {held_out('test')}; {describe(self.negatives)} "
            f"per batch, exclude {self.exclude}"
        )

    def sampler(self, nodes: Sampler, graph: CSRGraph) -> EdgeSampler:
        """``nodes`` sampling the blocks of these edges' batches over ``graph``."""
        self.negatives.prepare(graph)
        return EdgeSampler(nodes, graph, self.edges, self.negatives, self.exclude)

    def eval_batch(self, dataset: GraphDataset, split: str) -> LinkEvalBatch:
        """The ``split`` ("val" or "test") pairs to score, their endpoints numbered once."""
        pos = getattr(self.split, f"{split}_pos")
        neg = getattr(self.split, f"{split}_neg")
        per_source = getattr(self.split, f"{split}_neg_per_source", None)
        parts = [pos.reshape(-1), neg.reshape(-1)] + ([] if per_source is None else [per_source.reshape(-1)])
        nodes, positions = torch.unique(torch.cat(parts), return_inverse=True)
        pos_at, neg_at, rest = positions.split(
            [pos.numel(), neg.numel(), positions.numel() - pos.numel() - neg.numel()]
        )
        return LinkEvalBatch(
            dataset,
            nodes,
            split,
            pos=pos_at.view(2, -1),
            neg=neg_at.view(2, -1),
            neg_per_source=None if per_source is None else rest.view(per_source.shape),
        )

    def eval_loader(self, dataset: GraphDataset, split: str) -> FullGraphLoader:
        return FullGraphLoader.of(self.eval_batch(dataset, split))


class EdgeSampler:
    """A ``Sampler`` whose seeds are positions in ``edges``: each batch's positives, their
    negatives, and the blocks of their endpoints from ``nodes`` without the positives' own edges
    (``without_edges``). Picklable, drawing from the batch's generator as every sampler does."""

    def __init__(
        self, nodes: Sampler, graph: CSRGraph, edges: Tensor, negatives: NegativeSampler, exclude: str
    ):
        self.nodes = nodes
        self.graph = graph
        self.edges = edges
        self.negatives = negatives
        self.exclude = exclude
        self.num_layers = nodes.num_layers
        self.aggregation = nodes.aggregation

    @property
    def fanouts(self) -> list[int] | None:
        """The node sampler's fan-outs (what the host tier's walk policy follows), if it has them."""
        return getattr(self.nodes, "fanouts", None)

    def sample(self, seeds: Tensor) -> MiniBatch:
        src, dst = self.edges.index_select(1, seeds.to(self.edges.device))
        neg_src, neg_dst = self.negatives.sample(src, dst, self.graph)
        pair_src, pair_dst = torch.cat([src, neg_src]), torch.cat([dst, neg_dst])
        nodes, positions = torch.unique(torch.cat([pair_src, pair_dst]), return_inverse=True)
        batch = self.nodes.sample(nodes)
        if self.exclude != "none":
            batch = without_edges(batch, src, dst, self.exclude == "reverse", self.graph.num_nodes)
        batch.pairs = positions.view(2, -1)
        labels = torch.zeros(pair_src.numel(), dtype=torch.float32, device=nodes.device)
        labels[: src.numel()] = 1.0
        batch.pair_labels = labels
        return batch


def layer_nodes(batch: MiniBatch) -> list[Tensor]:
    """The global ids of every layer's nodes, input layer first: block ``i`` maps layer ``i`` to
    layer ``i + 1``. Node-wise blocks keep each layer's destinations as a prefix of its sources,
    so every layer is a prefix of ``input_nodes``; layer-wise samplers record theirs
    (``meta["layer_nodes"]``)."""
    recorded = batch.meta.get("layer_nodes")
    if recorded is not None:
        return recorded
    if not all(block.dst_in_src for block in batch.blocks):
        raise ValueError(
            "the batch's blocks neither keep destinations as a source prefix nor record their layers' "
            "nodes (meta['layer_nodes']): its seed edges cannot be found in them"
        )
    return [batch.input_nodes[: block.num_src] for block in batch.blocks] + [batch.output_nodes]


def without_edges(
    batch: MiniBatch, src: Tensor, dst: Tensor, both_directions: bool, num_nodes: int
) -> MiniBatch:
    """``batch`` with every block edge that carries a message ``src -> dst`` (and ``dst -> src``
    with ``both_directions``) removed. A row that loses edges has its remaining weights scaled to
    the row's former sum, so a mean stays a mean over the neighbours left."""
    keys = pair_keys(src, dst, num_nodes)
    if both_directions:
        keys = torch.cat([keys, pair_keys(dst, src, num_nodes)])
    keys = sorted_keys(keys)
    layers = layer_nodes(batch)
    blocks = []
    for i, block in enumerate(batch.blocks):
        src_ids, dst_ids = layers[i], layers[i + 1]
        edges = pair_keys(
            src_ids.index_select(0, block.indices), dst_ids.index_select(0, block.dst_ids()), num_nodes
        )
        drop = contains(keys, edges)
        blocks.append(_dropped(block, drop) if bool(drop.any()) else block)
    batch.blocks = blocks
    return batch


def _dropped(block: Block, drop: Tensor) -> Block:
    """``block`` without the edges ``drop`` marks, each row's weights rescaled to its former sum."""
    keep = ~drop
    rows = block.dst_ids()
    kept_rows = rows[keep]
    weights = block.weights[keep]
    before = torch.zeros(block.num_dst, dtype=weights.dtype, device=weights.device).index_add_(
        0, rows, block.weights
    )
    after = torch.zeros_like(before).index_add_(0, kept_rows, weights)
    scale = torch.where(after != 0, before / after, torch.ones_like(after))
    counts = torch.bincount(kept_rows, minlength=block.num_dst)
    indptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    out = replace(
        block,
        indptr=indptr,
        indices=block.indices[keep],
        weights=weights * scale.index_select(0, kept_rows),
        src_indptr=None,
        src_rows=None,
        src_weights=None,
    )
    return out.with_transpose() if block.src_indptr is not None else out


def random_edge_seeds(
    dataset: GraphDataset,
    negatives: NegativeSampler,
    val: float = 0.05,
    test: float = 0.10,
    seed: int = 0,
    undirected: bool = True,
    neg_per_source: int | None = None,
    exclude: str = "reverse",
    split_file: str | None = None,
) -> tuple[GraphDataset, EdgeSeeds]:
    """Link prediction on any dataset: a seeded split of its edges (``random_link_split``: 85/5/10
    by default, fixed negatives for validation and test, with ``neg_per_source`` each positive's
    own negatives for MRR), and the dataset over the training graph, which no held-out edge is
    in. The node features come along; the node labels and splits are not used.

    ``split_file``: a split saved by ``save_link_split`` instead of a drawn one (``val``, ``test``,
    ``seed``, ``undirected`` and ``neg_per_source`` then unused), so that other systems score the
    very same pairs; it is checked against ``dataset``'s graph (its negatives are non-edges)."""
    if split_file is not None:
        training_graph, split = load_link_split(split_file, num_nodes=dataset.num_nodes)
        check_link_split(split, dataset.num_nodes, graph=dataset.graph, source=str(split_file))
        return replace(dataset, graph=training_graph), EdgeSeeds(split, negatives, exclude)
    training_graph, split = random_link_split(
        dataset.graph, val=val, test=test, seed=seed, undirected=undirected, neg_per_source=neg_per_source
    )
    return replace(dataset, graph=training_graph), EdgeSeeds(split, negatives, exclude)


def edge_seeds(
    dataset: GraphDataset | LinkDataset,
    negatives: NegativeSampler,
    val: float = 0.05,
    test: float = 0.10,
    seed: int = 0,
    undirected: bool = True,
    neg_per_source: int | None = None,
    exclude: str = "reverse",
    split_file: str | None = None,
) -> tuple[GraphDataset, EdgeSeeds]:
    """The link task's seeds for whatever the data config gave: a ``LinkDataset`` trains on its
    own split (an OGB benchmark's, or split files; ``val``, ``test``, ``seed``, ``undirected`` and
    ``neg_per_source`` do not apply to it), any other dataset on a seeded random split of its
    edges, or on the split saved in ``split_file`` (``random_edge_seeds``)."""
    if isinstance(dataset, LinkDataset):
        return dataset.dataset, EdgeSeeds(dataset.split, negatives, exclude)
    return random_edge_seeds(
        dataset,
        negatives,
        val=val,
        test=test,
        seed=seed,
        undirected=undirected,
        neg_per_source=neg_per_source,
        exclude=exclude,
        split_file=split_file,
    )
