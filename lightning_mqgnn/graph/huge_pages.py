"""Back large CPU arrays with 2 MiB transparent huge pages (Linux), for random access.

Samplers read the CSR rows, the edge weights and the feature rows of random nodes: in arrays of
hundreds of MB every such read is a TLB miss with 4 KiB pages. numpy already asks for huge pages
for its large arrays (so scipy code gets them); torch's allocator does not unless the process sets
``THP_MEM_ALLOC_ENABLE=1`` before its first allocation. ``advise_huge_pages`` marks an existing
array ``MADV_HUGEPAGE`` and collapses it now (``MADV_COLLAPSE``, Linux >= 6.1; older kernels leave
the collapse to khugepaged). Nothing about the data changes; where huge pages are not available
the call does nothing.

Collapsing copies pages, so it is refused while this process has live child processes: a forked
sampler worker shares the pages copy-on-write, and a collapse in the parent would duplicate them.
A forked child inherits huge pages collapsed before the fork.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import sys

from torch import Tensor

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise_fn = _madvise()


def huge_page_span(t: Tensor) -> tuple[int, int]:
    """``(start, length)`` of the whole 2 MiB pages inside ``t``'s storage; length 0 if none."""
    storage = t.untyped_storage()
    begin = storage.data_ptr()
    end = begin + storage.nbytes()
    start = -(-begin // HUGE_PAGE) * HUGE_PAGE
    stop = end // HUGE_PAGE * HUGE_PAGE
    return start, max(stop - start, 0)


def advise_huge_pages(*tensors: Tensor) -> int:
    """Ask for huge pages under each CPU tensor's storage (see module docstring); returns the
    bytes collapsed into huge pages now. Skips shared-memory tensors and anything under 2 MiB."""
    if _madvise_fn is None or multiprocessing.active_children():
        return 0
    collapsed = 0
    for t in tensors:
        if t.device.type != "cpu" or t.is_shared():
            continue
        start, length = huge_page_span(t)
        if length == 0 or _madvise_fn(start, length, _MADV_HUGEPAGE) != 0:
            continue  # e.g. a file mapping, or THP disabled: keep the small pages
        if _madvise_fn(start, length, _MADV_COLLAPSE) == 0:
            collapsed += length
    return collapsed
