"""The signals a loader's child processes leave to their parent."""

from __future__ import annotations

import signal

# Ctrl+C, a scheduler's SIGTERM and SLURM's requeue signal go to the whole process group: the
# training process handles them (a clean stop, a checkpoint) and then stops its children itself,
# which also end on their own once that parent is gone.
PARENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def ignore_parent_signals() -> None:
    """In a child process: ignore ``PARENT_SIGNALS``."""
    for signum in PARENT_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
