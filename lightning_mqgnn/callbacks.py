"""Training callbacks of the paper's protocol: batch-level early stopping, batch timing, GPU busy time."""

from __future__ import annotations

import threading
import time

import lightning.pytorch as pl
import torch


def trimmed(values: list[float], trim: int = 20) -> list[float]:
    """``values`` without the first and last ``trim`` (the paper's batch-time window); all of them
    when there are too few to trim."""
    return values[trim:-trim] if len(values) > 2 * trim else values


def trimmed_mean(values: list[float], trim: int = 20) -> float:
    kept = trimmed(values, trim)
    return float(sum(kept) / len(kept)) if kept else float("nan")


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
        self.stopped_step: int | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])
        step = trainer.global_step
        if value >= self.best + self.min_delta:
            self.best, self.best_step = value, step
        elif step - self.best_step >= self.patience_batches:
            self.stopped_step = step
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.best, self.best_step = state_dict["best"], state_dict["best_step"]


class BatchTimer(pl.Callback):
    """Wall time of every training batch (from the previous batch's end, so waiting for data
    counts; validation time does not) and the total training time of ``fit``. On CUDA only the
    epoch and validation boundaries synchronise the device: a wait for the GPU every step
    would stop the host from queueing the next step's kernels."""

    def __init__(self, trim: int = 20):
        self.trim = trim
        self.batch_times: list[float] = []
        self.train_time = 0.0
        self._last = 0.0
        self._fit_start = 0.0
        self._val_time = 0.0
        self._val_start = 0.0

    @staticmethod
    def _now(pl_module: pl.LightningModule, sync: bool = True) -> float:
        if sync and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batch_times.clear()
        self._val_time = 0.0
        self._fit_start = self._now(pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # no synchronisation per batch: the host may run a few kernels ahead, so a batch's time
        # is the pace of the slower side; epoch and validation boundaries synchronise
        now = self._now(pl_module, sync=False)
        self.batch_times.append(now - self._last)
        self._last = now

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = self._now(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        spent = self._now(pl_module) - self._val_start
        self._val_time += spent
        self._last += spent  # the next batch's time excludes validation

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_time = self._now(pl_module) - self._fit_start - self._val_time

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


class GPUBusyMonitor(pl.Callback):
    """Fraction of training time the GPU was executing kernels (the paper's Fig. 3 utilisation).

    A thread polls NVML's utilisation counter (``torch.cuda.utilization``: percent of the last
    sample period with a kernel running) every ``interval`` seconds while a training epoch runs,
    paused during validation. Stays idle, and reports ``None``, when training is not on CUDA or
    NVML is unavailable.
    """

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.samples: list[tuple[float, float]] = []  # (seconds since fit start, busy fraction)
        self._device: torch.device | None = None
        self._running = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.samples.clear()
        if pl_module.device.type != "cuda" or not _nvml_available(pl_module.device):
            return
        self._device, self._start = pl_module.device, time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="gpu-busy-monitor", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self._running.is_set():
                busy = torch.cuda.utilization(self._device) / 100.0
                self.samples.append((time.perf_counter() - self._start, busy))
            self._stop.wait(self.interval)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._running.set()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._running.clear()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._running.set()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._running.clear()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._running.clear()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def busy_fraction(self) -> float | None:
        """Mean polled utilisation during training; None when nothing was measured."""
        if not self.samples:
            return None
        return sum(b for _, b in self.samples) / len(self.samples)


def _nvml_available(device: torch.device) -> bool:
    try:
        torch.cuda.utilization(device)
    except Exception:  # pynvml missing or NVML refused: utilisation is simply not reported
        return False
    return True
