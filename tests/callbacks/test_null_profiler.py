"""NullProfiler: the recipe's Trainer profiles nothing at no cost a hook, unless asked to profile."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers.recipe import recipe_config
from hydra.utils import instantiate
from lightning.pytorch.profilers import SimpleProfiler

from lightning_mqgnn.profilers import NullProfiler


class _Counting(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return (self.weight * batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_profile_is_one_shared_context_that_does_nothing():
    profiler = NullProfiler()
    with profiler.profile("a"):
        pass
    assert profiler.profile("a") is profiler.profile("b")
    assert profiler.summary() == ""


def test_a_trainer_fits_with_it():
    module = _Counting()
    trainer = pl.Trainer(
        profiler=NullProfiler(),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(torch.ones(4, 3), batch_size=2))
    assert isinstance(trainer.profiler, NullProfiler)
    assert module.steps == 2
    assert torch.allclose(module.weight, torch.full((3,), 1 - 0.1 * 4))


@pytest.mark.parametrize("override, kind", [([], NullProfiler), (["trainer.profiler=simple"], str)])
def test_the_recipe_trainer_takes_it_unless_a_profiler_is_named(override, kind):
    cfg = recipe_config(*override)
    profiler = (
        instantiate(cfg.trainer.profiler)
        if not isinstance(cfg.trainer.profiler, str)
        else cfg.trainer.profiler
    )
    assert isinstance(profiler, kind)
    if kind is str:  # Lightning builds its own from the name
        trainer = pl.Trainer(profiler=profiler, logger=False, enable_progress_bar=False)
        assert isinstance(trainer.profiler, SimpleProfiler)
