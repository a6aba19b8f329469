"""Where and when a loader's next epoch runs: the facts a training loop knows and a loader asks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class EpochPlan:
    """The coming epoch of one rank.

    ``rank`` of ``world_size`` picks this rank's share of the seeds; ``ranks_on_node`` share the
    machine's cores with their workers; batches go to ``device``. ``max_epochs`` (None: not known,
    negative: no limit) and ``stopping`` (the loop will stop after this epoch) say whether a next
    epoch will follow, so the pipeline may start making its first batches early.
    """

    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    ranks_on_node: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    max_epochs: int | None = None
    stopping: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if self.ranks_on_node < 1:
            raise ValueError(f"ranks_on_node must be >= 1, got {self.ranks_on_node}")
        object.__setattr__(self, "device", torch.device(self.device))

    def will_run(self, epoch: int) -> bool:
        """Whether ``epoch`` is known to run after the present one."""
        if self.stopping or self.max_epochs is None:
            return False
        return self.max_epochs < 0 or epoch < self.max_epochs


class Planned:
    """A loader's access to its plan: a fixed ``EpochPlan`` (advanced with ``set_epoch``, as when
    the loader is used without Lightning) or a function that returns the current one."""

    def __init__(self, plan: EpochPlan | Callable[[], EpochPlan] | None = None):
        self._plan = plan if plan is not None else EpochPlan()

    def plan(self) -> EpochPlan:
        """The coming epoch's plan."""
        return self._plan if isinstance(self._plan, EpochPlan) else self._plan()

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the coming one: its seeds are permuted and its batches seeded from it."""
        if not isinstance(self._plan, EpochPlan):
            raise RuntimeError("set_epoch: this loader's epochs come from its plan function")
        self._plan = replace(self._plan, epoch=epoch)
