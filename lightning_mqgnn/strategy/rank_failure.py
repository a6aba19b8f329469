"""A collective that failed because another rank died or stopped answering, said in one line."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import torch.distributed as dist

from lightning_mqgnn.strategy.process_group import default_group_timeout

# what gloo says of every other collective on a connection once one of them timed out: the first
# to time out may be another thread's, or an asynchronous one not yet waited for
_PAIR_CLOSED = "Application timeout caused pair closure"
# what gloo and NCCL say when the other side of a collective is gone or silent
_PEER_GONE = (
    _PAIR_CLOSED,
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
    "timed out connecting",
    "remote worker",
    "NCCL communicator was aborted",
)
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")  # "[/path/pair.cc:553] "
# a peer that raised rather than died may take a moment to end: how long to look for its exit
DEATH_GRACE_S = 1.0


@dataclass(frozen=True)
class Peer:
    """Where a rank runs: its host and process id."""

    host: str
    pid: int


_peers: list[Peer] = []  # by rank, for the default process group (``remember_peers``)


def remember_peers() -> None:
    """Exchange every rank's host and pid once (a collective: every rank calls it), so that a
    later failure can name the ranks on this host whose process has ended."""
    global _peers
    peers: list[Peer | None] = [None] * dist.get_world_size()
    dist.all_gather_object(peers, Peer(socket.gethostname(), psutil.Process().pid))
    _peers = [peer for peer in peers if peer is not None]


_ENDED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # a zombie, or no such process any more


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return psutil.STATUS_DEAD


def _ended(pid: int) -> bool:
    return _status(pid) in _ENDED


def _local_ranks(rank: int, world: int) -> list[int]:
    """The other ranks on this host, as ``remember_peers`` recorded them (none before)."""
    here = socket.gethostname()
    if len(_peers) != world:
        return []
    return [r for r, peer in enumerate(_peers) if r != rank and peer.host == here]


def halted_ranks(rank: int, world: int) -> dict[int, str]:
    """The ranks on this host whose process has ended (``"ended"``) or is stopped
    (``"stopped"``: SIGSTOP, a job control stop), by rank."""
    halted = {}
    for r in _local_ranks(rank, world):
        status = _status(_peers[r].pid)
        if status in _ENDED:
            halted[r] = "ended"
        elif status == psutil.STATUS_STOPPED:
            halted[r] = "stopped"
    return halted


def dead_ranks(rank: int, world: int, grace_s: float = DEATH_GRACE_S) -> list[int]:
    """The ranks whose process has ended, among those on this host (``remember_peers``); in a
    group of two where none is seen, the other rank (it is the only peer)."""
    local = _local_ranks(rank, world)
    deadline = time.monotonic() + grace_s
    while local:
        dead = [r for r in local if _ended(_peers[r].pid)]
        if dead:
            return dead
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return [1 - rank] if world == 2 else []


class RankFailure(RuntimeError):
    """Raised on a surviving rank when a collective failed because another rank died or stopped
    answering: one line naming this rank, the ones that failed when they are known (on this host,
    ranks whose process ended; in a group of two, the other), the phase (``phase``:
    gradient-queue reduction, model synchronisation, checkpoint, validation, ...) and the
    backend's own first sentence. The backend's exception is its ``__cause__``, with the full
    traceback."""

    def __init__(self, message: str, phase: str, rank: int, failed_ranks: list[int]) -> None:
        super().__init__(message)
        self.phase = phase
        self.rank = rank
        self.failed_ranks = failed_ranks

    @property
    def failed_rank(self) -> int | None:
        """The failed rank when exactly one is known."""
        return self.failed_ranks[0] if len(self.failed_ranks) == 1 else None


def peer_failed(error: BaseException) -> bool:
    """Whether ``error`` is a collective's report that another rank is gone or silent."""
    text = str(error)
    return isinstance(error, dist.DistNetworkError) or any(sign in text for sign in _PEER_GONE)


def peers_failed(phase: str, failed: list[int], reason: str) -> RankFailure:
    """The one-line ``RankFailure`` of this rank in ``phase``: the ``failed`` ranks (none known:
    another rank) died or stopped answering, for ``reason``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if not failed:
        who = "another rank"
    elif len(failed) == 1:
        who = f"rank {failed[0]}"
    else:
        who = "ranks " + ", ".join(map(str, failed))
    return RankFailure(
        f"rank {rank} of {world}: {phase} failed: {who} died or stopped answering ({reason})",
        phase,
        rank,
        failed,
    )


def rank_failure(phase: str, error: BaseException) -> RankFailure:
    """The one-line ``RankFailure`` for ``error``, raised during ``phase``."""
    failed = dead_ranks(dist.get_rank(), dist.get_world_size())
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    reason = _SOURCE_PREFIX.sub("", first_line).split(". ")[0]  # gloo's advice follows its first sentence
    if reason.startswith(_PAIR_CLOSED):
        timeout = default_group_timeout()
        waited = "" if timeout is None else f" waiting {round(timeout.total_seconds() * 1000)}ms"
        reason = f"a collective on the connection to it timed out{waited}"
    return peers_failed(phase, failed, reason)


@contextmanager
def collective_phase(phase: str) -> Iterator[None]:
    """Turn a collective's failure inside the block into ``RankFailure`` naming ``phase``; any
    other error passes unchanged."""
    try:
        yield
    except RankFailure:
        raise
    except RuntimeError as error:
        if not (dist.is_available() and dist.is_initialized()) or not peer_failed(error):
            raise
        raise rank_failure(phase, error) from error
