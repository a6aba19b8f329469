"""Peak memory of every rank's training, for comparing how much each distributed mode holds."""

from __future__ import annotations

import re
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch import distributed as dist
from typing_extensions import override

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def status_mb(field: str) -> float | None:
    """``VmRSS``/``VmHWM`` of this process in MB (None where /proc is missing)."""
    try:
        match = re.search(rf"^{field}:\s+(\d+)\s+kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def reset_peak_rss() -> bool:
    """Restart the kernel's peak resident set size (``VmHWM``) from the current one (Linux)."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def gather_ranks(local: Tensor, world_size: int) -> Tensor:
    """``local`` of every rank, stacked in rank order. ``torch.distributed.all_gather`` rather than
    ``Strategy.all_gather``, whose gradient-carrying gather (``torch.distributed.nn``) torch 2.13
    deprecates with a warning on every distributed fit; these figures need no gradient."""
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return local.unsqueeze(0)
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return torch.stack(parts)


class PeakMemoryMonitor(pl.Callback):
    """Per rank, from training start to end (validation included): the peak resident set size
    (``peak_rss_mb``; on Linux, where the peak can be restarted at training start) and its growth
    over the resident size at training start (``train_rss_mb``: what training allocated, the
    dataset and the model aside), and on CUDA the allocator's peak (``peak_cuda_mb``). Lists of
    every rank's values, gathered at training end."""

    def __init__(self) -> None:
        self.peak_rss_mb: list[float] = []
        self.train_rss_mb: list[float] = []
        self.peak_cuda_mb: list[float] = []
        self._start_rss = 0.0
        self._resettable = False

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._resettable = reset_peak_rss()
        self._start_rss = status_mb("VmRSS") or 0.0
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        peak = status_mb("VmHWM") if self._resettable else None
        cuda = pl_module.device.type == "cuda"
        local = torch.tensor(
            [
                peak if peak is not None else float("nan"),
                peak - self._start_rss if peak is not None else float("nan"),
                torch.cuda.max_memory_allocated(pl_module.device) / 2**20 if cuda else float("nan"),
            ],
            dtype=torch.float64,
            device=pl_module.device,
        )
        gathered = gather_ranks(local, trainer.world_size).reshape(-1, 3).cpu()
        self.peak_rss_mb, self.train_rss_mb, cuda_mb = (gathered[:, i].tolist() for i in range(3))
        self.peak_cuda_mb = cuda_mb if cuda else []

    def result_fields(self) -> str:
        """``peak_rss_mb=a/b/... train_rss_mb=...`` (and ``peak_cuda_mb=``) for a RESULT line."""

        def joined(values: list[float]) -> str:
            return "/".join(f"{v:.0f}" for v in values)

        fields = ""
        if self.peak_rss_mb and all(v == v for v in self.peak_rss_mb):
            fields += f" peak_rss_mb={joined(self.peak_rss_mb)} train_rss_mb={joined(self.train_rss_mb)}"
        if self.peak_cuda_mb:
            fields += f" peak_cuda_mb={joined(self.peak_cuda_mb)}"
        return fields
