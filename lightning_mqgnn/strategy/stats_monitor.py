"""Callback that logs MQGNNStrategy's communication counters through the LightningModule's logger."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override


class CommStatsMonitor(Callback):
    """Logs ``strategy.comm_stats`` (steps, syncs, gradient wait seconds, ...) as ``comm/<name>`` every
    ``every_n_steps`` training batches; does nothing under other strategies."""

    def __init__(self, every_n_steps: int = 1) -> None:
        if every_n_steps < 1:
            raise ValueError(f"CommStatsMonitor: every_n_steps must be >= 1, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stats = getattr(trainer.strategy, "comm_stats", None)
        if stats is None or (batch_idx + 1) % self.every_n_steps:
            return
        pl_module.log_dict({f"comm/{k}": v for k, v in stats.as_dict().items()}, on_step=True, on_epoch=False)
