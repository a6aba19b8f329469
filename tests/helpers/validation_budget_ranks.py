"""A fit under a validation budget where a training batch costs one and a validation
``VALIDATION_S``: seconds on a clock the module moves (``ValidationTimeBudget``), or units of
work (``ValidationWorkBudget``: the module's ``validation_work()``, and ``training_work(batch)`` one per batch)
(``python validation_budget_ranks.py OUT RANKS time|work``).

Every rank writes ``<OUT>/rank<r>.json``: the global steps after which it validated. On two ranks
rank 1's validations cost ten times rank 0's: without one decision for all, the ranks would
disagree on when to validate and wait for each other in different collectives.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_mqgnn.callbacks import ValidationTimeBudget, ValidationWorkBudget, validation_budget

VALIDATION_S = 3.0


class FakeClock:
    """``time.monotonic`` of the callback's module, moved by the model."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class ClockedModel(pl.LightningModule):
    def __init__(self, clock: FakeClock, validation_s: float):
        super().__init__()
        self.clock, self.validation_s = clock, validation_s
        self.net = nn.Linear(2, 1)
        self.validated_after: list[int] = []

    def training_step(self, batch, batch_idx):
        self.clock.now += 1.0
        return self.net(batch[0]).pow(2).mean()

    def validation_work(self) -> float:
        return self.validation_s

    def training_work(self, batch) -> float:
        return 1.0

    def validation_step(self, batch, batch_idx):
        self.clock.now += self.validation_s
        self.validated_after.append(self.trainer.global_step)
        self.log("val/metric", self.net(batch[0]).mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(
    out: Path | None, ranks: int = 1, epoch_batches: int = 4, steps: int = 16, measure: str = "time", **budget
) -> list[int]:
    """The steps after which validation ran, on a fit of ``steps`` batches, under a budget in
    ``measure``: ``time`` or ``work``."""
    budget_type = ValidationWorkBudget if measure == "work" else ValidationTimeBudget
    callback = budget_type(**budget)
    clock = FakeClock()
    data = TensorDataset(torch.ones(epoch_batches * ranks, 2))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=ranks,
        strategy="ddp" if ranks > 1 else "auto",
        max_steps=steps,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    rank = trainer.global_rank
    model = ClockedModel(clock, VALIDATION_S * (10 if rank == 1 else 1))
    validation_budget.time = clock  # only the callback's clock: Lightning keeps its own
    try:
        trainer.fit(
            model,
            DataLoader(data, batch_size=1),
            DataLoader(TensorDataset(torch.ones(ranks, 2)), batch_size=1),
        )
    finally:
        validation_budget.time = time
        if ranks > 1 and torch.distributed.is_initialized():
            # Lightning's DDPStrategy leaves a gloo group to the interpreter's teardown, where a
            # rank now and then aborts after a finished fit (SIGABRT, "terminate called without an
            # active exception"); this script tests the schedule, not that teardown
            torch.distributed.destroy_process_group()
    if out is not None:
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(model.validated_after))
    return model.validated_after


if __name__ == "__main__":
    fit(Path(sys.argv[1]), ranks=int(sys.argv[2]), measure=sys.argv[3], share=0.5, every_batches=2)
