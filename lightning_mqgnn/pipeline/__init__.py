"""The MQ-GNN multi-queue pipeline: sampler workers, CPU and device queues, adaptive Q, and the loaders that use them."""

from lightning_mqgnn.pipeline.loader import PipelinedLoader
from lightning_mqgnn.pipeline.plan import EpochPlan
from lightning_mqgnn.pipeline.queue_size import (
    AdaptiveQueueSize,
    QueueSizeEstimate,
    memory_cap,
    queue_size_from_times,
)
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.settings import PipelineSettings
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool, WorkerError

__all__ = [
    "AdaptiveQueueSize",
    "BatchSource",
    "EpochPlan",
    "PipelinedLoader",
    "PipelineSettings",
    "QueueSizeEstimate",
    "SamplerWorkerPool",
    "SequentialLoader",
    "WorkerError",
    "memory_cap",
    "queue_size_from_times",
]
