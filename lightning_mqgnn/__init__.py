"""lightning_mqgnn: MQ-GNN multi-queue pipelined GNN training for PyTorch Lightning."""

import multiprocessing

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.sampling.batch import Block, MiniBatch

# Device sampler processes (pipeline/sampler_process.py) carry this name, which a spawned child
# knows before it unpickles anything of this package; they sample and need none of Lightning,
# about half of their imports.
SAMPLER_PROCESS_NAME = "mqgnn-device-sampler"
if multiprocessing.current_process().name != SAMPLER_PROCESS_NAME:
    from lightning_mqgnn.strategy import MQGNNStrategy  # registers strategy="mqgnn" / "mqgnn_spawn"

__all__ = ["Block", "CSRGraph", "GraphDataset", "MQGNNStrategy", "MiniBatch"]
__version__ = "0.1.0"
