"""Files that survive a crash whole: the bytes of a file, then the folder entry that names it,
reach the disk before a write counts as done (a rename is only durable once its folder is)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (a file created or renamed in it) to the disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
