"""Who produces an epoch's batches: the sampler workers, or the training thread itself.

With workers, the training step runs on the cores they leave free; on a machine with few cores
that can cost the step more than the overlap gains (2 cores: one worker, and a step on one thread
instead of two). Producing in the training thread is the sequential
loop's way: sample, gather, then a step on every core. Which is faster depends on the measured
stage costs, so the loader times both on whole epochs, the workers first, and keeps the faster.
Batches are the same either way (each is seeded from seed, epoch and index).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

PRODUCERS = ("auto", "workers")


@dataclass
class ProducerChoice:
    """``auto``: epochs run on the workers until ``samples`` batch times are in, then in the
    training thread until as many are, then on whichever had the lower median batch time (the
    time between two batches reaching the training loop, both the step and the wait for data).
    The first ``skip`` batches of an epoch are not timed (empty queues, thread-count changes).
    ``workers``: always the workers."""

    policy: str = "auto"
    samples: int = 6
    skip: int = 2
    times: dict[str, list[float]] = field(default_factory=lambda: {"workers": [], "trainer": []})
    chosen: str | None = None

    def __post_init__(self):
        if self.policy not in PRODUCERS:
            raise ValueError(f"producer must be one of {PRODUCERS}, got {self.policy!r}")
        if self.policy == "workers":
            self.chosen = "workers"

    def producer(self) -> str:
        """Who produces the coming epoch."""
        if self.chosen is not None:
            return self.chosen
        if len(self.times["workers"]) < self.samples:
            return "workers"
        if len(self.times["trainer"]) < self.samples:
            return "trainer"
        medians = {who: statistics.median(t) for who, t in self.times.items()}
        self.chosen = min(medians, key=medians.get)
        return self.chosen

    def observe(self, producer: str, index: int, seconds: float) -> None:
        """Batch ``index`` of an epoch produced by ``producer`` took ``seconds`` to reach the loop."""
        if self.chosen is None and index >= self.skip:
            self.times[producer].append(seconds)
