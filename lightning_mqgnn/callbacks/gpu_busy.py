"""The GPU busy fraction during training (NVML)."""

from __future__ import annotations

import threading
import time

import lightning.pytorch as pl
import torch
from typing_extensions import override


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

    @override
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

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._running.set()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._running.clear()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._running.set()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._running.clear()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.teardown(trainer, pl_module, "fit")

    @override
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
