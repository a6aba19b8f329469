"""Graph storage, dataset loaders (generated, npz, OGB) and load-time validation."""

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.generated import PRESETS, generate_graph
from lightning_mqgnn.graph.npz import load_npz
from lightning_mqgnn.graph.ogb import load_ogb
from lightning_mqgnn.graph.validate import GraphReport, describe_graph, validate_dataset

__all__ = [
    "PRESETS",
    "CSRGraph",
    "GraphDataset",
    "GraphReport",
    "describe_graph",
    "generate_graph",
    "load_npz",
    "load_ogb",
    "validate_dataset",
]
