"""One shared-memory segment per mini-batch for the trip from a worker to the training process.

torch's multiprocessing queue shares every tensor as its own shared-memory segment and passes
one file descriptor per tensor over a socket; a mini-batch has about a dozen tensors, which
costs more than sampling a small batch. Packing them into a single byte buffer makes it one
segment and one descriptor; the receiver rebuilds zero-copy views into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.sampling.batch import Block, MiniBatch

_ALIGN = 64
_BATCH_TENSORS = ("input_nodes", "output_nodes", "features", "labels", "cache_slots")
_BLOCK_TENSORS = ("indptr", "indices", "weights")


@dataclass
class PackedBatch:
    """A mini-batch as one byte buffer plus the layout (dtype, shape, offset) of each tensor."""

    buffer: Tensor
    layout: dict[str, tuple[torch.dtype, tuple[int, ...], int] | None]
    block_info: list[tuple[int, int, bool]]  # (num_dst, num_src, dst_in_src) per block
    meta: dict


def _named_tensors(batch: MiniBatch) -> list[tuple[str, Tensor | None]]:
    out = [(name, getattr(batch, name)) for name in _BATCH_TENSORS]
    for i, b in enumerate(batch.blocks):
        out += [(f"block{i}.{name}", getattr(b, name)) for name in _BLOCK_TENSORS]
    return out


def _shared_bytes(nbytes: int) -> Tensor:
    try:  # allocate straight in shared memory: no copy when the queue shares it
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))
    except (AttributeError, RuntimeError):
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()


def pack_batch(batch: MiniBatch) -> PackedBatch:
    named = _named_tensors(batch)
    layout: dict = {}
    offset = 0
    for name, t in named:
        if t is None:
            layout[name] = None
            continue
        layout[name] = (t.dtype, tuple(t.shape), offset)
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    buffer = _shared_bytes(max(offset, _ALIGN))
    for name, t in named:
        if t is not None and t.numel() > 0:
            dtype, shape, off = layout[name]
            nbytes = t.numel() * t.element_size()
            buffer[off : off + nbytes].view(dtype).view(shape).copy_(t)
    info = [(b.num_dst, b.num_src, b.dst_in_src) for b in batch.blocks]
    return PackedBatch(buffer, layout, info, batch.meta)


def _view(buffer: Tensor, entry) -> Tensor | None:
    if entry is None:
        return None
    dtype, shape, off = entry
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    return buffer[off : off + nbytes].view(dtype).view(shape)


def unpack_batch(packed: PackedBatch) -> MiniBatch:
    """Zero-copy views into ``packed.buffer``."""
    buf, lay = packed.buffer, packed.layout
    blocks = [
        Block(num_dst, num_src, *(_view(buf, lay[f"block{i}.{n}"]) for n in _BLOCK_TENSORS), dst_in_src=dis)
        for i, (num_dst, num_src, dis) in enumerate(packed.block_info)
    ]
    kwargs = {name: _view(buf, lay[name]) for name in _BATCH_TENSORS}
    return MiniBatch(blocks=blocks, meta=packed.meta, **kwargs)
