"""Adaptive queue size (eq. 24-25) and the resizable device queue."""

import threading
import time

import pytest
import torch

from lightning_mqgnn.pipeline.device_queue import DeviceQueue
from lightning_mqgnn.pipeline.queue_size import AdaptiveQueueSize, memory_cap, queue_size_from_times


def test_eq24_ratio_of_slowest_preparation_to_mean_compute():
    assert queue_size_from_times(0.051, 0.010, cap=100) == 6  # ceil(5.1)
    assert queue_size_from_times(0.005, 0.010, cap=100) == 2  # never below 2 when memory allows
    assert queue_size_from_times(0.100, 0.010, cap=4) == 4  # capped by memory (eq. 25)
    assert queue_size_from_times(0.100, 0.010, cap=0) == 1  # one slot is the pipeline's minimum


def test_eq25_cap_subtracts_peak_with_margin():
    gib = 1 << 30
    # 24 GiB available, 10 GiB peak + 10% margin -> 13 GiB for queues, 1 GiB batches
    assert memory_cap(24 * gib, 10 * gib, gib, margin=0.1) == 13
    assert memory_cap(gib, 2 * gib, 1000, margin=0.05) == 0
    with pytest.raises(ValueError, match="batch_bytes"):
        memory_cap(gib, 0, 0, 0.1)


def test_adaptive_q_waits_for_warmup_then_estimates_and_tracks_drift():
    sizer = AdaptiveQueueSize(warmup=2, window=4)
    for _ in range(2):  # warm-up observations are dropped: a slow first batch must not count
        sizer.observe_prep(10.0)
        sizer.observe_compute(0.001)
    for _ in range(3):
        sizer.observe_prep(0.030)
        sizer.observe_compute(0.010)
    assert sizer.update(batch_bytes=1 << 20, batch_index=5) is None  # window not full yet
    sizer.observe_prep(0.030)
    sizer.observe_compute(0.010)
    est = sizer.update(batch_bytes=1 << 20, batch_index=6)
    assert est is not None and est.q == 3 and sizer.q == 3
    assert est.t_prep_max_s == pytest.approx(0.030) and est.t_compute_mean_s == pytest.approx(0.010)
    assert est.cap > 3 and est.available_bytes > 0
    assert sizer.update(1 << 20, 7) is None  # same times: no new estimate
    for _ in range(4):  # compute got twice as fast: Q must grow
        sizer.observe_prep(0.030)
        sizer.observe_compute(0.005)
    est2 = sizer.update(1 << 20, 11)
    assert est2 is not None and est2.q == 6
    assert [e.q for e in sizer.history] == [3, 6]


def test_device_queue_blocks_when_full_and_grows_on_resize():
    q = DeviceQueue(capacity=1)
    stop = threading.Event()
    assert q.put(1, stop)
    done = []
    t = threading.Thread(target=lambda: done.append(q.put(2, stop)))
    t.start()
    time.sleep(0.3)
    assert not done and len(q) == 1  # the producer is held back by the bound
    q.set_capacity(2)
    t.join(2.0)
    assert done == [True] and len(q) == 2
    assert q.get(0.1) == ("item", 1)
    q.finish()
    assert q.get(0.1) == ("item", 2)
    assert q.get(0.1)[0] == "end"
    assert q.get(0.05) is None


def test_device_queue_put_gives_up_on_stop():
    q = DeviceQueue(capacity=1)
    stop = threading.Event()
    q.put(torch.zeros(1), stop)
    stop.set()
    assert q.put(torch.zeros(1), stop) is False
    with pytest.raises(ValueError, match="capacity"):
        DeviceQueue(0)
