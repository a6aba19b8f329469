"""The ranks' meeting once an epoch's first batch is in: it waits for a slow rank, not for a
stopped or dead one on the same host, nor for ranks waiting at another meeting.

An epoch's first batch may take each rank a different while (a loader's start, a cache refilled
from the disk), longer than the training loop's collectives wait (``step_timeout``). The ranks
therefore meet there in the process group's store rather than in a collective: each counts
itself in, then waits for the count while it watches the other ranks on its host, and gives up
on one that has been stopped (SIGSTOP) for ``stopped_after_s`` or whose process has ended. A rank
on another host that hangs is waited for up to ``limit_s`` (the group's own timeout): from this
host nothing tells it from a slow one.

A meeting's key is the fit's identifier (``agree_on_fit``: rank 0's, broadcast to every rank)
and the epoch, state every rank shares, never a count kept by one process: a rank whose process
outlives a fit meets new peers of the next fit at the same keys. Each rank also posts the
meeting it waits at; ranks that all wait, but at different meetings, can never meet, and every
one of them ends after ``stopped_after_s`` with one line naming the meetings. The last rank to
leave a meeting deletes its keys, so a long-lived store does not grow with the epochs.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

from lightning_mqgnn.strategy.rank_failure import RankFailure, halted_ranks, peers_failed

PREFIX = "mqgnn/epoch_meeting"
# between reads of the count: from a millisecond (ranks that arrive together meet at once),
# doubling to 50 ms (a waiting rank asks the store 20 times a second)
FIRST_POLL_S, POLL_S = 0.001, 0.05
WATCH_S = 0.5  # between looks at the other ranks' processes and the meetings they wait at
NOT_WAITING = ""  # a rank's posted meeting while it waits at none


@dataclass(frozen=True)
class Meeting:
    """The meeting of one fit's ranks at one epoch's first batch."""

    fit: str
    epoch: int

    @property
    def name(self) -> str:
        return f"{self.fit}/{self.epoch}"


def _waiting_key(rank: int) -> str:
    return f"{PREFIX}/waiting/{rank}"


def agree_on_fit() -> str:
    """The identifier of this fit, the same on every rank (a collective: every rank calls it as
    the fit starts). Rank 0 draws it; each rank first posts that it waits at no meeting, so no
    rank reads a post left by a process of an earlier fit."""
    store, rank = _get_default_store(), dist.get_rank()
    store.set(_waiting_key(rank), NOT_WAITING)
    drawn = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(drawn, src=0)
    return str(drawn[0])


def meet(meeting: Meeting, phase: str, stopped_after_s: float, limit_s: float) -> None:
    """Return once every rank of the default group has called ``meet`` with ``meeting``, or
    raise ``RankFailure`` (in ``phase``) naming the ranks on this host that stopped for
    ``stopped_after_s`` or ended, the ranks that waited that long at another meeting while no
    rank was missing, or after ``limit_s``."""
    store, rank, world = _get_default_store(), dist.get_rank(), dist.get_world_size()
    key = f"{PREFIX}/{meeting.name}"
    store.set(_waiting_key(rank), meeting.name)
    store.add(key, 1)
    # a failure to meet ends the fit and asks nothing more of the store, whose host (rank 0) may
    # be the rank that ended: its error would hide the failure's one line
    _wait_for_all(store, key, meeting, phase, rank, world, stopped_after_s, limit_s)
    store.set(_waiting_key(rank), NOT_WAITING)
    if store.add(f"{key}/left", 1) == world:  # the last to leave: nobody reads these keys again
        store.delete_key(key)
        store.delete_key(f"{key}/left")


def _wait_for_all(
    store,
    key: str,
    meeting: Meeting,
    phase: str,
    rank: int,
    world: int,
    stopped_after_s: float,
    limit_s: float,
) -> None:
    start = watched = time.monotonic()
    stopped_since: dict[int, float] = {}
    elsewhere_since: float | None = None
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
        elsewhere = _waiting_elsewhere(store, meeting, rank, world)
        elsewhere_since = None if elsewhere is None else (elsewhere_since or now)
        if elsewhere is not None and now - elsewhere_since >= stopped_after_s:
            raise _never_meeting(phase, meeting, elsewhere)
        if now - start > limit_s:
            raise peers_failed(phase, [], f"not at an epoch's first batch within {limit_s:g} s")


def _waiting_elsewhere(store, meeting: Meeting, rank: int, world: int) -> dict[int, str] | None:
    """The meetings other ranks wait at, where every rank waits at one and some at another than
    ``meeting`` (such ranks never meet); None otherwise (a rank not yet there may be slow)."""
    others = {r: store.get(_waiting_key(r)).decode() for r in range(world) if r != rank}
    if any(name == NOT_WAITING for name in others.values()):
        return None
    elsewhere = {r: name for r, name in others.items() if name != meeting.name}
    return elsewhere or None


def _never_meeting(phase: str, meeting: Meeting, elsewhere: dict[int, str]) -> RankFailure:
    rank, world = dist.get_rank(), dist.get_world_size()
    where = ", ".join(f"rank {r} at {name}" for r, name in sorted(elsewhere.items()))
    return RankFailure(
        f"rank {rank} of {world}: {phase} failed: the ranks wait at different epoch meetings and can "
        f"never meet (this rank at {meeting.name}, {where})",
        phase,
        rank,
        sorted(elsewhere),
    )
