"""Who produces an epoch's batches: the sampler workers, or the training thread itself.

With workers, the training step runs on the cores they leave free; on a machine with few cores
that can cost the step more than the overlap gains (2 cores: one worker, and a step on one thread
instead of two). Producing in the training thread is the sequential loop's way: sample, gather,
then a step on every core. Which is faster depends on the measured stage costs, so the loader
times the training thread first. Workers can at best take the sampling and gathering off a batch,
so where those are a small share of it the training thread keeps producing at once; else a few
steps run on the threads the workers would leave, and the workers only start when those steps
leave them room to win. Batches are the same either way
(each is seeded from seed, epoch and index), and so is training: a step gives the same result on
any number of threads.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PRODUCERS = ("auto", "workers")


@dataclass
class ProducerChoice:
    """``auto``: the training thread produces until ``samples`` batch times are in (the time
    between two batches reaching the training loop: sampling, gathering and the step on every
    core). Workers save at most the batch's sampling and gathering, so where their median share of
    a batch is under ``margin`` the training thread is kept at once, with no probe. Else it runs
    ``probes`` steps on the threads the workers would leave. A batch from the
    workers takes at least such a step, and more with the workers beside it on the same cores, so
    unless the median probe is at least ``margin`` below the median batch the workers are never
    started (settled at the last probe); else epochs run on the workers until as many batch times
    are in, and the lower median wins for good. The first ``skip`` batches of an epoch are not
    timed (empty queues, thread-count changes). ``workers``: always the workers."""

    policy: str = "auto"
    samples: int = 6
    probes: int = 2
    skip: int = 2
    margin: float = 0.2
    times: dict[str, list[float]] = field(default_factory=lambda: {"workers": [], "trainer": []})
    produce_times: list[float] = field(default_factory=list)
    narrow_steps: list[float] = field(default_factory=list)
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
        if len(self.times["trainer"]) < self.samples or self.probing():
            return "trainer"
        if len(self.times["workers"]) < self.samples:  # the probes left the workers room to win
            return "workers"
        medians = {who: statistics.median(t) for who, t in self.times.items()}
        self._settle(min(medians, key=medians.get), "lower median batch time")
        return self.chosen

    def probing(self) -> bool:
        """Whether the training thread's next step should run on the threads the workers leave."""
        return (
            self.chosen is None
            and len(self.times["trainer"]) >= self.samples
            and len(self.narrow_steps) < self.probes
        )

    def production_is_minor(self) -> bool:
        """The training thread's median sampling and gathering is under ``margin`` of its median
        batch: even a step that lost nothing to the workers would leave them less to gain. False
        unless every timed batch came with its production time."""
        produced, batches = self.produce_times, self.times["trainer"]
        if not batches or len(produced) != len(batches):
            return False
        return statistics.median(produced) < self.margin * statistics.median(batches)

    def workers_cannot_win(self) -> bool:
        """A step on the workers' leftover threads leaves them less than ``margin`` of a whole
        batch made here to gain."""
        narrow = statistics.median(self.narrow_steps)
        return narrow > (1.0 - self.margin) * statistics.median(self.times["trainer"])

    def observe(
        self, producer: str, index: int, seconds: float, produce_seconds: float | None = None
    ) -> None:
        """Batch ``index`` of an epoch produced by ``producer`` took ``seconds`` to reach the
        loop, after a step on every thread the loop had; ``produce_seconds``: of those, the
        training thread's sampling and gathering of it. The training thread is kept at once when
        its ``samples``-th batch time shows the production is minor."""
        if self.chosen is None and index >= self.skip and not self.probing():
            self.times[producer].append(seconds)
            if producer != "trainer":
                return
            if produce_seconds is not None:
                self.produce_times.append(produce_seconds)
            if len(self.times["trainer"]) == self.samples and self.production_is_minor():
                self._settle("trainer", "sampling and gathering are a minor share of a batch")

    def observe_narrow_step(self, seconds: float) -> None:
        """A training step on the threads the workers would leave took ``seconds``; the last probe
        settles on the training thread at once when the workers cannot win."""
        if self.probing():
            self.narrow_steps.append(seconds)
            if not self.probing() and self.workers_cannot_win():
                self._settle("trainer", "a step on the threads the workers leave is too slow")

    def _settle(self, producer: str, why: str) -> None:
        """Keep ``producer`` for good, and say so with the figures it was chosen from."""
        self.chosen = producer
        figures = {
            "batch_ms": self.times["trainer"],
            "produce_ms": self.produce_times,
            "narrow_step_ms": self.narrow_steps,
            "worker_batch_ms": self.times["workers"],
        }
        medians = ", ".join(f"{k} {1e3 * statistics.median(v):.2f}" for k, v in figures.items() if v)
        log.info("pipeline: %s the batches: %s (medians: %s)", _WHO[producer], why, medians)

    def result_fields(self) -> str:
        """`` producer= probes=`` for a RESULT line: who produces (``undecided`` while timing) and
        how many steps ran on the workers' leftover threads."""
        return f" producer={self.chosen or 'undecided'} probes={len(self.narrow_steps)}"


_WHO = {"trainer": "the training thread produces", "workers": "the sampler workers produce"}
