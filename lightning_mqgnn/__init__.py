"""lightning_mqgnn: MQ-GNN multi-queue pipelined GNN training for PyTorch Lightning."""

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.strategy import MQGNNStrategy  # registers strategy="mqgnn" / "mqgnn_spawn"

__all__ = ["Block", "CSRGraph", "GraphDataset", "MQGNNStrategy", "MiniBatch"]
__version__ = "0.1.0"
