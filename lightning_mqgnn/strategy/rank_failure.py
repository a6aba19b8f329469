"""A collective that failed because another rank died or stopped answering, said in one line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

# what gloo and NCCL say when the other side of a collective is gone or silent
_PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
    "timed out connecting",
    "remote worker",
    "NCCL communicator was aborted",
)
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")  # "[/path/pair.cc:553] "


class RankFailure(RuntimeError):
    """Raised on a surviving rank when a collective failed because another rank died or stopped
    answering: one line naming this rank, the one that failed when it is known (in a group of
    two, the other), the phase (``phase``: gradient-queue reduction, model synchronisation,
    checkpoint, validation, ...) and the backend's own first sentence. The backend's exception is
    its ``__cause__``, with the full traceback."""

    def __init__(self, message: str, phase: str, rank: int, failed_rank: int | None) -> None:
        super().__init__(message)
        self.phase = phase
        self.rank = rank
        self.failed_rank = failed_rank


def peer_failed(error: BaseException) -> bool:
    """Whether ``error`` is a collective's report that another rank is gone or silent."""
    text = str(error)
    return isinstance(error, dist.DistNetworkError) or any(sign in text for sign in _PEER_GONE)


def rank_failure(phase: str, error: BaseException) -> RankFailure:
    """The one-line ``RankFailure`` for ``error``, raised during ``phase``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failed = 1 - rank if world == 2 else None
    who = f"rank {failed}" if failed is not None else "another rank"
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    reason = _SOURCE_PREFIX.sub("", first_line).split(". ")[0]  # gloo's advice follows its first sentence
    return RankFailure(
        f"rank {rank} of {world}: {phase} failed: {who} died or stopped answering ({reason})",
        phase,
        rank,
        failed,
    )


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
