"""Memory-mapped dataset arrays: mapped for files larger than the memory, their resident pages
bounded per process.

The pages a process touches in a file mapping count in its RSS (``RssFile``) until the kernel
reclaims them, which it does only under memory pressure: training on a graph larger than the
memory would show an RSS near the physical memory, and a scheduler that limits jobs by RSS (Slurm,
a container) would stop it, though those pages are the page cache's, shared and clean. With a
bound, a daemon thread reads this process's ``RssFile`` every ``CHECK_INTERVAL_S`` and, above the
bound, drops every registered mapping's pages from this process (``madvise(MADV_DONTNEED)``): the
page cache keeps them, so the next touch is a minor fault, not a read from the disk.

The mappings are private (copy-on-write) and reserve no memory (``MAP_NORESERVE``, without which
Linux refuses to map a file larger than the memory): torch gets writable tensors and the file is
never written, but a write to a mapped tensor is lost when its page is dropped, and may fail
when memory is short, so treat them as read-only. A forked child (a sampler worker) starts its
own thread for the mappings it inherits; a spawned one maps the file again (``MappedArray``).

A file larger than ``RANDOM_ACCESS_SHARE`` of the memory is advised ``MADV_RANDOM``: batches read
it at random, and the kernel's read-around would read pages that are evicted before any batch
touches them. A pass over a whole array reads it through the file instead (``read_rows``).

Reading a batch's rows from a mapping faults one page at a time: a process waits for each read
before it asks for the next, so the disk serves one request at a time however many it could
serve at once (a cloud SSD: 10k random reads/s to one reader, 62k/s to sixteen). ``prefetch_rows``
first asks the kernel for every page the rows lie on (``MADV_WILLNEED``, which starts the reads
and returns), so the reads of a batch are in flight together and the gather then waits for the
slowest, not for their sum; for the files read at random, those the page cache cannot hold.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import psutil
from torch import Tensor

from lightning_mqgnn.graph.feature_dtypes import as_stored, storage_dtype

__all__ = [
    "MappedArray",
    "bound_resident_pages",
    "map_array",
    "mapped_source",
    "opened",
    "prefetch_rows",
    "read_at_random",
    "release_mapped_pages",
    "resident_file_bytes",
    "read_rows",
]

CHECK_INTERVAL_S = 0.05
RANDOM_ACCESS_SHARE = 0.5  # files above this share of the physical memory are read without readahead
_LINUX_MAP_NORESERVE = 0x4000  # <sys/mman.h>; Python's mmap module names it from 3.13 on

_maps: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
_lock = threading.Lock()
_limit_bytes: int | None = None
_thread: threading.Thread | None = None


@dataclass(frozen=True)
class MappedArray:
    """Where a mapped tensor's values lie: what a process needs to map them itself. Sent to a
    sampler worker in place of the tensor, which ``share_memory_`` or pickling would copy whole
    into shared memory; ``opened`` maps it there, under the sender's bound."""

    path: Path
    offset: int
    dtype: str  # torch's name (``feature_dtypes.torch_dtype``)
    shape: tuple[int, ...]
    resident_bytes: int | None = None

    def open(self) -> Tensor:
        if self.resident_bytes is not None:
            bound_resident_pages(self.resident_bytes)
        return map_array(self.path, self.offset, self.dtype, self.shape)


_sources: dict[int, MappedArray] = {}  # a mapped tensor's first byte -> where it lies
_random_mappings: dict[int, weakref.ref[mmap.mmap]] = {}  # first byte -> mapping read at random


def read_rows(t: Tensor, start: int, end: int, keep_cached: bool = True) -> Tensor:
    """Rows ``[start, end)`` of ``t``. For a tensor ``map_array`` mapped, read through its file
    into memory: ``read`` calls get the kernel's sequential readahead, which a mapping advised
    ``MADV_RANDOM`` does not (a pass over one would read a page per fault), and ``MADV_WILLNEED``
    reads no more than the readahead window. Else a view of ``t``.

    ``keep_cached=False``: for a file read at random (``MADV_RANDOM``), drop the pages this read
    from the page cache (``POSIX_FADV_DONTNEED``), for a pass that wants rows the batches will
    not read from the file: a pass over all of it would otherwise leave the page cache full of
    its pages, in place of those the batches read."""
    source = _sources.get(t.data_ptr())
    if source is None or tuple(t.shape) != source.shape:
        return t[start:end]
    dtype = storage_dtype(source.dtype)
    row = math.prod(source.shape[1:])
    first, count = source.offset + start * row * dtype.itemsize, (end - start) * row
    with open(source.path, "rb") as f:
        f.seek(first)
        array = np.fromfile(f, dtype=dtype, count=count)
        if not keep_cached and t.data_ptr() in _random_mappings:
            os.posix_fadvise(f.fileno(), first, count * dtype.itemsize, os.POSIX_FADV_DONTNEED)
    return as_stored(array.reshape((end - start, *source.shape[1:])), source.dtype)


def mapped_source(t: Tensor | None) -> MappedArray | None:
    """Where ``t`` lies if ``map_array`` mapped it (a view of the whole array), else None."""
    if t is None:
        return None
    source = _sources.get(t.data_ptr())
    if source is None or tuple(t.shape) != source.shape:
        return None
    return replace(source, resident_bytes=_limit_bytes)


def opened(t: Tensor | MappedArray | None) -> Tensor | None:
    """``t`` itself, or the tensor a ``MappedArray`` describes, mapped in this process."""
    return t.open() if isinstance(t, MappedArray) else t


def map_array(path: Path, offset: int, dtype: str, shape: tuple[int, ...]) -> Tensor:
    """The array of ``dtype`` (torch's name; a bfloat16 file holds its uint16 words,
    ``feature_dtypes.storage_dtype``) and ``shape`` at byte ``offset`` of ``path``, mapped
    copy-on-write and registered for ``release_mapped_pages``."""
    with open(path, "rb") as f:
        if sys.platform.startswith("linux"):
            # MAP_NORESERVE: a private writable mapping is otherwise charged its whole size against
            # the commit limit, which refuses (ENOMEM) a file larger than the memory
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", _LINUX_MAP_NORESERVE)
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            mapping = mmap.mmap(f.fileno(), 0, flags=flags, prot=prot)
        else:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    random_access = mapping.size() > RANDOM_ACCESS_SHARE * psutil.virtual_memory().total
    if random_access:
        # a file the page cache cannot hold is read at random: the kernel's readahead would read
        # around every fault pages that are evicted before a batch touches them
        mapping.madvise(mmap.MADV_RANDOM)
    with _lock:
        _maps.add(mapping)
    count = int(np.prod(shape, dtype=np.int64))
    array = np.frombuffer(mapping, dtype=storage_dtype(dtype), count=count, offset=offset).reshape(shape)
    tensor = as_stored(array, dtype)
    address = tensor.data_ptr()
    _sources[address] = MappedArray(Path(path), offset, dtype, tuple(shape))
    if random_access:
        _random_mappings[address] = weakref.ref(mapping)
        weakref.finalize(mapping, _random_mappings.pop, address, None)
    weakref.finalize(mapping, _sources.pop, address, None)
    return tensor


def read_at_random(t: Tensor) -> bool:
    """Whether ``t`` is an array ``map_array`` mapped from a file advised ``MADV_RANDOM`` (larger
    than ``RANDOM_ACCESS_SHARE`` of the memory): the arrays ``prefetch_rows`` reads ahead."""
    ref = _random_mappings.get(t.data_ptr())
    source = _sources.get(t.data_ptr())
    return ref is not None and ref() is not None and source is not None and tuple(t.shape) == source.shape


def prefetch_rows(t: Tensor, rows: Tensor, counts: Tensor | None = None) -> int:
    """Start reading the pages that ``t[rows]`` lies on (with ``counts``: the runs
    ``t[rows[i] : rows[i] + counts[i]]``, such as whole CSR rows of ``indices``), for a tensor
    ``map_array`` mapped and advised ``MADV_RANDOM`` (a view of the whole array). Returns the
    number of ``madvise`` calls: 0 for any other tensor, which this leaves alone. A file the page
    cache can hold is left out: after its first reads it is served from there, and the calls
    would cost more than they save (a batch asks for about as many pages as it reads rows).

    The pages are merged into runs of consecutive pages, one call each."""
    if rows.numel() == 0 or not read_at_random(t):
        return 0
    source, mapping = _sources[t.data_ptr()], _random_mappings[t.data_ptr()]()
    row_bytes = storage_dtype(source.dtype).itemsize * math.prod(source.shape[1:])
    first = source.offset + rows.cpu().numpy().astype(np.int64, copy=False) * row_bytes
    length = row_bytes if counts is None else counts.cpu().numpy().astype(np.int64, copy=False) * row_bytes
    keep = np.broadcast_to(length > 0, first.shape)
    first, last = first[keep], (first + length - 1)[keep]
    if first.size == 0:
        return 0
    order = np.argsort(first, kind="stable")
    lo, hi = first[order] // mmap.PAGESIZE, np.maximum.accumulate(last[order] // mmap.PAGESIZE)
    breaks = np.flatnonzero(lo[1:] > hi[:-1] + 1) + 1  # a gap of at least one page
    starts = lo[np.concatenate([[0], breaks])]
    ends = hi[np.concatenate([breaks - 1, [lo.size - 1]])] + 1
    with contextlib.suppress(ValueError, OSError):  # closed meanwhile: the gather will say so
        for page, end in zip(starts.tolist(), ends.tolist(), strict=True):
            mapping.madvise(mmap.MADV_WILLNEED, page * mmap.PAGESIZE, (end - page) * mmap.PAGESIZE)
    return int(starts.size)


def release_mapped_pages() -> None:
    """Drop every registered mapping's pages from this process (the page cache keeps them)."""
    with _lock:
        maps = list(_maps)
    for mapping in maps:
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile
            mapping.madvise(mmap.MADV_DONTNEED)


def resident_file_bytes() -> int:
    """This process's file-backed resident memory (``RssFile`` of ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    return 0


def bound_resident_pages(limit_bytes: int | None) -> None:
    """Keep this process's ``RssFile`` near ``limit_bytes`` (None: no bound) from now on.

    The bound is the process's ``RssFile``, which counts the pages of its libraries too (torch's:
    about 110 MiB): the last call sets it for every registered mapping. The check is a read of
    ``/proc/self/status`` every ``CHECK_INTERVAL_S``, so the RSS may pass the bound by what the
    process touches in ``CHECK_INTERVAL_S``.
    """
    global _limit_bytes
    if limit_bytes is not None and limit_bytes <= 0:
        raise ValueError(f"resident page bound must be positive, got {limit_bytes} bytes")
    _limit_bytes = limit_bytes
    if limit_bytes is not None:
        _start_thread()


def _start_thread() -> None:
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    _thread = threading.Thread(target=_watch, name="mqgnn-mapped-pages", daemon=True)
    _thread.start()


def _watch() -> None:
    while True:
        time.sleep(CHECK_INTERVAL_S)
        limit = _limit_bytes
        if limit is not None and resident_file_bytes() > limit:
            release_mapped_pages()


def _after_fork_in_child() -> None:
    global _thread, _lock
    _lock = threading.Lock()
    _thread = None
    if _limit_bytes is not None:
        _start_thread()


os.register_at_fork(after_in_child=_after_fork_in_child)
