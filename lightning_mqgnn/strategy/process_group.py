"""The process groups' timeout, changed after their creation, and their end: destroyed while the
interpreter is whole."""

from __future__ import annotations

import atexit
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

try:  # torch >= 2.3; torch 2.2 fixes a group's timeout when it creates the group
    from torch.distributed.distributed_c10d import _set_pg_timeout
except ImportError:
    _set_pg_timeout = None

# torch's public torch.distributed.set_timeout where it exists, else its private _set_pg_timeout
_timeout_setter = getattr(dist, "set_timeout", None) or _set_pg_timeout
# what set_timeout last gave each group, for as long as that group lives: a default group made
# anew (another init_process_group) has no timeout here until set_timeout gives it one
_timeouts: weakref.WeakKeyDictionary[Any, timedelta] = weakref.WeakKeyDictionary()


def can_set_timeout() -> bool:
    """Whether this torch can change a process group's timeout after creating it."""
    return _timeout_setter is not None


def set_timeout(timeout: timedelta, group: Any = None) -> None:
    """Let every later collective of ``group`` (None: the default group) wait at most ``timeout``;
    RuntimeError where ``can_set_timeout`` is False."""
    if _timeout_setter is None:
        raise RuntimeError(f"torch {torch.__version__} cannot change a process group's timeout")
    _timeout_setter(timeout, group)
    _timeouts[dist.group.WORLD if group is None else group] = timeout


def default_group_timeout() -> timedelta | None:
    """The timeout ``set_timeout`` last gave the current default group (None: it never gave this
    group one, or no group is initialised). torch has no public getter for a group's timeout."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return _timeouts.get(dist.group.WORLD)


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
