"""Per-batch wall time and total training time of a fit (the paper's batch time)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from lightning_mqgnn.callbacks.clock import TrainingClock, trimmed, trimmed_mean


class BatchTimer(pl.Callback):
    """Wall time of every training batch (``TrainingClock``: waiting for data counts, validation
    does not) and the total training time of ``fit``, validation excluded. On CUDA only the epoch
    and validation boundaries synchronise the device: a wait for the GPU every step would stop the
    host from queueing the next step's kernels, so a batch's time is the pace of the slower side."""

    def __init__(self, trim: int = 20):
        self.trim = trim
        self.batch_times: list[float] = []
        self.train_time = 0.0
        self.clock = TrainingClock()
        self._fit_start = 0.0
        self._earlier_train_time = 0.0  # before the checkpoint this fit resumed from
        self._fitting = False
        self._in_fit = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._fitting = stage == "fit"

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.ckpt_path is None:  # else load_state_dict has put the earlier batches here
            self.batch_times.clear()
            self._earlier_train_time = 0.0
        self._fit_start = self.clock.fit_start(pl_module.device)
        self._in_fit = True

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.train_epoch_start()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batch_times.append(self.clock.train_batch_end()[1])

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.validation_start()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.validation_end()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_time = self._train_time_so_far()
        self._in_fit = False

    def _train_time_so_far(self) -> float:
        if not self._in_fit:  # a checkpoint written after the fit: its time is final
            return self.train_time
        return (
            self._earlier_train_time
            + self.clock.now(boundary=True)
            - self._fit_start
            - self.clock.validation_s
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"batch_times": list(self.batch_times), "train_time_s": self._train_time_so_far()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._fitting:
            return
        self.batch_times = list(state_dict["batch_times"])
        self._earlier_train_time = state_dict["train_time_s"]

    @property
    def batch_time(self) -> float:
        return trimmed_mean(self.batch_times, self.trim)

    def summary(self) -> dict[str, float]:
        kept = trimmed(self.batch_times, self.trim)
        mean = self.batch_time
        std = (sum((t - mean) ** 2 for t in kept) / max(len(kept) - 1, 1)) ** 0.5 if kept else float("nan")
        return {
            "batches": len(self.batch_times),
            "batch_time_ms": 1000.0 * mean,
            "batch_time_std_ms": 1000.0 * std,
            "train_time_s": self.train_time,
        }
