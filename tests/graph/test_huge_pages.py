"""Huge pages under the big arrays samplers read at random (graph, edge weights, features)."""

from __future__ import annotations

import mmap
import multiprocessing
import sys
import time

import pytest
import torch

import lightning_mqgnn.graph.dataset as dataset_module
from lightning_mqgnn.graph.generated import generate_graph
from lightning_mqgnn.graph.huge_pages import HUGE_PAGE, advise_huge_pages, huge_page_span

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux-only")


def vma_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps record of the mapping holding ``address``."""
    record: dict[str, str] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                if record is not None:
                    return record
                record = {} if lo <= address < hi else None
            elif record is not None:
                key, _, value = line.partition(":")
                record[key] = value.strip()
    assert record is not None, f"no mapping holds {address:#x}"
    return record


def fresh_tensor(nbytes: int) -> torch.Tensor:
    """int64 ramp on a new anonymous mapping (heap memory could carry an earlier test's advice)."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(buf, dtype=torch.int64)
    t.copy_(torch.arange(t.numel()))
    return t


def thp_disabled() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" in f.read()
    except OSError:
        return True


@pytest.mark.skipif(thp_disabled(), reason="transparent huge pages are off on this machine")
def test_large_arrays_are_advised_and_collapsed_in_place():
    t = fresh_tensor(6 * HUGE_PAGE)
    before = t.clone()
    start, length = huge_page_span(t)
    assert length >= 5 * HUGE_PAGE and start % HUGE_PAGE == 0
    collapsed = advise_huge_pages(t)
    vma = vma_of(start)
    assert "hg" in vma["VmFlags"].split()  # marked MADV_HUGEPAGE: new faults and khugepaged use huge pages
    assert collapsed in (0, length)  # 0 where MADV_COLLAPSE is missing (Linux < 6.1) or no huge page is free
    assert int(vma["AnonHugePages"].split()[0]) * 1024 >= collapsed
    assert torch.equal(t, before)


def test_small_shared_and_foreign_tensors_are_left_alone():
    assert advise_huge_pages(torch.ones(1000)) == 0  # under one huge page
    assert advise_huge_pages(torch.ones(HUGE_PAGE).share_memory_()) == 0  # shared memory: not anonymous
    assert advise_huge_pages(torch.ones(HUGE_PAGE, device="meta")) == 0


def test_no_collapse_while_a_child_process_may_share_the_pages():
    # a forked child shares the parent's pages copy-on-write: collapsing them in the parent
    # would copy them, doubling the memory of every big array
    t = fresh_tensor(4 * HUGE_PAGE)
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), daemon=True)
    child.start()
    try:
        assert advise_huge_pages(t) == 0
        assert "hg" not in vma_of(huge_page_span(t)[0])["VmFlags"].split()
    finally:
        child.kill()
        child.join()


def test_datasets_ask_for_huge_pages_under_graph_and_features(monkeypatch):
    advised: list[torch.Tensor] = []
    monkeypatch.setattr(dataset_module, "advise_huge_pages", lambda *ts: advised.extend(ts) or 0)
    ds = generate_graph("products", num_nodes=2_000, seed=0)
    assert {id(t) for t in (ds.graph.indptr, ds.graph.indices, ds.features)} <= {id(t) for t in advised}
