"""Compiled loops run in blocks of rows on torch's own OpenMP threads.

The step's memory-bound passes over an activation (ReLU + dropout, the fused aggregation
backward) are numba loops. On one thread they leave the second core idle; on numba's own
threads those would wait beside torch's spinning ones. numba's ``omp`` threading layer binds to
the ``libgomp`` torch has already loaded (one OpenMP runtime in the process), so a ``prange`` over
blocks runs on torch's threads: this module puts ``omp`` first unless ``NUMBA_THREADING_LAYER`` is
set, and runs one block per torch thread. With another layer loaded it runs one block on one
thread, as it does in a process forked from the one that imported this module (numba's GNU
OpenMP layer is not fork-safe: it terminates a forked child that starts a parallel loop).

A loop comes as twins, compiled from one factory over ``prange`` and over ``range``: numba's
cache keys an entry by code and closure, not by the ``parallel`` flag, so one function compiled
both ways would load either build from the cache. Written inline in a ``prange``, ReLU +
dropout's lane loop was not vectorised (1.63 ms a pass against 0.60 ms on one thread); as a
separate compiled function that the ``prange`` calls, it is. The fused backward, bound by memory,
ran the same either way (BENCHMARKS.md) and stays inline.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numba
from numba import prange

if "NUMBA_THREADING_LAYER" not in os.environ:  # the user's choice stands; else torch's threads first
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]

# numba's OpenMP state is this process's: compiling a parallel loop may already start its threads
_IMPORTED_IN = os.getpid()
_on_torchs_threads: bool | None = None  # whether numba loaded the omp layer; known after a first run


@dataclass(frozen=True)
class BlockedLoop:
    """A compiled loop whose last argument is its number of blocks: ``parallel`` runs them on
    threads, ``serial`` in turn."""

    parallel: Callable
    serial: Callable


def blocked_loop(factory: Callable[[Callable, bool], Callable]) -> BlockedLoop:
    """Both builds of ``factory(blocks_of, parallel)``, which returns the loop compiled with
    ``parallel`` over ``blocks_of`` (``prange`` or ``range``)."""
    return BlockedLoop(parallel=factory(prange, True), serial=factory(range, False))


def runs_parallel() -> bool:
    """Whether parallel loops may run: in the process that imported this module, unless numba
    loaded a threading layer other than ``omp``."""
    return os.getpid() == _IMPORTED_IN and _on_torchs_threads is not False


def run_blocked(loop: BlockedLoop, *args, threads: int) -> None:
    """``loop(*args, blocks)``: one block per thread of ``threads`` (torch's count) on torch's
    OpenMP threads where that may run (``runs_parallel``), else one block on this thread."""
    global _on_torchs_threads
    if threads > 1 and runs_parallel():
        blocks = min(threads, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(blocks)
        loop.parallel(*args, blocks)
        if _on_torchs_threads is None:
            _on_torchs_threads = numba.threading_layer() == "omp"
    else:
        loop.serial(*args, 1)
