"""Validation cadence bounded by its share of the work done (the default) or of the wall time."""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override


class ValidationBudget(pl.Callback):
    """Validate every ``every_batches`` training batches while validating stays within ``share``
    of what the fit has spent (subclasses say in what: ``ValidationWorkBudget``,
    ``ValidationTimeBudget``); skip a due validation otherwise. Training that ends after a batch
    whose weights were not validated validates them, so the best checkpoint and early stopping
    see the weights the fit ends with.

    Exact full-neighbourhood inference costs one pass over every node of the graph: a few
    training batches on a citation graph, where validating every few batches is what finds the
    best model soonest, but hundreds on a graph of a million nodes, where the same cadence in
    batches spends nearly all the fit validating. A budget adapts the cadence to the graph.

    The callback takes over the Trainer's validation schedule (its ``val_check_interval`` and
    ``check_val_every_n_epoch`` are not used in ``fit``). Under several ranks rank 0's figures
    decide and every rank validates after the same batch.
    """

    def __init__(self, share: float = 0.25, every_batches: int = 10):
        name = type(self).__name__
        if not 0 < share <= 1:
            raise ValueError(f"{name}: share={share} is not in (0, 1]")
        if every_batches < 1:
            raise ValueError(f"{name}: every_batches={every_batches} is not a positive count")
        self.share = share
        self.every_batches = every_batches
        self.validations = 0
        self._batches_since = 0

    def allows(self) -> bool:
        """Whether a validation now keeps to the budget (on rank 0, which decides for all)."""
        raise NotImplementedError

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
        if trainer.global_step == 0:  # a resumed fit keeps the figures its checkpoint holds
            self.validations, self._batches_since = 0, 0

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.validations += 1
            self._batches_since = 0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._batches_since += 1
        if _training_ends_after(trainer, batch_idx):  # the weights the fit ends with
            due = True
        elif self._check_now(trainer, batch_idx):
            # all ranks reach this check after the same batch; rank 0's figures decide for all
            due = bool(trainer.strategy.broadcast(self.allows()))
        else:
            due = False
        trainer._val_check_time_interval = 0.0 if due else math.inf

    def _check_now(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        """Whether this batch is one at which a validation may be due (the same on every rank)."""
        return self._batches_since >= self.every_batches and self._batches_since % self.every_batches == 0

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations, "batches_since": self._batches_since}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = int(state_dict["validations"])
        self._batches_since = int(state_dict["batches_since"])


def _training_ends_after(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether the fit stops after this batch by its length (``max_steps``, or the last batch of
    ``max_epochs``); early stopping validates before it stops."""
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    last_epoch = max_epochs is not None and max_epochs > 0 and trainer.current_epoch + 1 >= max_epochs
    return last_epoch and batch_idx + 1 >= trainer.num_training_batches


class ValidationWorkBudget(ValidationBudget):
    """A ``ValidationBudget`` in work: validate only where, this validation included, validating
    has done at most ``share`` of the work the fit has done (``models.work``).

    The module weighs both: ``validation_work()`` (``NodeClassifierBase``: exact inference
    scoring the validation nodes), known before training, and ``training_work(batch)`` (its
    layers over the sampled blocks, forward and backward). Both follow from the seed, the data
    and the model's widths alone, so the same command validates after the same batches on any
    machine and at any load, and a fit resumed from its checkpoint goes on where it stopped.
    """

    def __init__(self, share: float = 0.25, every_batches: int = 10):
        super().__init__(share, every_batches)
        self.validation_cost = 0.0
        self.training_work = 0.0

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        missing = [m for m in ("validation_work", "training_work") if not hasattr(pl_module, m)]
        if missing:
            raise ValueError(
                f"ValidationWorkBudget: {type(pl_module).__name__} has no {' or '.join(f'{m}()' for m in missing)} "
                "to weigh a validation against training batches; use ValidationTimeBudget"
            )
        self.validation_cost = float(pl_module.validation_work())
        if trainer.global_step == 0:
            self.training_work = 0.0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self.training_work += float(pl_module.training_work(batch))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def allows(self) -> bool:
        validating = (self.validations + 1) * self.validation_cost
        return validating <= self.share * (self.training_work + validating)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "training_work": self.training_work}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.training_work = float(state_dict["training_work"])


class ValidationTimeBudget(ValidationBudget):
    """A ``ValidationBudget`` in wall time: validate while validation has taken at most ``share``
    of the fit's time so far. The first validation comes at the end of the first epoch, or
    after ``every_batches`` batches if that is later: its cost is unknown until it has run once.

    Which batches it validates after depends on the machine's speed and load, so a rerun
    validates elsewhere (and may keep another best checkpoint); the batches trained on do not
    change. ``ValidationWorkBudget`` draws the same schedule on any machine.
    """

    def __init__(self, share: float = 0.5, every_batches: int = 10):
        super().__init__(share, every_batches)
        self.validating_s = 0.0
        self._started = 0.0
        self._validation_began: float | None = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.validations, self._batches_since = 0, 0
        self.validating_s, self._started = 0.0, time.monotonic()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._validation_began = time.monotonic()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batches_since = 0  # the validation is counted when training resumes

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
    def allows(self) -> bool:
        return self.validating_s <= self.share * (time.monotonic() - self._started)

    @override
    def _check_now(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        if self.validations > 0:
            return super()._check_now(trainer, batch_idx)
        # the first: once the first epoch is over, and at least every_batches batches in
        return self._batches_since >= self.every_batches and (
            trainer.current_epoch > 0 or batch_idx + 1 >= trainer.num_training_batches
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {}  # seconds of another run, on another machine: a resumed fit starts anew

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def _close_validation(self) -> None:
        if self._validation_began is not None:
            self.validating_s += time.monotonic() - self._validation_began
            self.validations += 1
            self._validation_began = None
