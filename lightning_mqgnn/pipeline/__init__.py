"""The MQ-GNN multi-queue pipeline: sampler workers, CPU and device queues, adaptive Q, stage timing."""

from lightning_mqgnn.pipeline.loader import FeatureCache, PipelinedLoader
from lightning_mqgnn.pipeline.queue_size import (
    AdaptiveQueueSize,
    QueueSizeEstimate,
    memory_cap,
    queue_size_from_times,
)
from lightning_mqgnn.pipeline.stage_timing import StageTimingCallback
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool, WorkerError

__all__ = [
    "AdaptiveQueueSize",
    "FeatureCache",
    "PipelinedLoader",
    "QueueSizeEstimate",
    "SamplerWorkerPool",
    "StageTimingCallback",
    "WorkerError",
    "memory_cap",
    "queue_size_from_times",
]
