"""Asynchronous all-reduce handles and the communication counters the strategy exposes."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch.distributed as dist
from torch import Tensor


@dataclass
class CommStats:
    """Counters of one rank: what the gradient queue and the periodic sync did and how long they blocked."""

    steps: int = 0  # optimiser steps requested by the training loop
    applied_steps: int = 0  # steps that applied an averaged gradient (the others were queue fill)
    skipped_steps: int = 0  # steps with no averaged gradient yet (the first `staleness` steps)
    syncs: int = 0  # periodic model synchronisations
    grad_wait_s: float = 0.0  # time blocked waiting for a queued gradient all-reduce
    sync_s: float = 0.0  # time spent in periodic model synchronisation (blocking)

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


class PendingReduce(Protocol):
    """A launched reduction; ``wait`` blocks until the reduced tensors are ready."""

    def wait(self) -> None: ...


class Reducer(Protocol):
    """Starts a sum all-reduce of tensors in place and returns at once."""

    world_size: int

    def launch(self, tensors: list[Tensor]) -> PendingReduce: ...


class _Works:
    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []


class _Delayed:
    def __init__(self, future: Future) -> None:
        self._future = future

    def wait(self) -> None:
        self._future.result()


class AllReduce:
    """``dist.all_reduce(async_op=True)`` over a process group.

    ``simulated_delay_s`` (benchmarks only) adds an artificial network latency: a background thread waits
    for the real all-reduce, sleeps, then marks it complete, so the training thread is never blocked by
    the delay unless it waits for the result. Delays are serialised, like messages on one link.
    """

    def __init__(self, group: Any = None, simulated_delay_s: float = 0.0) -> None:
        if simulated_delay_s < 0:
            raise ValueError(f"AllReduce: simulated_delay_s must be >= 0, got {simulated_delay_s!r}")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.simulated_delay_s = simulated_delay_s
        self._executor: ThreadPoolExecutor | None = None

    def launch(self, tensors: list[Tensor]) -> PendingReduce:
        works = [dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group, async_op=True) for t in tensors]
        pending = _Works(works)
        if self.simulated_delay_s == 0:
            return pending
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqgnn-simulated-delay")
        delay = self.simulated_delay_s

        def complete_late() -> None:
            pending.wait()
            time.sleep(delay)

        return _Delayed(self._executor.submit(complete_late))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
