"""What every sampler shares: the ``Sampler`` protocol and the local-id relabelling."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.cpu_kernels import relabel


def row_positions(
    starts: Tensor, counts: Tensor, out: Tensor | None = None, total: int | None = None
) -> Tensor:
    """``cat([arange(s, s + c) for s, c in zip(starts, counts)])``: the CSR positions of whole
    rows (empty rows allowed). On the CPU one cumulative sum of steps that are 1 except at a row's
    first position, where each row adds its jump from the previous row's end to its own start
    (an empty row's jumps telescope into the next row's; trailing ones land in a spare entry). On
    a GPU ``row_positions_by_repeat``, which waits for the device once (the total) instead of
    twice, and not at all when the caller knows ``total`` (``counts.sum()``).
    ``out``: an int64 buffer to write into when it holds ``total + 1`` entries (a ``Workspace``'s)."""
    if starts.is_cuda:
        return row_positions_by_repeat(starts, counts, out, total)
    total = int(counts.sum()) if total is None else total
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=starts.device)
    if out is None or out.numel() <= total:
        out = torch.empty(total + 1, dtype=torch.int64, device=starts.device)
    step = out[: total + 1].fill_(1)
    ends = starts + counts
    jumps = starts - torch.cat([ends.new_ones(1), ends[:-1]])  # before the first row: position 0 + 1
    step.index_add_(0, torch.cumsum(counts, 0) - counts, jumps)
    return step[:total].cumsum_(0)


def row_positions_by_repeat(
    starts: Tensor, counts: Tensor, out: Tensor | None = None, total: int | None = None
) -> Tensor:
    """``row_positions`` as ``arange(total)`` shifted by each row's ``start - output start``:
    empty rows need no filtering, so the only host read is the total (none when given)."""
    total = int(counts.sum()) if total is None else total
    shift = starts - (torch.cumsum(counts, 0) - counts)
    if out is None:
        out = torch.arange(total, dtype=torch.int64, device=starts.device)
    else:
        out = torch.arange(total, dtype=torch.int64, device=starts.device, out=out[:total])
    return out.add_(torch.repeat_interleave(shift, counts, output_size=total))


def distinct_where(ids: Tensor, keep: Tensor, beyond: int) -> Tensor:
    """``torch.unique(ids[keep])`` in one host read (the count of distinct ids) instead of two (the
    mask's, then ``unique``'s): ids not kept become ``beyond`` (larger than every id), which sorts
    last and is dropped, one more of it appended so that it is always there to drop."""
    pad = ids.new_full((1,), beyond)
    return torch.unique(torch.cat([torch.where(keep, ids, pad), pad]))[:-1]


class Workspace:
    """Named buffers reused from layer to layer and batch to batch for a sampler's per-candidate
    arrays: a layer's candidate edges run into the millions, and fresh tensors of that size cost
    the allocator fresh pages (page faults) that outweigh the arithmetic on them. Each buffer grows
    to the largest request seen. Not pickled (each process makes its own); not thread-safe."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def __getstate__(self) -> dict:
        return {"_buffers": {}}

    def take(self, name: str, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The first ``size`` entries of buffer ``name``; their values are left over from earlier
        use. Valid until the next ``take`` of the same name."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size or buffer.dtype != dtype or buffer.device != device:
            grown = size if buffer is None else max(size, buffer.numel() + buffer.numel() // 4)
            buffer = torch.empty(grown, dtype=dtype, device=device)
            self._buffers[name] = buffer
        return buffer[:size]


@runtime_checkable
class Sampler(Protocol):
    """Turns seed (output) node ids into a ``MiniBatch`` of ``num_layers`` blocks.

    Samplers are picklable and draw from ``rng.sampling_generator()`` (torch's default generator
    when none is set), so every loader seeds each batch alike. They create every tensor on their
    graph's device, so a sampler moved to a GPU (``pipeline.device_loader.to_device``) samples there. ``aggregation`` names the exact operator the sampled
    blocks estimate (``"gcn"``: D^-1/2 (A+I) D^-1/2, eq. 2; ``"mean"``: neighbour mean, eq. 17),
    which validation and test inference then use without sampling.
    """

    num_layers: int
    aggregation: str

    def sample(self, seeds: Tensor) -> MiniBatch: ...


_THREAD_SCRATCH = threading.local()


class NodeScratch:
    """An int64 scratch array over all nodes, -1 between uses, made on first use on the device that
    asks for it. Not pickled: each process makes its own.

    Every ``NodeScratch`` of a thread with the same node count and device uses one array: each use
    leaves it at -1, and one thread's uses never overlap, so a sampler's relabeler and source index
    and those of the samplers inside it (GNS over LABOR has four) need 8 bytes a node in all, not
    32 (2 GB per worker process on a 62M-node graph). Threads keep separate arrays; an array lives
    while a ``NodeScratch`` whose last use it served does."""

    def __init__(self, num_nodes: int):
        self.num_nodes = num_nodes
        self._held: Tensor | None = None  # the array of its last use, kept alive

    def __getstate__(self) -> dict:
        return {"num_nodes": self.num_nodes, "_held": None}

    def scratch(self, device: torch.device) -> Tensor:
        """The scratch array on ``device``, -1 everywhere."""
        device = torch.device(device)
        shared = _THREAD_SCRATCH.__dict__.setdefault("arrays", weakref.WeakValueDictionary())
        key = (self.num_nodes, device.type, device.index)
        slot = shared.get(key)
        if slot is None:
            slot = torch.full((self.num_nodes,), -1, dtype=torch.int64, device=device)
            shared[key] = slot
        self._held = slot
        return slot


class Relabeler(NodeScratch):
    """Maps global node ids to block-local ids with a reusable scratch array over all nodes.

    Keeps the destination nodes as a prefix of the sources (for SAGE's self features) without a
    hash map; the new sources follow in ascending order. On the CPU one compiled pass
    (``cpu_kernels.relabel``); on a GPU one ``unique`` (``distinct_where``). One instance per
    process; not thread-safe.
    """

    def __call__(self, prefix: Tensor, others: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(nodes, local)``: ``nodes`` = ``prefix`` then the new ids of ``others`` in
        ascending order, and ``local`` = the position of every entry of ``others`` in ``nodes``.
        ``prefix`` must hold distinct ids."""
        device = prefix.device
        slot = self.scratch(device)
        if not others.is_cuda:
            return relabel(prefix.contiguous(), others.contiguous(), slot)
        slot.index_copy_(0, prefix, torch.arange(prefix.numel(), device=device))
        new = distinct_where(others, slot.index_select(0, others) < 0, self.num_nodes)
        slot.index_copy_(0, new, torch.arange(prefix.numel(), prefix.numel() + new.numel(), device=device))
        local = slot.index_select(0, others)
        nodes = torch.cat([prefix, new])
        slot.index_fill_(0, nodes, -1)  # leave the scratch clean for the next call
        return nodes, local


def sample_top_down(
    seeds: Tensor, fanouts: Sequence[int], sample_layer: Callable[[Tensor, int], tuple[Block, Tensor]]
) -> MiniBatch:
    """The node-wise samplers' loop: from the output layer down, ``sample_layer(dst, fanout)``
    returns a layer's block and its sources, which are the next layer's destinations; the blocks
    come out input layer first."""
    seeds = seeds.to(torch.int64)
    dst = seeds
    blocks: list[Block] = []
    for fanout in reversed(fanouts):
        block, dst = sample_layer(dst, fanout)
        blocks.append(block)
    blocks.reverse()
    return MiniBatch(input_nodes=dst, output_nodes=seeds, blocks=blocks)
