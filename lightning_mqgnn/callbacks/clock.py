"""The one clock of the timing callbacks: training wall time, validation taken out."""

from __future__ import annotations

import time

import torch


def trimmed(values: list[float], trim: int = 20) -> list[float]:
    """``values`` without the first and last ``trim`` (the paper's batch-time window); all of them
    when there are too few to trim."""
    return values[trim : len(values) - trim] if len(values) > 2 * trim else values  # (trim 0: all)


def trimmed_mean(values: list[float], trim: int = 20) -> float:
    kept = trimmed(values, trim)
    return float(sum(kept) / len(kept)) if kept else float("nan")


class TrainingClock:
    """Batch and epoch wall times of training. A batch runs from the previous batch's end (or its
    epoch's start) to its own end, so waiting for data counts; validation, wherever the Trainer
    runs it (between batches with ``val_check_interval``, at an epoch's end, the sanity check),
    counts for neither the batch after it nor the epoch. Callbacks call the ``*_start``/``*_end``
    methods from the Lightning hooks of the same names.

    On CUDA the fit, epoch and validation boundaries synchronise ``device``. With
    ``sync_every_batch`` every reading inside an epoch also waits for the current stream (not the
    pipeline's side stream, whose copies would otherwise count as compute), so per-stage times
    inside a step are real, at the cost of a stall per reading: the host can no longer queue the
    next step's kernels ahead.
    """

    def __init__(self, sync_every_batch: bool = False):
        self.sync_every_batch = sync_every_batch
        self.device: torch.device | None = None
        self.validation_s = 0.0  # all validation time since fit start
        self._last = 0.0
        self._epoch_start = 0.0
        self._epoch_validation_s = 0.0
        self._validation_start = 0.0

    def now(self, boundary: bool = False) -> float:
        """``time.perf_counter()`` once the device got there: at a ``boundary`` the whole device,
        else (with ``sync_every_batch``) the current stream."""
        if self.device is not None and self.device.type == "cuda":
            if boundary:
                torch.cuda.synchronize(self.device)
            elif self.sync_every_batch:
                torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter()

    def fit_start(self, device: torch.device) -> float:
        self.device = device
        self.validation_s = 0.0
        return self.now(boundary=True)

    def train_epoch_start(self) -> float:
        self._epoch_start = self._last = self.now(boundary=True)
        self._epoch_validation_s = 0.0
        return self._epoch_start

    def train_batch_end(self) -> tuple[float, float]:
        """``(now, seconds since the previous batch's end)``, validation excluded."""
        now = self.now()
        elapsed = now - self._last
        self._last = now
        return now, elapsed

    def validation_start(self) -> None:
        self._validation_start = self.now(boundary=True)

    def validation_end(self) -> None:
        spent = self.now(boundary=True) - self._validation_start
        self.validation_s += spent
        self._epoch_validation_s += spent
        self._last += spent  # the next batch's time excludes validation

    def train_epoch_end(self) -> float:
        """The epoch's training time, validation excluded."""
        return self.now(boundary=True) - self._epoch_start - self._epoch_validation_s
