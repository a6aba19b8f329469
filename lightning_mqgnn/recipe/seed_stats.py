"""Mean and spread of a metric over runs that differ only in their seed, as papers report them
(``0.9211 ± 0.0021``). Plain Python: the recipe, its summaries and the benchmarks share it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """``mean`` and sample standard deviation ``std`` (n - 1 in the denominator: the runs are a
    sample of the seeds) of ``n`` values; ``std`` is NaN for one value, whose spread is unknown."""

    mean: float
    std: float
    n: int

    @property
    def variance(self) -> float:
        return self.std**2


def spread(values: Sequence[float]) -> Spread:
    """The ``Spread`` of ``values``; a NaN among them (a metric a run did not compute) makes the
    mean NaN rather than being left out, so a summary never hides a run."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to summarise")
    mean = math.fsum(values) / n
    if n == 1:
        return Spread(mean, math.nan, 1)
    return Spread(mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)), n)


def spread_decimals(s: Spread) -> int:
    """Decimals that show the std to two significant digits (``0.9211 ± 0.0021``,
    ``11.5 ± 1.5``); without a spread, four significant digits of the mean (none for a whole number)."""
    if math.isfinite(s.std) and s.std > 0:
        return max(0, 1 - _exponent(s.std, 2))
    if not math.isfinite(s.mean) or s.mean == round(s.mean):
        return 0
    return min(4, max(0, 3 - _exponent(abs(s.mean), 4)))


def _exponent(value: float, digits: int) -> int:
    """The power of ten of ``value``'s leading digit once rounded to ``digits`` significant digits
    (0.000999... rounds to 1.0e-03: -3, where its logarithm's floor says -4)."""
    return int(f"{value:.{digits - 1}e}".split("e")[1])


def format_spread(s: Spread, decimals: int | None = None) -> str:
    """``mean ± std`` with ``decimals`` decimals (None: ``spread_decimals``); one value is its
    mean alone."""
    d = spread_decimals(s) if decimals is None else decimals
    if math.isnan(s.std):
        return f"{s.mean:.{d}f}"
    return f"{s.mean:.{d}f} ± {s.std:.{d}f}"
