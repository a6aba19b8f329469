"""Finding a rank's process among a launcher's children (to kill it in fault tests)."""

from __future__ import annotations

from pathlib import Path


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
