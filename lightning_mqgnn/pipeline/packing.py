"""One shared-memory buffer per mini-batch for the trip from a worker to the training process.

torch's multiprocessing queue shares every tensor as its own shared-memory segment and passes
one file descriptor per tensor over a socket; a mini-batch has about a dozen tensors, which
costs more than sampling a small batch. Packing them into a single byte buffer makes it one
segment; the receiver rebuilds zero-copy views into it.

A fresh segment per batch still costs a page fault per 4 KiB on both sides, more than
gathering the batch into memory already mapped. So the training process lends workers
reusable, pre-faulted *slots* (``SlotArena``):
a worker gathers feature rows straight into its slot, only the slot number comes back, and the
slot is lent again once no tensor viewing it is alive. A batch too big for its slot falls back
to a fresh segment, and later slots grow.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.feature_dtypes import compute_dtype
from lightning_mqgnn.pipeline.transfer import pin_in_place
from lightning_mqgnn.sampling.batch import BLOCK_TENSORS, Block, MiniBatch

if TYPE_CHECKING:
    from lightning_mqgnn.pipeline.host_cache import TieredFeatures

_ALIGN = 64
_BATCH_TENSORS = (
    "input_nodes",
    "output_nodes",
    "features",
    "labels",
    "cache_slots",
    "aggregated",
    "pairs",
    "pair_labels",
)
SLOT_HEADROOM = 1.25  # slots are this much bigger than the largest batch seen


class Deferred(Protocol):
    """A tensor the packer computes straight into the buffer, instead of copying it there."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def write(self, out: Tensor) -> None: ...

    def value(self) -> Tensor: ...


@dataclass
class RowGather:
    """A gather left to the packer: ``source[rows]`` is written straight into the buffer. A
    ``TieredFeatures`` source (``pipeline/host_cache.py``) reads them through its tiers. Rows of
    half-precision features come out float32 (``feature_dtypes.compute_dtype``)."""

    source: Tensor | TieredFeatures
    rows: Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows.numel(), *self.source.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return compute_dtype(self.source.dtype)

    def write(self, out: Tensor) -> None:
        if out.dtype != self.source.dtype:
            out.copy_(self._read(self.rows))
        elif isinstance(self.source, Tensor):
            torch.index_select(self.source, 0, self.rows, out=out)
        else:
            self.source.read(self.rows, out=out)

    def value(self) -> Tensor:
        """The rows, on the device of ``rows``: ids sampled on a GPU gather host rows on the host
        and copy them over through page-locked memory (the host gather path), then widen them."""
        rows = self.rows
        if not isinstance(self.source, Tensor) or rows.device == self.source.device:
            return self._read(rows).to(self.dtype)
        out = self.source.index_select(0, rows.to(self.source.device))
        if rows.is_cuda and not out.is_cuda:
            out = out.pin_memory()
        return out.to(rows.device, non_blocking=True).to(self.dtype)

    def _read(self, rows: Tensor) -> Tensor:
        """``source[rows]`` in the source's dtype."""
        return (
            self.source.index_select(0, rows) if isinstance(self.source, Tensor) else self.source.read(rows)
        )


@dataclass
class PackedBatch:
    """A mini-batch as one byte buffer plus the layout (dtype, shape, offset) of each tensor.

    ``slot >= 0``: the bytes are in that slot of the receiver's ``SlotArena`` and ``buffer`` is
    None on the way.
    """

    buffer: Tensor | None
    layout: dict[str, tuple[torch.dtype, tuple[int, ...], int] | None]
    block_info: list[tuple[int, int, bool]]  # (num_dst, num_src, dst_in_src) per block
    meta: dict
    nbytes: int = 0
    slot: int = -1


def _named_tensors(batch: MiniBatch) -> list[tuple[str, Tensor | None]]:
    out = [(name, getattr(batch, name)) for name in _BATCH_TENSORS]
    for i, b in enumerate(batch.blocks):
        out += [(f"block{i}.{name}", getattr(b, name)) for name in BLOCK_TENSORS]
    return out


def shared_bytes(nbytes: int) -> Tensor:
    try:  # allocate straight in shared memory: no copy when the queue shares it
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))
    except (AttributeError, RuntimeError):
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def _view(buffer: Tensor, entry) -> Tensor | None:
    if entry is None:
        return None
    dtype, shape, off = entry
    return buffer[off : off + _nbytes(dtype, shape)].view(dtype).view(shape)


def _layout(batch: MiniBatch, gathers: dict[str, Deferred] | None) -> tuple[list, dict, int]:
    """``(named tensors, layout, total bytes)`` of ``batch`` packed with ``gathers``."""
    gathers = gathers or {}
    named = [(name, gathers.get(name, t)) for name, t in _named_tensors(batch)]
    layout: dict = {}
    offset = 0
    for name, t in named:
        if t is None:
            layout[name] = None
            continue
        layout[name] = (t.dtype, tuple(t.shape), offset)
        offset += -(-_nbytes(t.dtype, tuple(t.shape)) // _ALIGN) * _ALIGN
    return named, layout, max(offset, _ALIGN)


def packed_nbytes(batch: MiniBatch, gathers: dict[str, Deferred] | None = None) -> int:
    """Bytes ``pack_batch`` would use for ``batch``, without packing it."""
    return _layout(batch, gathers)[2]


def pack_batch(
    batch: MiniBatch,
    gathers: dict[str, Deferred] | None = None,
    slot: Tensor | None = None,
    slot_id: int = -1,
) -> PackedBatch:
    """Lay out every tensor of ``batch`` (and the ``gathers``, e.g. ``features``) in one buffer:
    ``slot`` when it is big enough, else a fresh shared segment."""
    named, layout, nbytes = _layout(batch, gathers)
    in_slot = slot is not None and slot.numel() >= nbytes
    buffer = slot if in_slot else shared_bytes(nbytes)
    for name, t in named:
        if t is None or math.prod(t.shape) == 0:
            continue
        out = _view(buffer, layout[name])
        if isinstance(t, Tensor):
            out.copy_(t)
        else:
            t.write(out)
    info = [(b.num_dst, b.num_src, b.dst_in_src) for b in batch.blocks]
    if in_slot:
        return PackedBatch(None, layout, info, batch.meta, nbytes, slot_id)
    return PackedBatch(buffer, layout, info, batch.meta, nbytes)


def unpack_batch(packed: PackedBatch) -> MiniBatch:
    """Zero-copy views into ``packed.buffer``."""
    buf, lay = packed.buffer, packed.layout
    blocks = [
        Block(
            num_dst, num_src, dst_in_src=dis, **{n: _view(buf, lay[f"block{i}.{n}"]) for n in BLOCK_TENSORS}
        )
        for i, (num_dst, num_src, dis) in enumerate(packed.block_info)
    ]
    kwargs = {name: _view(buf, lay[name]) for name in _BATCH_TENSORS}
    return MiniBatch(blocks=blocks, meta=packed.meta, **kwargs)


class SlotArena:
    """Reusable shared-memory slots lent to workers, owned by the training process.

    ``acquire`` lends a free slot (or None: the task then uses a fresh segment); ``claim`` turns a
    slot a worker filled into a byte tensor whose memory returns to the free list when the last
    tensor viewing it is freed, however long the batch lives (queues, Lightning's prefetch, a
    callback that keeps it). Thread-safe: release runs in whichever thread drops the last view.
    """

    def __init__(self, max_slots: int, pin: bool = False):
        self.max_slots = max_slots
        self.pin = pin  # page-lock each slot for CUDA copies straight from it (``pin_in_place``)
        self.slot_bytes = 0  # 0 until a batch size was seen: no slots before that
        self._slots: list[Tensor | None] = [None] * max_slots
        self._versions = [0] * max_slots
        self._free = list(range(max_slots))
        self._lock = threading.Lock()

    def acquire(self) -> tuple[int, int, Tensor] | None:
        """``(slot id, version, slot)``; the version changes whenever the slot is reallocated."""
        with self._lock:
            if self.slot_bytes == 0 or not self._free:
                return None
            i = self._free.pop()
            slot = self._slots[i]
            if slot is None or slot.numel() < self.slot_bytes:
                slot = shared_bytes(self.slot_bytes)
                slot.fill_(0)  # fault every page in now, not while a worker fills it
                if self.pin:
                    pin_in_place(slot)
                self._slots[i] = slot
                self._versions[i] += 1
            return i, self._versions[i], slot

    def observe(self, nbytes: int, slot_id: int = -1) -> None:
        """A batch of ``nbytes`` came back; if it was lent ``slot_id`` but did not use it, the
        slot is free again and future slots grow."""
        with self._lock:
            if nbytes > self.slot_bytes:
                self.slot_bytes = -(-int(nbytes * SLOT_HEADROOM) // _ALIGN) * _ALIGN
        if slot_id >= 0:  # the batch did not fit its slot
            self.release(slot_id)

    def claim(self, slot_id: int, nbytes: int) -> Tensor:
        slot = self._slots[slot_id]
        memory = (ctypes.c_uint8 * nbytes).from_address(slot.data_ptr())
        weakref.finalize(memory, self.release, slot_id, slot)  # holds the slot alive until then
        return torch.from_numpy(np.frombuffer(memory, dtype=np.uint8))

    def release(self, slot_id: int, _slot: Tensor | None = None) -> None:
        with self._lock:
            self._free.append(slot_id)

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free)
