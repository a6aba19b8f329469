"""Asynchronous all-reduce handles and the communication counters the strategy exposes."""

from __future__ import annotations

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
    # gradient bytes this rank handed to collectives (the all-reduced gradients, or what a comm hook
    # sent: comm_hook.payload_meter) in `grad_reductions` steps; NaN once a hook's is not known
    grad_bytes: float = 0.0
    grad_reductions: int = 0
    staleness: int = 0  # the staleness in force (it changes under staleness="auto")
    staleness_changes: int = 0

    def add_grad_bytes(self, sent: int | None, reductions: int) -> None:
        """Count ``sent`` gradient bytes of ``reductions`` steps (None: not known, from now on)."""
        self.grad_bytes = float("nan") if sent is None else self.grad_bytes + sent
        self.grad_reductions += reductions

    @property
    def grad_bytes_per_step(self) -> float:
        return self.grad_bytes / self.grad_reductions if self.grad_reductions else float("nan")

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


class PendingReduce(Protocol):
    """A launched reduction; ``wait`` blocks until the reduced tensors are ready."""

    def wait(self) -> None: ...

    def is_completed(self) -> bool: ...


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

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)


class AllReduce:
    """``dist.all_reduce(async_op=True)`` (sum) over a process group (None: the default group)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)

    def launch(self, tensors: list[Tensor]) -> PendingReduce:
        works = [dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group, async_op=True) for t in tensors]
        return _Works(works)
