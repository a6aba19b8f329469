"""The fast CPU ReLU + dropout keeps nn.Dropout's contract: drop rate, unbiased scaling, gradients,
reproducibility, independent lanes, plain ReLU in eval mode; its compiled float32 pass applies
the same mask as the tensor form."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from lightning_mqgnn.models.dropout import (
    _RELU_MASK,
    MaskBuffer,
    ReLUDropout,
    _draw_seed,
    _keep_threshold,
    keep_scale,
    mask_bits,
    quantised_drop_probability,
    random_keep_mask,
    random_words,
    relu_mask_,
)


@pytest.mark.parametrize(
    ("p", "bits"), [(0.5, 1), (0.25, 2), (0.75, 2), (0.0625, 16), (0.8125, 16), (0.2, 16), (0.8, 16)]
)
def test_mask_drops_at_rate_p_and_preserves_the_mean(p, bits):
    assert mask_bits(p) == bits
    torch.manual_seed(0)
    mask = random_keep_mask(torch.Size([1000, 501]), p)  # not a multiple of a byte's lanes
    q = quantised_drop_probability(p)
    assert abs(q - p) <= 2**-17
    if bits < 16:
        assert q == p
    dropped = (mask == 0).double().mean().item()
    # 500k Bernoulli(q) draws: standard error sqrt(q(1-q)/n) < 7.1e-4; 5 standard errors
    assert abs(dropped - q) < 5 * (q * (1 - q) / mask.numel()) ** 0.5
    assert mask.dtype == torch.float32 and mask.shape == (1000, 501)
    assert torch.all((mask == 0) | torch.isclose(mask, torch.tensor(1 / (1 - q))))
    assert abs(mask.double().mean().item() - 1.0) < 5 * (q / (1 - q) / mask.numel()) ** 0.5


@pytest.mark.parametrize(("p", "lanes"), [(0.5, 64), (0.25, 32), (0.0625, 4), (0.2, 4)])
def test_lanes_of_one_random_word_are_independent(p, lanes):
    """The lanes of one 64-bit draw land on neighbouring elements: every lane position (element
    index mod lanes) drops at rate p, and neighbours drop together at rate p^2."""
    torch.manual_seed(1)
    rows = 400_000 // lanes
    q = quantised_drop_probability(p)
    dropped = (random_keep_mask(torch.Size([rows, lanes]), p) == 0).double()
    assert torch.all((dropped.mean(0) - q).abs() < 5 * (q * (1 - q) / rows) ** 0.5)
    both = (dropped[:, :-1] * dropped[:, 1:]).mean(0)
    assert torch.all((both - q * q).abs() < 5 * (q * q * (1 - q * q) / rows) ** 0.5)


@pytest.mark.parametrize("shape", [(64, 33), (61, 33)])  # 61 x 33: a partial last word
@pytest.mark.parametrize("p", [0.5, 0.25, 0.3])
def test_relu_dropout_is_relu_times_the_mask_with_its_gradient(p, shape):
    layer = ReLUDropout(p)
    h = torch.randn(*shape, requires_grad=True)
    torch.manual_seed(5)
    out = layer(h)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.manual_seed(5)
    mask = random_keep_mask(h.shape, p)
    assert set(mask.unique().tolist()) == {0.0, torch.tensor(keep_scale(p)).float().item()}
    assert torch.equal(out.detach(), torch.relu(h.detach()) * mask)
    assert torch.equal(h.grad, grad * mask * (h.detach() > 0))
    torch.manual_seed(5)
    assert torch.equal(layer(h.detach()), out.detach())  # seeds reproduce the mask


@pytest.mark.parametrize("p", [0.5, 0.75, 0.2])
def test_the_compiled_pass_equals_the_mask_applied_as_tensors(p):
    """Contiguous float32 takes the compiled pass; a transposed view the tensor form of the same
    mask, with the same seed the same output; a generator of its own reproduces the pass."""
    h = torch.randn(37, 45)
    layers = ReLUDropout(p), ReLUDropout(p)
    torch.manual_seed(4)
    compiled = layers[0](h)
    torch.manual_seed(4)
    as_tensors = layers[1](h.t().contiguous().t())  # same values, not contiguous
    assert torch.equal(compiled, as_tensors)
    assert layers[0].masks._storage is None and layers[1].masks._storage is not None  # no mask made
    torch.manual_seed(4)
    assert torch.equal(compiled, torch.relu(h) * random_keep_mask(h.shape, p))
    out = relu_mask_(h.clone(), p, torch.Generator().manual_seed(9))  # a generator of its own
    assert torch.equal(out, torch.relu(h) * random_keep_mask(h.shape, p, torch.Generator().manual_seed(9)))


@pytest.mark.parametrize("p", [0.5, 0.25, 0.75, 0.2])
@pytest.mark.parametrize("numel", [1, 63, 64, 65, 2000, 4097])
def test_every_split_of_the_pass_into_blocks_applies_the_same_mask(p, numel):
    """The pass runs in blocks of whole 64-element chunks, each drawing its own words: in any
    number of blocks, in turn or on threads, it applies the mask of the whole stream."""
    h = torch.randn(numel)
    expected = torch.relu(h) * random_keep_mask(h.shape, p, torch.Generator().manual_seed(7))
    bits = mask_bits(p)
    seed = _draw_seed(torch.Generator().manual_seed(7))
    args = (seed, bits, _keep_threshold(p, bits), np.float32(keep_scale(p)))
    for blocks in range(1, 6):
        out = h.clone()
        _RELU_MASK.serial(out.numpy(), *args, blocks)
        assert torch.equal(out, expected), f"{blocks} blocks in turn"
        out = h.clone()
        _RELU_MASK.parallel(out.numpy(), *args, blocks)
        assert torch.equal(out, expected), f"{blocks} blocks on threads"
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(relu_mask_(h.clone(), p, torch.Generator().manual_seed(7)), expected)
    finally:
        torch.set_num_threads(threads)


def test_masks_of_different_seeds_differ_and_words_cover_every_bit():
    words = [random_words(64 * 1000, 1, torch.Generator().manual_seed(s)) for s in (0, 1)]
    assert words[0].shape == (1000,) and not torch.equal(words[0], words[1])
    bits = (words[0].unsqueeze(1) >> torch.arange(64)) & 1  # every bit position is uniform
    assert torch.all((bits.double().mean(0) - 0.5).abs() < 5 * (0.25 / 1000) ** 0.5)


def test_in_place_relu_dropout_equals_the_out_of_place_one_with_its_gradients():
    linear = torch.nn.Linear(16, 24)
    x = torch.randn(50, 16)
    results = []
    for inplace in (False, True):
        linear.zero_grad()
        torch.manual_seed(3)
        h = linear(x)
        out = ReLUDropout(0.5, inplace=inplace)(h)
        assert (out.data_ptr() == h.data_ptr()) == inplace
        out.square().sum().backward()
        results.append((out.detach(), linear.weight.grad.clone(), linear.bias.grad.clone()))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_masks_written_into_a_reused_buffer_equal_fresh_ones(p):
    buffer = MaskBuffer()
    for shape in [(300, 40), (310, 40), (200, 40)]:  # grows, then reuses
        torch.manual_seed(11)
        fresh = random_keep_mask(torch.Size(shape), p)
        torch.manual_seed(11)
        assert torch.equal(random_keep_mask(torch.Size(shape), p, buffer=buffer), fresh)


def test_in_place_relu_dropout_scales_the_gradient_where_it_lies_when_it_can():
    """A contiguous incoming gradient is scaled and thresholded in place (no fresh
    activation-sized tensor); an expanded one (the gradient of a sum) is left alone."""
    p = 0.5
    h = torch.randn(40, 12, requires_grad=True)
    torch.manual_seed(2)
    out = ReLUDropout(p, inplace=True)(h * 1.0)
    seen = []
    out.register_hook(seen.append)
    out.square().sum().backward()
    expected = 2 * out.detach() * keep_scale(p) * (out.detach() > 0)
    assert torch.equal(seen[0], expected)  # the tensor handed in now holds the input's gradient
    assert torch.equal(h.grad, expected)
    h.grad = None
    torch.manual_seed(2)
    out = ReLUDropout(p, inplace=True)(h * 1.0)
    out.sum().backward()
    assert torch.equal(h.grad, keep_scale(p) * (out.detach() > 0).float())


def test_in_place_relu_dropout_after_an_op_that_keeps_its_output_fails_loudly():
    h = torch.randn(20, 8, requires_grad=True)
    out = ReLUDropout(0.5, inplace=True)(torch.sigmoid(h))  # sigmoid's backward reads its output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_eval_mode_and_zero_rate_are_relu_and_bad_rates_are_refused():
    h = torch.randn(8, 8)
    assert torch.equal(ReLUDropout(0.0)(h), F.relu(h))
    assert torch.equal(ReLUDropout(0.5).eval()(h), F.relu(h))
    with pytest.raises(ValueError, match="dropout probability"):
        ReLUDropout(1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.5, 0.25, 0.3])
def test_half_precision_inputs_get_a_mask_of_their_dtype_with_its_gradient(p, dtype):
    """Under ``precision="bf16-mixed"`` the activations are bfloat16: the mask is made in that
    dtype (no Bernoulli draw per element), kept entries are the scale as the dtype holds it, and
    the mean is kept up to that rounding."""
    layer = ReLUDropout(p)
    h = torch.randn(400, 250).to(dtype).requires_grad_()
    torch.manual_seed(7)
    out = layer(h)
    torch.manual_seed(7)
    mask = random_keep_mask(h.shape, p, dtype=dtype)
    scale = keep_scale(p, dtype)
    assert out.dtype == mask.dtype == dtype
    assert set(mask.unique().tolist()) == {0.0, scale}
    assert abs(scale - 1 / (1 - quantised_drop_probability(p))) <= 2**-7 / (1 - p)  # bf16: 8 bits
    assert torch.equal(out.detach(), torch.relu(h.detach()) * mask)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(h.grad, grad * mask * (h.detach() > 0))
    q = quantised_drop_probability(p)
    dropped = (mask == 0).double().mean().item()
    assert abs(dropped - q) < 5 * (q * (1 - q) / mask.numel()) ** 0.5


def test_relu_dropout_under_cpu_autocast_keeps_bfloat16_and_draws_no_bernoulli():
    from torch.profiler import ProfilerActivity, profile

    linear = torch.nn.Linear(32, 64)
    layer = ReLUDropout(0.5)
    x = torch.randn(128, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), profile(activities=[ProfilerActivity.CPU]) as prof:
        out = layer(linear(x))
    assert out.dtype == torch.bfloat16
    assert not any("bernoulli" in e.name for e in prof.events())


def test_the_profiler_scope_opens_only_while_a_profiler_records(monkeypatch):
    """Opening a ``record_function`` scope costs 10-100 us, profiling or not: the compiled pass
    opens its scope only under a profiler."""
    from torch.profiler import ProfilerActivity, profile

    from lightning_mqgnn.models import dropout

    opened = []
    real = dropout.record_function
    monkeypatch.setattr(dropout, "record_function", lambda name: opened.append(name) or real(name))
    layer = ReLUDropout(0.5, inplace=True)
    layer(torch.randn(64, 32))
    assert opened == []
    with profile(activities=[ProfilerActivity.CPU]):
        layer(torch.randn(64, 32))
    assert opened == ["mqgnn::relu_dropout"]
