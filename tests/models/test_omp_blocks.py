"""Compiled loops in blocks on torch's OpenMP threads: the blocks run on threads in the process
that imported the module, in turn in a process forked from it, with the same result."""

import multiprocessing

import numpy as np

from lightning_mqgnn.models import omp_blocks
from lightning_mqgnn.models.dropout import _RELU_MASK, keep_scale
from lightning_mqgnn.models.omp_blocks import run_blocked


def _relu_mask(h: np.ndarray, threads: int) -> np.ndarray:
    out = h.copy()
    run_blocked(_RELU_MASK, out, np.uint64(12345), 1, 0, np.float32(keep_scale(0.5)), threads=threads)
    return out


def _child(h, queue):
    queue.put(_relu_mask(h, threads=2))


def test_a_process_forked_after_a_parallel_run_runs_the_blocks_in_turn():
    """numba's GNU OpenMP layer is not fork-safe: a child forked from a process whose parallel
    loops have run, which starts one itself, is terminated. In a forked child the blocks run in
    turn on its one thread, with the same result."""
    h = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    expected = _relu_mask(h, threads=2)
    assert omp_blocks._on_torchs_threads  # the parallel build has run, on the omp layer
    assert np.array_equal(expected, _relu_mask(h, threads=1))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(h, queue))
    child.start()
    child.join(timeout=60)
    if child.is_alive():  # a hung child fails the test below, and is not left behind
        child.kill()
        child.join()
    assert child.exitcode == 0, f"the forked child ended with {child.exitcode}"
    assert np.array_equal(queue.get(timeout=10), expected)
