"""MQGNNStrategy (RaCoM gradient queues + periodic model sync), its registry names and the
quantised-gradient comm hook."""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_mqgnn.strategy.checkpoint_io import AtomicCheckpointIO, CheckpointError
from lightning_mqgnn.strategy.comm import CommStats
from lightning_mqgnn.strategy.mqgnn import CHECKPOINT_KEY, MQGNNStrategy
from lightning_mqgnn.strategy.quantize_hook import QuantizeState, quantize_hook
from lightning_mqgnn.strategy.rank_failure import RankFailure
from lightning_mqgnn.strategy.sync_period import (
    DEFAULT_SYNC_SCALE,
    FALLBACK_SYNC_PERIOD,
    GraphSize,
    graph_size_from_datamodule,
    sync_period,
)


def register_strategies() -> None:
    """Make ``Trainer(strategy="mqgnn")`` and ``"mqgnn_spawn"`` resolve (idempotent)."""
    MQGNNStrategy.register_strategies(StrategyRegistry)


register_strategies()

__all__ = [
    "CHECKPOINT_KEY",
    "AtomicCheckpointIO",
    "CheckpointError",
    "DEFAULT_SYNC_SCALE",
    "FALLBACK_SYNC_PERIOD",
    "CommStats",
    "GraphSize",
    "MQGNNStrategy",
    "QuantizeState",
    "RankFailure",
    "graph_size_from_datamodule",
    "quantize_hook",
    "register_strategies",
    "sync_period",
]
