"""Tensors in memory that any process of this machine can map: the host tier shared by ranks.

``Tensor.share_memory_()`` shares memory with the processes torch's multiprocessing starts (a file
descriptor passed along when the tensor is pickled), but ranks that a launcher starts on their own
(Lightning's subprocess launcher, ``torchrun``) have no such channel. A tensor here lives in an
anonymous memory file (``memfd_create``), which another process of the same user opens through
``/proc/<pid>/fd/<fd>`` while the process that holds it lives. Nothing is left behind by a crash:
the memory is freed when the last process that maps it exits, and it has no name under
``/dev/shm``.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MachineTensorHandle:
    """Where a machine tensor lies: file descriptor ``fd`` of process ``pid`` on this machine."""

    pid: int
    fd: int
    dtype: str  # torch's name, e.g. "float32"
    shape: tuple[int, ...]

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


@dataclass
class MachineTensor:
    """A tensor in an anonymous memory file, and the descriptor this process keeps it open by
    (closed with this object; the mapping stays while ``tensor`` does): ``handle`` is what another
    process needs to map the same memory."""

    tensor: Tensor
    fd: int

    def __post_init__(self) -> None:
        weakref.finalize(self, os.close, self.fd)

    @property
    def handle(self) -> MachineTensorHandle:
        return MachineTensorHandle(
            os.getpid(), self.fd, str(self.tensor.dtype).removeprefix("torch."), tuple(self.tensor.shape)
        )


def _mapped(fd: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    flat = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=math.prod(shape), dtype=dtype)
    return flat.view(shape)


def machine_tensor(shape: tuple[int, ...], dtype: torch.dtype, name: str) -> MachineTensor:
    """A zeroed tensor of ``shape`` in a new memory file (``name`` shows in ``/proc/<pid>/maps``)."""
    fd = os.memfd_create(f"lightning_mqgnn-{name}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(1, math.prod(shape) * dtype.itemsize))
        return MachineTensor(_mapped(fd, dtype, shape), fd)
    except BaseException:
        os.close(fd)
        raise


def open_machine_tensor(handle: MachineTensorHandle) -> MachineTensor:
    """The tensor ``handle`` names, mapped in this process; its descriptor kept open here, so
    this process's handle stays valid once the one it came from has exited. OSError (naming the
    path) when that process has exited or this one may not open its descriptors."""
    fd = os.open(handle.path, os.O_RDWR | os.O_CLOEXEC)
    try:
        return MachineTensor(_mapped(fd, getattr(torch, handle.dtype), handle.shape), fd)
    except BaseException:
        os.close(fd)
        raise
