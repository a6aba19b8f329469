"""A checkpoint to resume a fit from, written at the end of training epochs and when a
scheduler's signal stops the fit."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_mqgnn.strategy.checkpoint_io import AtomicCheckpointIO

log = logging.getLogger(__name__)

LAST_CHECKPOINT = "last.ckpt"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # a scheduler's stop, SLURM's requeue signal
REQUEUE_TIMEOUT_S = 30.0


class Preempted(SystemExit):
    """A fit stopped by ``signum`` after writing ``path``: a ``SystemExit`` with status
    128 + ``signum``, the status of a process the signal ended, which schedulers requeue or count
    as stopped rather than done (Lightning's own SIGTERM path exits 0)."""

    def __init__(self, signum: int, path: Path, epoch: int, batches: int | None, rank: int = 0):
        super().__init__(128 + signum)
        self.signum, self.path, self.epoch, self.batches, self.rank = signum, path, epoch, batches, rank

    def __str__(self) -> str:
        if self.batches is None:
            where = f"the end of epoch {self.epoch}"
        else:
            where = f"epoch {self.epoch} after {self.batches} batches"
        return f"stopped by {signal.Signals(self.signum).name} at {where}: {self.path} written"


def slurm_job_to_requeue() -> str | None:
    """The SLURM job (``<array job>_<task>`` for an array task) this process belongs to, or None."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


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

    Preemption: from the sanity check to the end of training, ``signals`` (a scheduler's SIGTERM,
    SLURM's requeue signal SIGUSR1) are this callback's: the handler only notes the signal, and at
    the end of the step it arrived in (at an accumulation's end; for an epoch's last step, at the
    epoch's end) every rank agrees through one all-reduce of the signal number (SIGTERM wins),
    ``last.ckpt`` is written there and ``Preempted`` is raised: Lightning stops the loaders'
    workers, and an uncaught one exits with status 128 + signal. A checkpoint written inside an
    epoch resumes at the next batch where the training loader can start there (this package's
    loaders can, through Lightning's loader ``state_dict``); its state says which signal wrote it
    (``stopped_by``). Under Lightning's ``SLURMEnvironment`` with ``auto_requeue`` (the
    strategy's; on one device, Lightning's default for a SLURM job), the environment's requeue
    signal also runs ``scontrol requeue`` for the job on rank 0; SIGTERM never does. ``()``
    leaves the signals to Lightning.

    Otherwise only epoch ends: a resumed fit must not train on part of an epoch twice, so a
    checkpoint inside an epoch is written only when the fit stops there. The file is written beside the old
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

    def __init__(
        self, dirpath: str | os.PathLike, every_s: float = 60.0, signals: Sequence[int] = STOP_SIGNALS
    ):
        if every_s < 0:
            raise ValueError(f"every_s must be >= 0, got {every_s}")
        valid = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
        for signum in signals:
            if signum not in valid:
                raise ValueError(f"signals: {signum!r} is not a signal a process can handle")
        self.dirpath = Path(dirpath)
        self.every_s = every_s
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.stopped_by = 0  # the signal that wrote the last checkpoint (0: an epoch's end)
        self._last_write = 0.0
        self._fitting = False
        self._received = 0
        self._handlers_before: dict[int, Any] = {}

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

    # ----------------------------------------------------------------- signals
    def _take_signals(self, trainer: pl.Trainer) -> None:
        """Handle ``signals`` from now on (after Lightning has set its own handlers)."""
        if self._handlers_before or not self.signals or not self._writes(trainer):
            return
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn(
                "LastCheckpoint: fit runs outside the main thread, where signals cannot be handled"
            )
            return
        self._received = 0
        self.stopped_by = 0
        for signum in self.signals:
            self._handlers_before[signum] = signal.getsignal(signum)
            signal.signal(signum, self._note_signal)

    def _note_signal(self, signum: int, frame: Any) -> None:
        log.info("LastCheckpoint: received %s; stopping at the next step's end", signal.Signals(signum).name)
        self._received = max(self._received, signum)  # SIGTERM (15) over the requeue signal (10)

    def _give_signals_back(self) -> None:
        for signum, handler in self._handlers_before.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._handlers_before = {}

    def _agreed_signal(self, trainer: pl.Trainer) -> int:
        """The largest signal any rank received (0: none); every rank calls this together."""
        if trainer.world_size == 1:
            return self._received
        received = torch.tensor(self._received, device=trainer.strategy.root_device)
        return int(trainer.strategy.reduce(received, reduce_op="max"))

    @staticmethod
    def _writes(trainer: pl.Trainer) -> bool:
        """Whether this fit writes checkpoints: an epoch-bounded one, not ``fast_dev_run``."""
        return trainer.max_steps == -1 and not trainer.fast_dev_run

    def _stop_if_signalled(self, trainer: pl.Trainer, batches: int | None) -> None:
        """Write ``last.ckpt`` and raise ``Preempted`` if a rank received a signal; ``batches``:
        of the running epoch trained, None at its end."""
        if not self._handlers_before:
            return
        signum = self._agreed_signal(trainer)
        if not signum:
            return
        self.stopped_by = signum
        self.save(trainer)
        self._give_signals_back()
        if trainer.is_global_zero:
            self._requeue(trainer, signum)
        raise Preempted(signum, self.path, trainer.current_epoch, batches, trainer.global_rank)

    def _requeue(self, trainer: pl.Trainer, signum: int) -> None:
        """``scontrol requeue`` this job when Lightning's SLURM auto-requeue asks for it."""
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if environment is None and SLURMEnvironment.detect():
            environment = SLURMEnvironment()  # one device: Lightning's default for a SLURM job
        if not isinstance(environment, SLURMEnvironment) or not environment.auto_requeue:
            return
        if signum != environment.requeue_signal:
            return  # SIGTERM: scancel or the end of the time limit, no requeue
        job = slurm_job_to_requeue()
        scontrol = shutil.which("scontrol")
        if job is None or scontrol is None:
            rank_zero_warn(f"LastCheckpoint: cannot requeue (SLURM job {job}, scontrol {scontrol})")
            return
        try:
            result = subprocess.run(
                [scontrol, "requeue", job], capture_output=True, text=True, timeout=REQUEUE_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            rank_zero_warn(f"LastCheckpoint: `scontrol requeue {job}` failed ({err}); {self.path} is written")
            return
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[0]
            rank_zero_warn(
                f"LastCheckpoint: `scontrol requeue {job}` failed ({reason}); {self.path} is written"
            )
        else:
            log.info("LastCheckpoint: requeued SLURM job %s", job)

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fitting:
            self._take_signals(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._take_signals(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        done = batch_idx + 1
        if done >= trainer.num_training_batches or done % trainer.accumulate_grad_batches:
            return  # the epoch's end decides for its last step; no checkpoint inside an accumulation
        self._stop_if_signalled(trainer, done)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self._writes(trainer):
            return
        self._stop_if_signalled(trainer, None)
        due = trainer.strategy.broadcast(time.monotonic() - self._last_write >= self.every_s)
        if due:
            self.save(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._give_signals_back()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._give_signals_back()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._give_signals_back()

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
        return {"generators": generator_states(), "stopped_by": self.stopped_by}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._fitting:
            restore_generator_states(state_dict["generators"])
