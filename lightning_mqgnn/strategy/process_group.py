"""The process groups' end: destroyed while the interpreter is whole."""

from __future__ import annotations

import atexit

import torch.distributed as dist


def _destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Destroy every process group when the interpreter exits, before its finalisation.

    Lightning does so for NCCL only. A gloo group left alive is destroyed by the interpreter's
    teardown, where gloo's worker threads can still hold tensors whose release needs the
    interpreter: the process then aborts (``terminate called without an active exception``,
    SIGABRT) after a fit that succeeded, which a spawned run reports as a failed rank. Idempotent.
    """
    atexit.unregister(_destroy_process_group)
    atexit.register(_destroy_process_group)
