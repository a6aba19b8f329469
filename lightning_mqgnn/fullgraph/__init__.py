"""Full-graph distributed training: METIS partitions and halo exchange (``partition``, ``halo``),
an adaptive bit width for the quantised halo (``adaptive``, over ``lightning_mqgnn.quantize``), the
``graph_parallel``, ``pipegcn`` and ``pipeqs`` Lightning strategies over partitions, and GNNPipe's
layer pipeline over graph chunks (``layout``, ``chunks``, ``layer_pipeline``; strategy ``gnnpipe``)."""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_mqgnn.fullgraph.adaptive import AdaptiveRule, BitWidthController, MessagePolicy
from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.chunks import Chunk, chunk_partition
from lightning_mqgnn.fullgraph.data import FullGraphDataModule, partition_batch
from lightning_mqgnn.fullgraph.gnnpipe import GNNPipeStrategy
from lightning_mqgnn.fullgraph.halo import MAX_STALENESS, HaloExchanger
from lightning_mqgnn.fullgraph.layer_pipeline import LayerPipeline, Staleness
from lightning_mqgnn.fullgraph.layout import PipelineLayout
from lightning_mqgnn.fullgraph.module import FullGraphNodeClassifier
from lightning_mqgnn.fullgraph.partition import LocalPartition, PartitionBook, graph_fingerprint
from lightning_mqgnn.fullgraph.stacks import ConvStack, GCNIIStack
from lightning_mqgnn.fullgraph.strategy import VARIANTS, FullGraphStrategy
from lightning_mqgnn.fullgraph.transport import HaloExchangeError, Transport

FullGraphStrategy.register_strategies(StrategyRegistry)
GNNPipeStrategy.register_strategies(StrategyRegistry)

__all__ = [
    "MAX_STALENESS",
    "VARIANTS",
    "AdaptiveRule",
    "BitWidthController",
    "Chunk",
    "ConvStack",
    "FullGraphDataModule",
    "FullGraphNodeClassifier",
    "FullGraphStrategy",
    "GCNIIStack",
    "GNNPipeStrategy",
    "HaloExchangeError",
    "HaloExchanger",
    "LayerPipeline",
    "LocalPartition",
    "MessagePolicy",
    "PartitionBatch",
    "PartitionBook",
    "PipelineLayout",
    "Staleness",
    "Transport",
    "chunk_partition",
    "graph_fingerprint",
    "partition_batch",
]
