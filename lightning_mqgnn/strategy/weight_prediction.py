"""Weight prediction for stale gradients: compute a step's gradient at the weights it will be applied to.

At staleness ``s`` the gradient of step ``t`` updates the weights of step ``t + s``, which have moved
``s`` updates on since it was computed. Computing it instead at a prediction of those weights,
``w_t + s * (w_t - w_{t-1})`` (the last update taken as the velocity of the next ``s``), removes
most of that lag for optimisers whose updates change slowly from step to step (momentum, Adam).
This is SpecTrain's weight prediction (Chen et al. 2018, "Efficient and Robust Parallel DNN
Training through Model Parallelism on Multi-GPU Platform"), with the velocity measured from the
parameters rather than read from one optimiser's state, so it works with any optimiser.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


class WeightPrediction:
    """The last update of ``params`` and the predicted weights a step's forward and backward run at.

    ``predicted(steps)`` moves the parameters ``steps`` last updates ahead for the forward and backward
    inside it and puts back the exact weights after (a copy, not a subtraction, so no rounding
    accumulates); ``record(updates)`` then measures the update the optimiser made from those weights,
    per optimiser step when it made several (a queue draining) and zero when it made none (a queue
    filling). Every rank applies the same averaged gradients, so every rank predicts the same weights.
    """

    def __init__(self, params: list[Tensor]) -> None:
        self.params = params
        self.last_update: list[Tensor] = [
            torch.zeros_like(p, memory_format=torch.preserve_format) for p in params
        ]
        self._before: list[Tensor] | None = None

    @contextmanager
    def predicted(self, steps: int) -> Iterator[None]:
        """Run the body at ``w + steps * last_update``; the weights before it are restored after."""
        with torch.no_grad():
            self._before = [p.detach().clone() for p in self.params]
            if steps > 0:
                for p, update in zip(self.params, self.last_update):
                    p.add_(update, alpha=steps)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, before in zip(self.params, self._before):
                    p.copy_(before)

    def record(self, updates: int) -> None:
        """The optimiser has made ``updates`` steps since ``predicted``: keep their mean as the last update."""
        if self._before is None:
            raise RuntimeError("WeightPrediction.record: no predicted step to measure the update from")
        with torch.no_grad():
            for p, before, update in zip(self.params, self._before, self.last_update):
                if updates == 0:
                    update.zero_()
                else:
                    torch.sub(p, before, out=update).div_(updates)
        self._before = None

    def state_dict(self) -> dict[str, list[Tensor]]:
        """The last update, on the CPU (part of the strategy's checkpoint state)."""
        return {"last_update": [u.detach().cpu().clone() for u in self.last_update]}

    def load_state_dict(self, state: dict[str, list[Tensor]]) -> None:
        updates = state["last_update"]
        shapes = [tuple(u.shape) for u in updates]
        expected = [tuple(p.shape) for p in self.params]
        if shapes != expected:
            raise ValueError(
                f"WeightPrediction checkpoint: field 'last_update' has shapes {shapes}, but this model's "
                f"parameters have {expected} (a different model or optimiser?)"
            )
        for update, saved in zip(self.last_update, updates):
            update.copy_(saved)
