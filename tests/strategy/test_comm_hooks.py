"""The gradient queue's side of DDP's communication hooks: buckets as hooks see them, cut at the
cap, run on one thread in order; and the quantisation hook, unbiased, with the bytes it sends."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from lightning_mqgnn.quantize import META_BYTES_PER_ROW
from lightning_mqgnn.strategy import QuantizeState, quantize_hook
from lightning_mqgnn.strategy.comm_hook import (
    HookedBuckets,
    QueueBucket,
    bucket_members,
    payload_meter,
    with_process_group,
)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_bucket_shows_its_buffer_as_the_parameters_gradients():
    params = [nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(4))]
    bucket = QueueBucket(1, torch.arange(10.0), params, last=True)
    grads = bucket.gradients()
    assert [g.shape for g in grads] == [(2, 3), (4,)]
    assert torch.equal(grads[1], torch.tensor([6.0, 7.0, 8.0, 9.0]))
    grads[0].zero_()  # hooks write into the views: the buffer changes
    assert bucket.buffer()[:6].eq(0).all() and bucket.index() == 1 and bucket.is_last()
    assert bucket.parameters() == params
    bucket.set_buffer(torch.ones(10))
    assert torch.equal(bucket.gradients()[1], torch.ones(4))


def test_buckets_are_cut_at_the_cap_in_parameter_order():
    params = [torch.zeros(n) for n in (100, 100, 300, 10)]  # 400, 400, 1200, 40 bytes
    assert bucket_members(params, (0, 1, 2, 3), cap_bytes=800) == [(0, 1), (2,), (3,)]
    assert bucket_members(params, (0, 1, 2, 3), cap_bytes=10**6) == [(0, 1, 2, 3)]
    assert bucket_members(params, (3, 0), cap_bytes=1) == [(3,), (0,)]  # larger than the cap: alone


def test_a_state_without_a_group_gets_the_queues():
    group = object()
    assert with_process_group(None, group) is group
    power = powerSGD_hook.PowerSGDState(process_group=None)
    assert with_process_group(power, group) is power and power.process_group is group
    other = object()
    assert with_process_group(powerSGD_hook.PowerSGDState(process_group=other), group).process_group is other


def test_hooked_buckets_run_in_order_and_carry_a_hooks_error():
    seen = []

    def hook(state, bucket):
        seen.append(bucket.index())
        if bucket.buffer()[0] < 0:
            raise ValueError("a bad bucket")
        future = torch.futures.Future()
        future.set_result(bucket.buffer() * 2)
        return future

    runner = HookedBuckets(hook, None)
    params = [torch.zeros(2)]
    good = runner.submit([QueueBucket(i, torch.full((2,), float(i)), params, i == 2) for i in range(3)])
    bad = runner.submit([QueueBucket(0, torch.full((2,), -1.0), params, True)])
    reduced, sent = runner.wait(good)
    assert seen[:3] == [0, 1, 2] and [r.tolist() for r in reduced] == [[0, 0], [2, 2], [4, 4]]
    assert sent is None  # a hook of the user's own: its traffic is not known
    with pytest.raises(ValueError, match="a bad bucket"):
        runner.wait(bad)
    runner.close(timeout=5)


def test_the_bytes_of_torchs_hooks(one_rank_group):
    params = [torch.zeros(10)]
    for hook, expected in [(default_hooks.allreduce_hook, 40), (default_hooks.fp16_compress_hook, 20)]:
        bucket = QueueBucket(0, torch.randn(10), params, True)
        meter = payload_meter(hook, None, bucket)
        hook(None, bucket).wait()
        assert meter() == expected


def test_quantised_buckets_are_unbiased_and_small(one_rank_group):
    torch.manual_seed(0)
    x = torch.randn(5000)
    state = QuantizeState(bits=4, row_size=1024, seed=3)
    draws = []
    for _ in range(200):
        bucket = QueueBucket(0, x.clone(), [torch.zeros(5000)], True)
        draws.append(quantize_hook(state, bucket).wait().clone())
    mean = torch.stack(draws).mean(0)
    one = draws[0]
    step = (x.view(5, 1000).amax(1) - x.view(5, 1000).amin(1)) / 15  # 5 rows of 1000 elements
    assert (one - x).abs().max() <= step.max() + 1e-6  # within one step of its row
    assert (mean - x).abs().mean() < 0.2 * (one - x).abs().mean()  # the draws average to x
    assert state.bytes_sent == 200 * (5000 // 2 + 5 * META_BYTES_PER_ROW)  # 4 bits an element
    torch.manual_seed(123)  # the training's own stream is not what rounds
    again = QuantizeState(bits=4, row_size=1024, seed=3)
    first = quantize_hook(again, QueueBucket(0, x.clone(), [torch.zeros(5000)], True)).wait()
    assert torch.equal(first, draws[0])


def test_error_feedback_carries_the_rounding_error_to_the_next_step(one_rank_group):
    x = torch.linspace(-1, 1, 300)
    state = QuantizeState(bits=2, error_feedback=True)
    sent_total = torch.zeros(300)
    for _ in range(50):
        sent_total += quantize_hook(state, QueueBucket(7, x.clone(), [torch.zeros(300)], True)).wait()
    # what was sent over the steps is the sum of the gradients, up to the one error still held back
    assert torch.allclose(sent_total + state.errors[7], 50 * x, atol=1e-4)
    with pytest.raises(ValueError, match="bits must be one of"):
        QuantizeState(bits=3)
