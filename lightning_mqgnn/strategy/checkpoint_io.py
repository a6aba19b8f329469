"""Checkpoint files written whole or not at all, and refused in one line when they cannot be read."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from lightning_mqgnn.durable import fsync_folder


class CheckpointError(Exception):
    """A checkpoint that could not be written or read, named with what happened to it."""


def _local_path(path: _PATH) -> Path | None:
    """``path`` as a local file, or None for a remote URL (``s3://`` and the like)."""
    text = str(path)
    if "://" in text and not text.startswith("file://"):
        return None
    return Path(text.removeprefix("file://"))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with local files written atomically.

    A checkpoint goes to a hidden file beside its target, is flushed to the disk and renamed over
    the target (``os.replace``), so a disk that fills, a quota, a file-size limit or a kill while
    writing leaves the previous file of that name whole: a run resumed after the failure loses
    what came after that checkpoint, never the checkpoint. (Lightning's own writer stages the file
    in the system's temporary folder and moves it, a copy that truncates the target when the two
    are on different file systems.) A write that fails raises ``CheckpointError`` naming the file
    and saying whether an earlier checkpoint is intact; a file that torch cannot read (truncated,
    corrupt, refused by ``weights_only``) raises ``CheckpointError`` naming it, with the reader's
    first line. Remote paths (``s3://`` and the like) go to Lightning's writer.
    """

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        target = _local_path(path)
        if storage_options is not None or target is None:
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            # O_EXCL: never another writer's file; mode 0o666 less the umask, as a plain open gives
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, target)
            fsync_folder(target.parent)
        except (OSError, RuntimeError) as err:  # torch's zip writer reports a failed write as RuntimeError
            partial.unlink(missing_ok=True)
            earlier = (
                f"the earlier {target.name} is intact"
                if target.exists()
                else "no earlier checkpoint is there"
            )
            reason = (str(err).splitlines() or [type(err).__name__])[0]
            raise CheckpointError(f"checkpoint {target}: writing it failed ({reason}); {earlier}") from err

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError:
            raise
        except Exception as err:  # a truncated or foreign file: whatever the unpickler raises
            reason = (str(err).splitlines() or [""])[0]
            # torch.save writes a zip archive: a file that is none was cut short or damaged
            local = _local_path(path)
            damaged = local is not None and not zipfile.is_zipfile(local)
            what = "truncated or corrupt" if damaged else "unreadable"
            raise CheckpointError(f"checkpoint {path}: {what} ({type(err).__name__}: {reason})") from err
