"""Host syncs of a piece of torch code, counted by call site.

On a GPU a call synchronises the host when its result, or the size of its output, must be known
on the host: ``bool``/``int``/``float``/``item`` of a tensor, ``nonzero``, ``unique``,
``bincount``, ``repeat_interleave`` without ``output_size``, boolean-mask indexing, a copy to the
host. ``SyncCounter`` (a ``TorchFunctionMode``) sees every torch call and counts those, on any
device, by the first frame inside ``lightning_mqgnn``; on CUDA, ``cuda_sync_count`` also counts
what CUDA's sync debug mode reports, the ground truth the first count is checked against.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ALWAYS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "nonzero", "argwhere",
          "unique", "unique_consecutive", "masked_select", "bincount", "equal", "cpu", "numpy"}  # fmt: skip


def _is_mask(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def syncs(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call of torch function ``name`` with these arguments waits for the device."""
    if name in ALWAYS:
        return True
    if name == "repeat_interleave":
        return "output_size" not in kwargs and len(args) > 1 and isinstance(args[1], torch.Tensor)
    if name == "__getitem__":
        return _is_mask(args[1])
    if name == "__setitem__":
        return _is_mask(args[1]) and isinstance(args[2], torch.Tensor)
    if name in ("to", "copy_"):  # a device tensor copied to the host
        src = args[1] if name == "copy_" else args[0]
        dst = (
            args[0].device
            if name == "copy_"
            else next((a for a in (*args[1:], kwargs.get("device")) if a is not None), "")
        )
        return isinstance(src, torch.Tensor) and src.is_cuda and str(dst).startswith("cpu")
    return False


def _site() -> str:
    """``file.py:line function`` of the innermost frame inside the package."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "lightning_mqgnn" in path and "_sync_census" not in path:
            return f"{Path(path).name}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "outside the package"


class SyncCounter(TorchFunctionMode):
    """Counts syncing torch calls by ``(site, op)`` while active."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[tuple[str, str]] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if syncs(name, args, kwargs):
            self.counts[(_site(), name.strip("_"))] += 1
        return func(*args, **kwargs)


def count_syncs(run: Callable[[int], object], n: int) -> Counter[tuple[str, str]]:
    """Syncing calls of ``run(0) .. run(n - 1)`` by ``(site, op)``."""
    with SyncCounter() as counter:
        for i in range(n):
            run(i)
    return counter.counts


def cuda_sync_count(run: Callable[[int], object], n: int) -> int:
    """Synchronising CUDA calls of ``run(0) .. run(n - 1)`` (CUDA's sync debug mode warns at each)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(n):
                run(i)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)
