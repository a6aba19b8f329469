"""Where and when a loader's next epoch runs: the facts a training loop knows and a loader asks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

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
    first_batch: int = 0

    def __post_init__(self) -> None:
        if self.first_batch < 0:
            raise ValueError(f"first_batch must be >= 0, got {self.first_batch}")
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


@dataclass(frozen=True)
class LoaderPosition:
    """Where a loader stands: ``batches`` of epoch ``epoch`` handed out, the epoch split over
    ``world_size`` ranks (a share of another world size holds other seeds)."""

    epoch: int = 0
    batches: int = 0
    world_size: int = 1

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LoaderPosition:
        """The position a loader's ``state_dict`` holds; ``ValueError`` naming what is missing."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in state]
        if missing:
            raise ValueError(f"loader state {dict(state)!r} lacks {missing}")
        return cls(**{name: int(state[name]) for name in names})


class Planned:
    """A loader's access to its plan: a fixed ``EpochPlan`` (advanced with ``set_epoch``, as when
    the loader is used without Lightning) or a function that returns the current one.

    The loader's state (Lightning's ``state_dict``/``load_state_dict`` loader protocol) is its
    ``LoaderPosition``. With a fixed plan, a loaded position becomes the plan: the next epoch
    starts at the batch after those handed out. With a plan function the plan's ``first_batch``
    decides (the Trainer's count of trained batches: Lightning fetches one batch ahead, so the
    loader has handed out one more than was trained on) and the loaded position is checked
    against it: an epoch resumed by another number of ranks is an error.
    """

    def __init__(self, plan: EpochPlan | Callable[[], EpochPlan] | None = None):
        self._plan = plan if plan is not None else EpochPlan()
        self._position = LoaderPosition()
        self._loaded: LoaderPosition | None = None

    def plan(self) -> EpochPlan:
        """The coming epoch's plan."""
        return self._plan if isinstance(self._plan, EpochPlan) else self._plan()

    def set_epoch(self, epoch: int, first_batch: int = 0) -> None:
        """Make ``epoch`` the coming one, from batch ``first_batch``: its seeds are permuted and
        its batches seeded from it."""
        if not isinstance(self._plan, EpochPlan):
            raise RuntimeError("set_epoch: this loader's epochs come from its plan function")
        self._plan = replace(self._plan, epoch=epoch, first_batch=first_batch)

    def first_batch(self, plan: EpochPlan, num_batches: int) -> int:
        """The batch the epoch of ``plan`` starts at, checked against its ``num_batches`` and a
        loaded position; from here on ``state_dict`` reports this epoch."""
        first, loaded = plan.first_batch, self._loaded
        self._loaded = None
        if first > num_batches:
            raise ValueError(
                f"the loader resumes epoch {plan.epoch} at batch {first}, but the epoch has "
                f"{num_batches} batches on each of {plan.world_size} ranks"
            )
        if first and loaded is not None and loaded.world_size != plan.world_size:
            raise ValueError(
                f"the loader resumes epoch {plan.epoch} inside the epoch, whose batches were split "
                f"over {loaded.world_size} ranks; this run has {plan.world_size}: resume from a "
                "checkpoint written at an epoch's end"
            )
        if isinstance(self._plan, EpochPlan):
            self._plan = replace(self._plan, first_batch=0)  # the epoch after starts at its start
        self._position = LoaderPosition(plan.epoch, first, plan.world_size)
        return first

    def handed_out(self, index: int) -> None:
        """Batch ``index`` of the running epoch went to the training loop."""
        self._position = replace(self._position, batches=index + 1)

    def state_dict(self) -> dict[str, int]:
        """The ``LoaderPosition`` as a dict (Lightning saves it in its checkpoints)."""
        return asdict(self._position)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume at ``state_dict``'s position (a fixed plan) or check the plan's against it."""
        position = LoaderPosition.from_state(state_dict)
        self._loaded = position
        if isinstance(self._plan, EpochPlan):
            self._plan = replace(self._plan, epoch=position.epoch, first_batch=position.batches)
