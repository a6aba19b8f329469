"""Mapped arrays whose resident pages stay under a bound: touched pages leave the process's RSS
when it passes the bound (the page cache keeps them), in forked children too, and the arrays read
the same after their pages are dropped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO

from lightning_mqgnn.graph import generate_graph
from lightning_mqgnn.graph.ondisk import open_dataset, write_dataset

_BOUNDED = """
import os, sys, time
import torch
from lightning_mqgnn.graph import mapped_pages
from lightning_mqgnn.graph.ondisk import open_dataset

torch.set_num_threads(1)  # OpenMP's pool does not survive a fork (the workers run single-threaded too)
folder, bound_gb = sys.argv[1], float(sys.argv[2])
ds = open_dataset(folder, resident_gb=bound_gb if bound_gb > 0 else None)
mb = lambda: mapped_pages.resident_file_bytes() / 2**20

def touch_all():
    rows = ds.features.shape[0]
    total = 0.0
    for start in range(0, rows, 4096):  # chunk by chunk, as batches read
        total += float(ds.features[start : start + 4096].sum())
        time.sleep(0.002)
    time.sleep(5 * mapped_pages.CHECK_INTERVAL_S)
    return total

before = mb()
first = touch_all()
print("parent", before, mb(), first, flush=True)
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # a forked sampler worker: its own thread keeps its own bound
    second = touch_all()
    os.write(write, f"child {mb()} {second}".encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(read, 200).decode(), flush=True)
"""


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A dataset whose features are 320 MiB: well above the bound, which is above the pages of the
    libraries (torch's: about 110 MiB, file-backed too)."""
    ds = generate_graph(num_nodes=40_000, mean_degree=4, num_features=2048, num_classes=4)
    return write_dataset(ds, tmp_path_factory.mktemp("mapped") / "wide")


def _run(folder, bound_gb: float) -> dict[str, tuple[float, ...]]:
    proc = subprocess.run(
        [sys.executable, "-c", _BOUNDED, str(folder), str(bound_gb)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.split()[0]: tuple(map(float, line.split()[1:])) for line in proc.stdout.splitlines()}


def test_resident_mapped_pages_stay_under_the_bound_in_the_process_and_its_forked_children(wide):
    features_mb = 40_000 * 2048 * 4 / 2**20
    unbounded = _run(wide, 0)
    before, after, total = unbounded["parent"]
    assert after - before > 0.9 * features_mb  # without a bound every touched page stays resident
    bounded = _run(wide, 0.1875)  # 192 MiB
    _, parent_after, parent_total = bounded["parent"]
    child_after, child_total = bounded["child"]
    assert parent_after < 192 + 32 and child_after < 192 + 32, (parent_after, child_after)
    assert parent_total == total and child_total == total  # dropped pages read back the same


def test_a_bounded_dataset_travels_with_its_bound_and_refuses_a_bad_one(wide):
    import pickle

    from lightning_mqgnn.graph import mapped_pages

    ds = open_dataset(wide, resident_gb=1.5)
    again = pickle.loads(pickle.dumps(ds))
    assert again.resident_gb == 1.5 and torch.equal(again.features[:10], ds.features[:10])
    with pytest.raises(ValueError, match="resident_gb must be positive or null, got 0"):
        open_dataset(wide, resident_gb=0)
    mapped_pages.bound_resident_pages(None)  # this test process keeps its pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmFlags of /proc/self/smaps")
def test_the_mappings_reserve_no_memory_so_a_file_larger_than_the_memory_maps(wide):
    """Without MAP_NORESERVE the kernel charges a private writable mapping's whole size against
    the commit limit and refuses one larger than the memory (ENOMEM at open)."""
    ds = open_dataset(wide)
    address = ds.features.data_ptr()
    flags = None
    for block in Path("/proc/self/smaps").read_text().split("\n"):
        if "-" in block.split(" ", 1)[0] and ":" not in block.split(" ", 1)[0]:
            low, high = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
            inside = low <= address < high
        elif block.startswith("VmFlags:") and inside:
            flags = block.split()[1:]
            break
    assert flags is not None and "nr" in flags, flags


def test_a_mapped_graph_travels_as_its_files_and_an_in_memory_one_as_its_arrays(tmp_path):
    """A spawned sampler worker receives the sampler's graph pickled: mapped, it is mapped again
    there (a few hundred bytes on the way), not copied whole into shared memory."""
    import pickle

    from lightning_mqgnn.graph.mapped_pages import mapped_source

    ds = generate_graph("arxiv", scale=0.01, seed=2)
    mapped = open_dataset(write_dataset(ds, tmp_path / "d")).graph
    sent = pickle.dumps(mapped)
    received = pickle.loads(sent)
    assert len(sent) < 2000 and mapped_source(received.indices) is not None
    assert torch.equal(received.indptr, ds.graph.indptr) and torch.equal(received.indices, ds.graph.indices)
    in_memory = pickle.dumps(ds.graph)
    assert (
        len(in_memory) > ds.graph.indices.numel() * 8
        and mapped_source(pickle.loads(in_memory).indices) is None
    )


def _resident_pages(t: torch.Tensor, offset: int, nbytes: int) -> set[int]:
    """The pages of a mapped file that are in the page cache (``mincore`` over its mapping)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    base = t.data_ptr() - offset  # the mapping starts at the file's first byte
    pages = (nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(base), ctypes.c_size_t(nbytes), vec) == 0, ctypes.get_errno()
    return {i for i in range(pages) if vec[i] & 1}


def test_prefetch_reads_the_pages_of_the_rows_asked_for_and_no_others(tmp_path, monkeypatch):
    import os
    import time

    import numpy as np

    from lightning_mqgnn.graph import mapped_pages
    from lightning_mqgnn.graph.mapped_pages import map_array, prefetch_rows

    offset, rows, width = 128, 4096, 256  # float32 rows of 1 KiB after a header: some straddle pages
    values = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    path = tmp_path / "rows.bin"
    with open(path, "wb") as f:
        f.write(b"\0" * offset + values.tobytes())
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages leave the cache
    size = path.stat().st_size
    fits = map_array(path, offset, "float32", (rows, width))
    assert prefetch_rows(fits, torch.tensor([5])) == 0  # the page cache can hold it: left alone
    monkeypatch.setattr(mapped_pages, "RANDOM_ACCESS_SHARE", 0.0)  # as if larger than the memory
    t = map_array(path, offset, "float32", (rows, width))
    assert _resident_pages(t, offset, size) == set()

    # rows 3 (bytes 3200-4223: pages 0 and 1), 5 and 6 (page 1), 100 (page 25), 4000 (page 1000)
    assert prefetch_rows(t, torch.tensor([4000, 5, 3, 100, 6])) == 3  # runs [0, 1], [25], [1000]
    expect = {0, 1, 25, 1000}
    deadline = time.monotonic() + 10
    while _resident_pages(t, offset, size) != expect and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _resident_pages(t, offset, size) == expect  # read ahead of any touch, and nothing else
    assert torch.equal(t[torch.tensor([3, 100])], torch.from_numpy(values[[3, 100]]))

    # runs of rows (whole CSR rows): rows 10-29 are bytes 10368-30847, pages 2-7, one call
    assert prefetch_rows(t, torch.tensor([10, 12]), counts=torch.tensor([20, 3])) == 1
    assert prefetch_rows(t, torch.tensor([10]), counts=torch.tensor([0])) == 0  # an empty row
    assert prefetch_rows(torch.from_numpy(values), torch.tensor([1])) == 0  # not mapped: left alone


def test_a_pass_that_keeps_no_pages_leaves_the_page_cache_as_it_was(tmp_path, monkeypatch):
    import os

    import numpy as np

    from lightning_mqgnn.graph import mapped_pages
    from lightning_mqgnn.graph.mapped_pages import map_array, read_rows

    values = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
    path = tmp_path / "rows.bin"
    values.tofile(path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    monkeypatch.setattr(mapped_pages, "RANDOM_ACCESS_SHARE", 0.0)  # read at random
    t = map_array(path, 0, "float32", values.shape)
    size = path.stat().st_size
    assert torch.equal(read_rows(t, 100, 900, keep_cached=False), torch.from_numpy(values[100:900]))
    assert _resident_pages(t, 0, size) == set()
    assert torch.equal(read_rows(t, 100, 900), torch.from_numpy(values[100:900]))
    assert len(_resident_pages(t, 0, size)) >= 200  # kept: the 200 pages of rows 100-899
