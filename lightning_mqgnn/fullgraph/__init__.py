"""Full-graph distributed training on graph partitions: METIS partitions and halo exchange
(``partition``, ``halo``), stochastic quantisation with an adaptive bit width (``quantize``,
``adaptive``), and the ``graph_parallel``, ``pipegcn`` and ``pipeqs`` Lightning strategies."""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_mqgnn.fullgraph.adaptive import AdaptiveRule, BitWidthController, MessagePolicy
from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.data import FullGraphDataModule, partition_batch
from lightning_mqgnn.fullgraph.halo import MAX_STALENESS, HaloExchanger
from lightning_mqgnn.fullgraph.module import FullGraphNodeClassifier
from lightning_mqgnn.fullgraph.partition import LocalPartition, PartitionBook, graph_fingerprint
from lightning_mqgnn.fullgraph.strategy import VARIANTS, FullGraphStrategy
from lightning_mqgnn.fullgraph.transport import HaloExchangeError, Transport

FullGraphStrategy.register_strategies(StrategyRegistry)

__all__ = [
    "MAX_STALENESS",
    "VARIANTS",
    "AdaptiveRule",
    "BitWidthController",
    "FullGraphDataModule",
    "FullGraphNodeClassifier",
    "FullGraphStrategy",
    "HaloExchangeError",
    "HaloExchanger",
    "LocalPartition",
    "MessagePolicy",
    "PartitionBatch",
    "PartitionBook",
    "Transport",
    "graph_fingerprint",
    "partition_batch",
]
