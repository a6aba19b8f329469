"""Adaptive device-queue size Q (paper section IV-A, eq. 24-25).

Q = min(C, max(2, ceil(max(T_sampling + T_transfer) / mean(T_compute))))   (eq. 24)
C = floor(M_Q / M_mini-batch)                                              (eq. 25)

The paper's typeset eq. 24 shows max(T_compute) in the denominator while its text says mean;
we follow the text (mean), as the design brief does. Stage times come from a window of batches
after a warm-up; Q is re-estimated when the window's times drift from those last used.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import asdict, dataclass

import psutil
import torch


def queue_size_from_times(t_prep_max: float, t_compute_mean: float, cap: int) -> int:
    """Eq. 24. Never below 1: the pipeline needs one slot even when memory allows fewer than 2."""
    want = 2 if t_compute_mean <= 0 else max(2, math.ceil(t_prep_max / t_compute_mean))
    return max(1, min(cap, want))


def memory_cap(available_bytes: int, peak_bytes: int, batch_bytes: int, margin: float) -> int:
    """Eq. 25: C = floor(M_Q / M_batch), M_Q = available memory less the peak with its margin."""
    if batch_bytes <= 0:
        raise ValueError(f"batch_bytes must be positive, got {batch_bytes}")
    m_q = available_bytes - peak_bytes * (1.0 + margin)
    return max(0, int(m_q // batch_bytes))


def device_memory(device: torch.device, margin: float) -> tuple[int, int]:
    """``(available, peak)`` bytes for eq. 25 on ``device``.

    CUDA: available = free memory + what torch's allocator holds (mem_get_info + reserved),
    peak = torch's measured peak allocation. CPU: available = the host's available memory less
    ``margin`` of the total (the training peak is already resident), peak = 0.
    """
    if device.type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device), torch.cuda.max_memory_allocated(device)
    vm = psutil.virtual_memory()
    return int(vm.available - margin * vm.total), 0


@dataclass
class QueueSizeEstimate:
    """One decision of eq. 24-25 and its inputs (logged)."""

    q: int
    batch_index: int
    t_prep_max_s: float
    t_compute_mean_s: float
    cap: int
    available_bytes: int
    peak_bytes: int
    batch_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


class AdaptiveQueueSize:
    """Collects stage times and decides Q (eq. 24-25).

    ``observe_prep`` is called by the transfer thread (sample + gather + transfer of a batch),
    ``observe_compute`` by the training thread (time between two batch requests). The first
    ``warmup`` observations of each are dropped (start-up costs), the next ``window`` give the
    first estimate, and later windows re-estimate when a mean moves by more than ``DRIFT`` of
    itself. Until the first estimate Q is eq. 24's floor, 2. ``device``: where the queue's batches
    live (its memory bounds Q, eq. 25); the loader sets it once it knows.
    """

    DRIFT = 0.25

    def __init__(self, warmup: int = 5, window: int = 20, margin: float = 0.1):
        if warmup < 0 or window < 1:
            raise ValueError(f"warmup must be >= 0 and window >= 1, got {warmup}, {window}")
        self.device = torch.device("cpu")
        self.warmup = warmup
        self.window = window
        self.margin = margin
        self.q = 2
        self.history: list[QueueSizeEstimate] = []
        self._prep: deque = deque(maxlen=window)
        self._compute: deque = deque(maxlen=window)
        self._seen_prep = 0
        self._seen_compute = 0
        self._lock = threading.Lock()
        self._basis: tuple[float, float] | None = None

    def observe_prep(self, seconds: float) -> None:
        with self._lock:
            self._seen_prep += 1
            if self._seen_prep > self.warmup:
                self._prep.append(seconds)

    def observe_compute(self, seconds: float) -> None:
        with self._lock:
            self._seen_compute += 1
            if self._seen_compute > self.warmup:
                self._compute.append(seconds)

    def update(self, batch_bytes: int, batch_index: int) -> QueueSizeEstimate | None:
        """A new estimate when the window is full and it is the first or the times drifted."""
        with self._lock:
            if len(self._prep) < self.window or len(self._compute) < self.window:
                return None
            prep_max = max(self._prep)
            prep_mean = sum(self._prep) / len(self._prep)
            compute_mean = sum(self._compute) / len(self._compute)
        if self._basis is not None:
            old_prep, old_compute = self._basis
            moved = abs(prep_mean - old_prep) > self.DRIFT * old_prep or abs(
                compute_mean - old_compute
            ) > self.DRIFT * max(old_compute, 1e-9)
            if not moved:
                return None
        self._basis = (prep_mean, compute_mean)
        available, peak = device_memory(self.device, self.margin)
        cap = memory_cap(available, peak, max(1, batch_bytes), self.margin)
        est = QueueSizeEstimate(
            q=queue_size_from_times(prep_max, compute_mean, cap),
            batch_index=batch_index,
            t_prep_max_s=prep_max,
            t_compute_mean_s=compute_mean,
            cap=cap,
            available_bytes=available,
            peak_bytes=peak,
            batch_bytes=batch_bytes,
        )
        self.q = est.q
        self.history.append(est)
        return est
