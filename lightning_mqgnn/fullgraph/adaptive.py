"""The adaptive bit-width rule and the staleness-aware fallback of PipeQS, one controller per
(layer, direction) of halo messages.

Every rank measures, on the exact rows it sends, the relative drift of the message since the
previous epoch, ``drift = ||x_t - x_{t-1}|| / ||x_t||``; the sums are all-reduced, so every rank
applies the rule to the same numbers and picks the same policy for the next epoch:

* **bits**: ``drift > raise_above`` -> one step up in (2, 4, 8); ``drift < lower_below`` -> one
  step down; otherwise unchanged. Messages that change fast carry new information that coarse
  codes would blur; messages that barely change are refreshed every epoch anyway, and the
  unbiased rounding noise of independent epochs averages out in the weights, so fewer bits do.
* **fresh exact fallback**: when the stale halo would be far off (``drift > fresh_above``: using
  last epoch's rows errs by about ``drift``), or the global training loss diverges (rises above
  ``(1 + divergence_tol)`` times its lowest value so far), the next ``fresh_epochs`` epochs
  exchange exact float32 messages synchronously, as graph-parallel training does.

The first epoch is always fresh: there is no earlier halo to be stale with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_mqgnn.fullgraph.quantize import BIT_WIDTHS


@dataclass
class MessagePolicy:
    """How one (layer, direction) exchanges in an epoch: fresh (synchronous) or one epoch stale,
    and float32 (``bits=None``) or quantised."""

    fresh: bool
    bits: int | None


@dataclass
class AdaptiveRule:
    """Thresholds of the rule (see the module docstring)."""

    initial_bits: int = 4
    raise_above: float = 0.2
    lower_below: float = 0.05
    fresh_above: float = 1.0
    divergence_tol: float = 0.25
    fresh_epochs: int = 1

    def __post_init__(self) -> None:
        if self.initial_bits not in BIT_WIDTHS:
            raise ValueError(f"initial_bits must be one of {BIT_WIDTHS}, got {self.initial_bits}")
        if not 0 <= self.lower_below < self.raise_above < self.fresh_above:
            raise ValueError(
                "adaptive rule needs 0 <= lower_below < raise_above < fresh_above, got "
                f"{self.lower_below}, {self.raise_above}, {self.fresh_above}"
            )


class BitWidthController:
    """Policy of one (layer, direction) from the all-reduced drift and loss of each epoch."""

    def __init__(self, rule: AdaptiveRule, quantize: bool = True):
        self.rule = rule
        self.quantize = quantize
        self.bits = rule.initial_bits
        self.fresh_left = 1  # the first epoch has no halo to be stale with
        self.history: list[tuple[int | None, bool, float]] = []

    def policy(self) -> MessagePolicy:
        fresh = self.fresh_left > 0
        return MessagePolicy(fresh=fresh, bits=None if fresh or not self.quantize else self.bits)

    def update(self, drift: float, loss: float, best_loss: float) -> None:
        """End of an epoch: advance to the next epoch's policy."""
        current = self.policy()
        self.history.append((current.bits, current.fresh, drift))
        self.fresh_left = max(0, self.fresh_left - 1)
        r = self.rule
        diverging = math.isfinite(best_loss) and loss > (1.0 + r.divergence_tol) * best_loss
        if drift > r.fresh_above or diverging or not math.isfinite(loss):
            self.fresh_left = max(self.fresh_left, r.fresh_epochs)
        i = BIT_WIDTHS.index(self.bits)
        if drift > r.raise_above:
            self.bits = BIT_WIDTHS[min(i + 1, len(BIT_WIDTHS) - 1)]
        elif drift < r.lower_below:
            self.bits = BIT_WIDTHS[max(i - 1, 0)]
