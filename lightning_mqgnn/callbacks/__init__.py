"""Lightning callbacks of the paper's protocol: batch-level early stopping, validation within a
share of the wall time, batch and stage timing on one clock, the GPU busy fraction, every rank's
peak memory, the MQ-GNN strategy's communication counters, and the checkpoint a fit resumes from
(epoch ends, and where a scheduler's signal stops it)."""

from lightning_mqgnn.callbacks.batch_timer import BatchTimer
from lightning_mqgnn.callbacks.clock import TrainingClock, trimmed, trimmed_mean
from lightning_mqgnn.callbacks.comm_stats import CommStatsMonitor
from lightning_mqgnn.callbacks.early_stopping import BatchEarlyStopping
from lightning_mqgnn.callbacks.gpu_busy import GPUBusyMonitor
from lightning_mqgnn.callbacks.last_checkpoint import LastCheckpoint, Preempted
from lightning_mqgnn.callbacks.peak_memory import PeakMemoryMonitor
from lightning_mqgnn.callbacks.stage_timing import StageTimingCallback
from lightning_mqgnn.callbacks.validation_budget import (
    ValidationBudget,
    ValidationTimeBudget,
    ValidationWorkBudget,
)

__all__ = [
    "BatchEarlyStopping",
    "BatchTimer",
    "CommStatsMonitor",
    "GPUBusyMonitor",
    "LastCheckpoint",
    "PeakMemoryMonitor",
    "Preempted",
    "StageTimingCallback",
    "TrainingClock",
    "trimmed",
    "trimmed_mean",
    "ValidationBudget",
    "ValidationTimeBudget",
    "ValidationWorkBudget",
]
