"""The paper's batch-level early stopping."""

from __future__ import annotations

import lightning.pytorch as pl
from typing_extensions import override


class BatchEarlyStopping(pl.Callback):
    """Stop when ``monitor`` has not improved by at least ``min_delta`` for ``patience_batches``
    consecutive training batches (paper: 0.01 over 200 batches).

    Counted in batches, not validation rounds, so the rule does not depend on how often
    validation runs (``Trainer(val_check_interval=N)``).
    """

    def __init__(self, monitor: str = "val/metric", min_delta: float = 0.01, patience_batches: int = 200):
        self.monitor = monitor
        self.min_delta = min_delta
        self.patience_batches = patience_batches
        self.best = -float("inf")
        self.best_step = 0

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])
        step = trainer.global_step
        if value >= self.best + self.min_delta:
            self.best, self.best_step = value, step
        elif step - self.best_step >= self.patience_batches:
            trainer.should_stop = True

    @override
    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        self.best, self.best_step = state_dict["best"], state_dict["best_step"]
