"""ReLU + dropout fused with the next layer's aggregation: the same forward, bit for bit, and the
same gradient to float32 rounding as the two steps apart, for every mask width; the cases it
leaves to the two steps; and its one-pass backward."""

import pytest
import torch

import lightning_mqgnn.models.activated_aggregation as fused
from lightning_mqgnn.models.activated_aggregation import activated_aggregate
from lightning_mqgnn.models.dropout import ReLUDropout
from lightning_mqgnn.sampling.batch import Block


def sampled_block(num_dst: int, num_src: int, max_deg: int, seed: int) -> Block:
    """Destinations first among the sources, as node-wise samplers make them; one empty row."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_deg + 1, (num_dst,), generator=g)
    counts[0] = 0
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    indptr[1:] = counts.cumsum(0)
    indices = torch.randint(0, num_src, (int(indptr[-1]),), generator=g)
    weights = torch.rand(indices.numel(), generator=g)
    return Block(num_dst, num_src, indptr, indices, weights, dst_in_src=True)


def run(block, with_self, p, apart, seed=0):
    """Output, gradient and the overwritten input of ``aggregate(ReLUDropout(p)(z))`` for ``z``
    the output of a linear map (as in a layer), the two steps fused or ``apart``."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(block.num_src, 12, generator=g)
    w = torch.randn(12, 33, generator=g, requires_grad=True)
    upstream = torch.randn(block.num_dst, 66 if with_self else 33, generator=g)
    activation = ReLUDropout(p, inplace=True)
    z = x @ w
    torch.manual_seed(seed)
    if apart:
        h = activation(z)
        out = block.aggregate_with_self(h) if with_self else block.aggregate(h)
    else:
        out = activated_aggregate(block, z, activation, with_self=with_self)
    out.backward(upstream)
    return out.detach(), w.grad, z.detach()


@pytest.mark.parametrize("with_self", [False, True])
@pytest.mark.parametrize("p", [0.5, 0.25, 0.3])  # 1, 2 and 16 random bits an element
@pytest.mark.parametrize("transpose", [False, True])
def test_fused_equals_the_two_steps_apart(with_self, p, transpose):
    block = sampled_block(30, 200, 5, seed=2)
    if transpose:
        block = block.with_transpose()
    out, grad, z = run(block, with_self, p, apart=False)
    out_apart, grad_apart, z_apart = run(block, with_self, p, apart=True)
    assert torch.equal(out, out_apart)  # the same mask and the same forward operators
    assert torch.equal(z, z_apart)  # both overwrite the activation with relu(z) * mask
    assert torch.allclose(grad, grad_apart, rtol=1e-5, atol=1e-5)
    assert not torch.equal(grad, torch.zeros_like(grad))


def test_every_thread_count_gives_the_same_gradient():
    block = sampled_block(50, 400, 6, seed=3).with_transpose()
    threads = torch.get_num_threads()
    try:
        grads = []
        for n in (1, 2):
            torch.set_num_threads(n)
            grads.append(run(block, True, 0.5, apart=False)[1])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(grads[0], grads[1])  # each source row is summed by one thread, in one order


def test_the_backward_is_one_pass():
    """No ``embedding_bag`` over the transpose and no ReLU + dropout backward: one compiled loop."""
    block = sampled_block(30, 200, 5, seed=2).with_transpose()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run(block, False, 0.5, apart=False)
    names = [e.name for e in prof.events()]
    assert names.count("aten::_embedding_bag_forward_only") == 1  # the forward's only
    assert "aten::elu_backward" not in names and "aten::threshold_backward" not in names
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run(block, False, 0.5, apart=True)
    assert "aten::elu_backward" in [e.name for e in prof.events()]  # the check above can fail


@pytest.mark.parametrize(
    "case",
    ["eval", "not_inplace", "no_dropout", "float64", "no_grad"],
)
def test_the_cases_it_leaves_to_the_two_steps(case, monkeypatch):
    """Evaluation, a ReLU + dropout that must not overwrite its input, p = 0, other dtypes and no
    graph run apart, with the same result."""
    called = []
    monkeypatch.setattr(fused, "_fused", lambda *a: called.append(a))
    block = sampled_block(10, 60, 4, seed=5)
    activation = ReLUDropout(0.0 if case == "no_dropout" else 0.5, inplace=case != "not_inplace")
    if case == "eval":
        activation.eval()
    dtype = torch.float64 if case == "float64" else torch.float32
    z = torch.randn(60, 8, dtype=dtype, requires_grad=case != "no_grad") * 1.0
    torch.manual_seed(0)
    out = activated_aggregate(block, z, activation)
    assert called == []
    if case in ("eval", "no_dropout"):
        assert torch.allclose(out, block.aggregate(torch.relu(z.detach())))
