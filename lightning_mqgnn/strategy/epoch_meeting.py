"""The ranks' meeting once an epoch's first batch is in: it waits for a slow rank, not for a
stopped or dead one on the same host.

An epoch's first batch may take each rank a different while (a loader's start, a cache refilled
from the disk), longer than the training loop's collectives wait (``step_timeout``). The ranks
therefore meet there in the process group's store rather than in a collective: each counts
itself in, then waits for the count while it watches the other ranks on its host, and gives up
on one that has been stopped (SIGSTOP) for ``stopped_after_s`` or whose process has ended. A rank
on another host that hangs is waited for up to ``limit_s`` (the group's own timeout): from this
host nothing tells it from a slow one.
"""

from __future__ import annotations

import itertools
import time

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

from lightning_mqgnn.strategy.rank_failure import halted_ranks, peers_failed

# meetings are numbered per process: every rank meets in the same order, so the n-th meeting has
# the same key on every rank, and a second fit in the same process group gets fresh keys
_meetings = itertools.count()
# between reads of the count: from a millisecond (ranks that arrive together meet at once),
# doubling to 50 ms (a waiting rank asks the store 20 times a second)
FIRST_POLL_S, POLL_S = 0.001, 0.05
WATCH_S = 0.5  # between looks at the other ranks' processes


def meet(phase: str, stopped_after_s: float, limit_s: float) -> None:
    """Return once every rank of the default group has called ``meet``, or raise ``RankFailure``
    (in ``phase``) naming the ranks on this host that stopped for ``stopped_after_s`` or ended,
    or after ``limit_s``."""
    store, rank, world = _get_default_store(), dist.get_rank(), dist.get_world_size()
    key = f"mqgnn/epoch_meeting/{next(_meetings)}"
    store.add(key, 1)
    start = watched = time.monotonic()
    stopped_since: dict[int, float] = {}
    poll_s = FIRST_POLL_S
    while store.add(key, 0) < world:
        time.sleep(poll_s)
        poll_s = min(2 * poll_s, POLL_S)
        now = time.monotonic()
        if now - watched < WATCH_S:
            continue
        watched = now
        halted = halted_ranks(rank, world)
        stopped_since = {r: stopped_since.get(r, now) for r, state in halted.items() if state == "stopped"}
        failed = sorted(
            r for r, state in halted.items() if state == "ended" or now - stopped_since[r] >= stopped_after_s
        )
        if failed:
            states = ", ".join(f"rank {r} {halted[r]}" for r in failed)
            raise peers_failed(phase, failed, f"{states} while the ranks met at an epoch's first batch")
        if now - start > limit_s:
            raise peers_failed(phase, [], f"not at an epoch's first batch within {limit_s:g} s")
