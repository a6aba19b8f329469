"""Validation cadence bounded by its share of the wall time."""

from __future__ import annotations

import math
import time

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override


class ValidationTimeBudget(pl.Callback):
    """Validate every ``every_batches`` training batches while validation has taken at most
    ``share`` of the fit's wall time so far; skip a due validation otherwise. The first validation
    comes at the end of the first epoch, or after ``every_batches`` batches if that is later.

    Exact full-neighbourhood inference costs one pass over every node of the graph: a few
    milliseconds on a citation graph, where validating every few batches is what finds the best
    model soonest, but hundreds of training batches on a graph of a million nodes, where the same
    cadence in batches spends nearly all the time validating. A budget in time adapts the cadence
    to the graph. The first validation waits for an epoch because its cost is unknown until it
    has run once.

    The callback takes over the Trainer's validation schedule (its ``val_check_interval`` and
    ``check_val_every_n_epoch`` are not used in ``fit``). Which batches it validates after depends
    on the machine's speed, so a rerun validates elsewhere; the batches trained on do not change.
    Under several ranks rank 0's clock decides and every rank validates after the same batch.
    """

    def __init__(self, share: float = 0.5, every_batches: int = 10):
        if not 0 < share <= 1:
            raise ValueError(f"ValidationTimeBudget: share={share} is not in (0, 1]")
        if every_batches < 1:
            raise ValueError(f"ValidationTimeBudget: every_batches={every_batches} is not a positive count")
        self.share = share
        self.every_batches = every_batches
        self.validations = 0
        self.validating_s = 0.0
        self._started = 0.0
        self._batches_since = 0
        self._validation_began: float | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Lightning's time-based schedule validates once the interval has passed since the last
        # validation: 0 after the batch this callback picks, never otherwise
        trainer.check_val_every_n_epoch = None
        trainer._val_check_time_interval = math.inf

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.validations, self.validating_s = 0, 0.0
        self._started, self._batches_since = time.monotonic(), 0

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._validation_began = time.monotonic()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int
    ) -> None:
        # a validation ends when training resumes: its checkpoint and early-stopping callbacks count
        self._close_validation()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close_validation()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._batches_since += 1
        due = self._check_now(trainer, batch_idx)
        if due:
            elapsed = time.monotonic() - self._started
            # all ranks reach this check after the same batch; rank 0's clock decides for all
            due = bool(trainer.strategy.broadcast(self.validating_s <= self.share * elapsed))
        if due:
            self._batches_since = 0
        trainer._val_check_time_interval = 0.0 if due else math.inf

    def _check_now(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        """Whether this batch is one at which a validation may be due (the same on every rank)."""
        if self._batches_since < self.every_batches:
            return False
        if self.validations > 0:
            return self._batches_since % self.every_batches == 0
        # the first: once the first epoch is over, and at least every_batches batches in
        return trainer.current_epoch > 0 or batch_idx + 1 >= trainer.num_training_batches

    def _close_validation(self) -> None:
        if self._validation_began is not None:
            self.validating_s += time.monotonic() - self._validation_began
            self.validations += 1
            self._validation_began = None
