"""How the multi-queue pipeline runs: its workers, queues and adaptive queue size."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_mqgnn.pipeline.producer_choice import PRODUCERS
from lightning_mqgnn.pipeline.workers import check_start_method, default_num_workers


def check_queue_size(q: int | str) -> None:
    """A device queue's size: a positive int, or ``"auto"`` for eq. 24-25."""
    if q != "auto" and (not isinstance(q, int) or q < 1):
        raise ValueError(f"queue_size must be a positive int or 'auto', got {q!r}")


@dataclass(frozen=True)
class PipelineSettings:
    """``num_workers`` sampler processes (None: the cores of this rank less one); a CPU queue of
    ``cpu_queue_size`` batches made ahead of the transfer (default ``2 * num_workers``) and a
    device queue of ``queue_size`` batches (an int, or ``"auto"`` for eq. 24-25, estimated after
    ``warmup_batches`` over windows of ``window_batches``, leaving ``memory_margin`` of the peak
    free). ``start_method``/``worker_threads``: how workers start and how many threads each uses.
    ``producer="auto"`` times the training thread making the batches, and the workers only where
    its steps on their leftover threads leave them room to be faster, then keeps the faster
    (``ProducerChoice``); ``"workers"`` always uses the workers.
    """

    num_workers: int | None = None
    queue_size: int | str = "auto"
    cpu_queue_size: int | None = None
    start_method: str = "auto"
    worker_threads: int = 1
    warmup_batches: int = 5
    window_batches: int = 20
    memory_margin: float = 0.1
    producer: str = "auto"

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (or None for auto), got {self.num_workers}")
        check_queue_size(self.queue_size)
        check_start_method(self.start_method, self.worker_threads)
        if self.producer not in PRODUCERS:
            raise ValueError(f"producer must be one of {PRODUCERS}, got {self.producer!r}")
        if not 0.0 <= self.memory_margin < 1.0:
            raise ValueError(f"memory_margin must be in [0, 1), got {self.memory_margin}")

    @property
    def fixed_queue_size(self) -> int | None:
        """The device queue's size when fixed, None when adaptive."""
        return None if self.queue_size == "auto" else int(self.queue_size)

    def workers(self, ranks_on_node: int) -> int:
        """The number of sampler workers of one rank."""
        return self.num_workers or default_num_workers(ranks_on_node)

    def cpu_capacity(self, num_workers: int) -> int:
        return max(1, self.cpu_queue_size if self.cpu_queue_size is not None else 2 * num_workers)
