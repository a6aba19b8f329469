"""Host-to-device transfer on a side CUDA stream with an explicit hand-off (paper Fig. 1, stage 4).

Producer side (transfer thread): pin, copy with ``non_blocking`` on the side stream, merge cached
feature rows on the device, record an event. Batches in the trainer's slots are already in
page-locked memory (``pin_in_place``), so pinning them copies nothing; only batches in fresh
segments are staged through pinned memory. Consumer side (training thread): make the current
stream wait on that event and ``record_stream`` every tensor, so the caching allocator never
reuses their memory while the compute stream may still read it. On CPU both sides are no-ops.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.feature_cache import merge_cached_rows


def batch_nbytes(batch: MiniBatch) -> int:
    """Bytes held by a mini-batch's tensors (M_mini-batch of eq. 25)."""
    total = 0
    for t in (
        batch.input_nodes,
        batch.output_nodes,
        batch.features,
        batch.labels,
        batch.cache_slots,
        batch.aggregated,
    ):
        if t is not None:
            total += t.numel() * t.element_size()
    for b in batch.blocks:
        for t in (b.indptr, b.indices, b.weights):
            total += t.numel() * t.element_size()
    return total


def pin_in_place(t: Tensor) -> bool:
    """Page-lock ``t``'s host memory where it lies (``cudaHostRegister``), so a copy to the GPU
    reads it directly instead of first copying it into a pinned staging buffer. Undone when ``t``
    is collected. False, and nothing changed, without CUDA or if the driver refuses."""
    if not torch.cuda.is_available() or t.is_cuda or t.numel() == 0:
        return False
    cudart = torch.cuda.cudart()
    ptr = t.data_ptr()
    if int(cudart.cudaHostRegister(ptr, t.numel() * t.element_size(), 1)) != 0:  # 1: portable
        if hasattr(cudart, "cudaGetLastError"):
            cudart.cudaGetLastError()  # do not leave the failure for the next kernel launch to report
        return False
    weakref.finalize(t, cudart.cudaHostUnregister, ptr)
    return True


class DeviceMover:
    """Moves batches to ``device`` and merges the device feature cache into ``batch.features``."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        self.cache: Tensor | None = None

    def set_cache(self, cache: Tensor | None) -> None:
        """Install the device copy of the cached feature rows (built on the current stream)."""
        self.cache = cache
        if self.cuda:
            # the side stream reads the cache: order it after the current stream's copy of it
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def to_device(self, batch: MiniBatch) -> tuple[MiniBatch, torch.cuda.Event | None]:
        """Start the copy; returns the device batch and the event that marks its completion."""
        if not self.cuda:
            out = batch.to(self.device)
            merge_cached_rows(out, self.cache)
            return out, None
        pinned = batch.pin_memory()  # pinning here, in the parent: pinned pages don't cross processes
        with torch.cuda.stream(self.stream):
            out = pinned.to(self.device, non_blocking=True)
            merge_cached_rows(out, self.cache)
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event

    def hand_over(self, batch: MiniBatch, event: torch.cuda.Event | None) -> MiniBatch:
        """Consumer side: order the current stream after the copy and pin the memory to it."""
        if event is None:
            return batch
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        batch.record_stream(current)
        return batch
