"""Callback that logs a strategy's communication counters (``MQGNNStrategy.comm_stats``) through
the LightningModule's logger."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override


class CommStatsMonitor(Callback):
    """Logs ``strategy.comm_stats`` (steps, syncs, gradient wait seconds, ...) as ``comm/<name>`` on
    the steps the trainer's logger writes (``log_every_n_steps``) and at the last batch of each
    epoch, so the final counts are in ``trainer.callback_metrics``; ``log_dict`` costs Python time
    per key, which a per-step call would add to every step. Does nothing under other strategies."""

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stats = getattr(trainer.strategy, "comm_stats", None)
        every = trainer.log_every_n_steps
        due = trainer.is_last_batch or (every > 0 and trainer.global_step % every == 0)
        if stats is None or not due:
            return
        pl_module.log_dict({f"comm/{k}": v for k, v in stats.as_dict().items()}, on_step=True, on_epoch=False)
