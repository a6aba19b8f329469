"""A checkpoint to resume a fit from, written at the end of training epochs."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_mqgnn.strategy.checkpoint_io import AtomicCheckpointIO

LAST_CHECKPOINT = "last.ckpt"


def generator_states() -> dict[str, Any]:
    """The states of the random generators a training step may draw from: Python's, NumPy's,
    torch's CPU generator and, once CUDA is in use, every CUDA device's; as tensors and numbers,
    which a checkpoint loaded with ``torch.load(weights_only=True)`` (Lightning's default) holds."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_generator_states(states: dict[str, Any]) -> None:
    """Set the generators to ``states`` (``generator_states``); CUDA's only where this process
    has as many devices as the one that saved them."""
    random.setstate(states["python"])
    kind, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)


class LastCheckpoint(Checkpoint):
    """``dirpath/last.ckpt``, rewritten at the end of a training epoch once ``every_s`` seconds have
    passed since the fit started or since the previous write (0: at every epoch's end), so that an
    interrupted run loses at most that time and one epoch: ``Trainer.fit(ckpt_path=...)`` resumes
    from it.

    Only epoch ends: Lightning resumes mid-epoch only from loaders that can skip to a batch, and a
    resumed fit would otherwise train on part of an epoch twice. The file is written beside the old
    one and renamed over it (by ``AtomicCheckpointIO`` where the strategy writes with it, else
    here), so an interruption while writing leaves the previous checkpoint whole.
    The checkpoint also holds the random generators' states (``generator_states``), restored on
    resume, so a resumed fit draws the same dropout masks as one that ran through; with
    per-batch-seeded sampling (``MQGNNDataModule``) it then trains bit for bit like it. Only a fit
    restores them: Lightning also restores callbacks for ``test(ckpt_path=...)``.

    In a distributed fit rank 0's clock decides, for every rank: ``Trainer.save_checkpoint`` is
    collective, and ranks whose clocks disagreed would wait for each other forever.

    Only epoch-bounded fits (``max_steps=-1``): Lightning resumes the epoch-end checkpoint of a
    step-bounded fit as a restart inside that epoch and trains one batch more than the fit would
    have; on such a fit this callback warns once and writes nothing.

    A ``Checkpoint`` to Lightning, so it saves where ``ModelCheckpoint`` saves an epoch's end (after
    the module's ``on_train_epoch_end``); a Trainer given it adds no default ``ModelCheckpoint``, so
    add one for the best weights.
    """

    def __init__(self, dirpath: str | os.PathLike, every_s: float = 60.0):
        if every_s < 0:
            raise ValueError(f"every_s must be >= 0, got {every_s}")
        self.dirpath = Path(dirpath)
        self.every_s = every_s
        self._last_write = 0.0
        self._fitting = False

    @property
    def path(self) -> Path:
        return self.dirpath / LAST_CHECKPOINT

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._fitting = stage == "fit"

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_write = time.monotonic()
        if trainer.max_steps != -1:
            rank_zero_warn(
                f"LastCheckpoint writes nothing in a fit bounded by max_steps={trainer.max_steps}: Lightning "
                "would resume its epoch-end checkpoint one batch off; bound the fit by max_epochs"
            )

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.max_steps != -1:
            return
        due = trainer.strategy.broadcast(time.monotonic() - self._last_write >= self.every_s)
        if due:
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` now, whole or not at all (every rank calls this together)."""
        # AtomicCheckpointIO writes whole files itself (and names the file in its errors); under
        # any other, the file is written beside the old one and renamed over it here
        atomic = isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
        target = self.path if atomic else self.path.with_name(self.path.name + ".partial")
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        # the whole state, optimiser and loops included, to resume from; ends with a barrier:
        # rank 0 has written the file
        trainer.save_checkpoint(target, weights_only=False)
        if trainer.is_global_zero and not atomic:
            os.replace(target, self.path)
        self._last_write = time.monotonic()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"generators": generator_states()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._fitting:
            restore_generator_states(state_dict["generators"])
