"""Benchmark: can this machine run two stages side by side at their solo speed?

The pipeline overlaps a sampler worker with the training loop, so its gain over the sequential
loop is capped by how much two busy processes slow each other: on cores that share a physical
core (hyperthreads) or a hypervisor's budget, each may run far below its solo speed. This times
two loops, each first alone, then two copies at once in separate processes:

- ``spin``: a pure-Python integer loop (no memory traffic);
- ``gather``: random row reads from a 200 MB float32 array (memory-bound, like feature gathering).

The slowdown is side-by-side time / solo time; perfect overlap of two equal stages then gains at
most 2 / slowdown over running them one after the other. Measures only; asserts nothing.

    python recipes/bench.py cores --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks._report import machine_header, write_report


def spin(steps: int) -> float:
    t0 = time.perf_counter()
    acc = 0
    for i in range(steps):
        acc += i * i
    return time.perf_counter() - t0


def gather(repeats: int) -> float:
    rng = np.random.default_rng(0)
    table = rng.random(50_000_000, dtype=np.float32)
    rows = rng.integers(0, table.size, size=5_000_000)
    t0 = time.perf_counter()
    for _ in range(repeats):
        table[rows].sum()
    return time.perf_counter() - t0


LOOPS: dict[str, tuple[Callable[[int], float], int]] = {"spin": (spin, 15_000_000), "gather": (gather, 8)}


def _child(name: str, out) -> None:
    fn, n = LOOPS[name]
    out.put(fn(n))


def timed(name: str, copies: int) -> list[float]:
    """Seconds each of ``copies`` processes took for the loop, all started together."""
    ctx = mp.get_context("spawn")  # a clean process: no state shared with this one
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(name, out)) for _ in range(copies)]
    for p in procs:
        p.start()
    times = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return times


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating solo / side-by-side rounds")
    ap.add_argument("--out", type=str, default=None)
    args = ap.parse_args(argv)
    lines = [
        "| loop | round | solo (s) | side by side (s, each) | slowdown |",
        "|---|---|---|---|---|",
    ]
    for name in LOOPS:
        ratios = []
        for r in range(args.rounds):
            solo = timed(name, 1)[0]
            pair = timed(name, 2)
            ratios.append(statistics.mean(pair) / solo)
            lines.append(
                f"| {name} | {r + 1} | {solo:.2f} | {', '.join(f'{t:.2f}' for t in pair)} | {ratios[-1]:.2f}x |"
            )
        lines.append(f"| {name} | median | | | **{statistics.median(ratios):.2f}x** |")
    out = Path(args.out) if args.out else None
    return write_report("Two busy processes side by side", machine_header("cores", argv), lines, out)


if __name__ == "__main__":
    main()
