"""Launching ranks from a test (an environment without this process's rank variables) and finding
a rank's process among a launcher's children (to kill it in fault tests)."""

from __future__ import annotations

import os
from pathlib import Path

RANK_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK", "MASTER_PORT", "MASTER_ADDR")


def launcher_env(**extra: str) -> dict[str, str]:
    """This process's environment for a launcher of ranks: one thread per rank, no Python
    warnings, none of the rank variables a launcher sets, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}


def rank_process(parent: int, rank: int) -> int | None:
    """The pid of ``parent``'s child whose environment has ``LOCAL_RANK=rank``, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if f"LOCAL_RANK={rank}".encode() in environ and int(stat[1]) == parent:
            return int(entry.name)
    return None
