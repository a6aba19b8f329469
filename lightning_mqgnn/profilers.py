"""A Lightning profiler that records nothing, at no cost per profiled action."""

from __future__ import annotations

import contextlib

from lightning.pytorch.profilers import PassThroughProfiler
from typing_extensions import override


class NullProfiler(PassThroughProfiler):
    """Lightning's ``PassThroughProfiler`` (the Trainer's default when no profiler is asked for),
    whose ``profile`` hands out one shared context that does nothing instead of building a
    generator-based one per call. The Trainer opens about 65 of them a training step (each hook of
    each callback, of the module and of the strategy); on 2 CPU cores that took a few tenths of a
    millisecond a step (BENCHMARKS.md), time a GPU waits for.
    """

    _NOTHING = contextlib.nullcontext()

    @override
    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return self._NOTHING
