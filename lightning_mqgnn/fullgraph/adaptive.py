"""The adaptive bit-width rule and the staleness-aware fallback of PipeQS, one controller per
(layer, direction) of halo messages.

Every rank measures, on the exact rows it sends, the relative drift of the message since the
previous epoch, ``drift = ||x_t - x_{t-1}|| / ||x_t||`` (how wrong the one-epoch-stale copy is),
and the relative error of the quantised message, ``noise = ||x̂_t - x_t|| / ||x_t||`` (its
expectation from the per-row steps, ``quantize.expected_noise_sq``). The sums
are all-reduced with the weight gradients, so every rank applies the rule to the same numbers and
picks the same policy for the next epoch:

* **bits**: stochastic rounding adds noise proportional to the step ``range / (2^b - 1)``, so the
  noise at width ``b'`` is predicted as ``noise * (2^b - 1) / (2^b' - 1)``. The target is the
  fewest bits whose predicted noise stays within ``noise_to_drift`` times the drift: quantising
  more finely than the staleness error the pipeline already accepts buys nothing, more coarsely
  lets quantisation dominate. The width moves one step (2, 4, 8) towards the target per epoch, up
  when messages settle (small drift), down when they change fast.
* **fresh exact fallback**: when the global training loss diverges (rises above its lowest value
  so far by more than ``divergence_tol`` times the first epoch's loss, a scale that stays
  meaningful when the loss nears zero) or is not finite, the next
  ``fresh_epochs`` epochs exchange exact float32 messages synchronously, as graph-parallel
  training does, so stale and quantised halos cannot keep a divergence going.

The first epoch is always fresh: there is no earlier halo to be stale with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_mqgnn.quantize import BIT_WIDTHS


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
    noise_to_drift: float = 1.0
    divergence_tol: float = 0.25
    fresh_epochs: int = 1

    def __post_init__(self) -> None:
        if self.initial_bits not in BIT_WIDTHS:
            raise ValueError(f"initial_bits must be one of {BIT_WIDTHS}, got {self.initial_bits}")
        if not self.noise_to_drift > 0:
            raise ValueError(f"noise_to_drift must be > 0, got {self.noise_to_drift}")
        if self.fresh_epochs < 1 or self.divergence_tol < 0:
            raise ValueError(
                f"fresh_epochs must be >= 1 and divergence_tol >= 0, got {self.fresh_epochs}, {self.divergence_tol}"
            )

    def target_bits(self, bits: int, noise: float, drift: float) -> int:
        """The fewest bits whose predicted quantisation noise is within ``noise_to_drift * drift``."""
        levels = (1 << bits) - 1
        for b in BIT_WIDTHS:
            if noise * levels / ((1 << b) - 1) <= self.noise_to_drift * drift:
                return b
        return BIT_WIDTHS[-1]


class BitWidthController:
    """Policy of one (layer, direction) from the all-reduced drift, noise and loss of each epoch.
    Without ``quantize`` (PipeGCN) every epoch after the first is stale and float32."""

    def __init__(self, rule: AdaptiveRule, quantize: bool = True):
        self.rule = rule
        self.quantize = quantize
        self.bits = rule.initial_bits
        self.fresh_left = 1  # the first epoch has no halo to be stale with
        self.history: list[tuple[int | None, bool, float]] = []

    def policy(self) -> MessagePolicy:
        fresh = self.fresh_left > 0
        return MessagePolicy(fresh=fresh, bits=None if fresh or not self.quantize else self.bits)

    def update(
        self, drift: float, noise: float | None, loss: float, best_loss: float, first_loss: float
    ) -> None:
        """End of an epoch: advance to the next epoch's policy. ``noise`` is None when this
        epoch's messages were not quantised (nothing measured: the width stays)."""
        current = self.policy()
        self.history.append((current.bits, current.fresh, drift))
        self.fresh_left = max(0, self.fresh_left - 1)
        r = self.rule
        rise = loss - best_loss if math.isfinite(best_loss) else 0.0
        diverging = not math.isfinite(loss) or rise > r.divergence_tol * abs(first_loss)
        if self.quantize and diverging:  # PipeQS only: PipeGCN stays one epoch stale throughout
            self.fresh_left = max(self.fresh_left, r.fresh_epochs)
        if noise is not None and current.bits is not None:
            target = r.target_bits(current.bits, noise, drift)
            i = BIT_WIDTHS.index(self.bits)
            if target > self.bits:
                self.bits = BIT_WIDTHS[i + 1]
            elif target < self.bits:
                self.bits = BIT_WIDTHS[i - 1]
