"""stable_argsort equals torch's stable sort, padded or not."""

import pytest
import torch

from lightning_mqgnn.sampling.radix_sort import PAD_FROM, RADIX_SORT_MIN, stable_argsort


@pytest.mark.parametrize("n", [0, 1, 100, PAD_FROM - 1, PAD_FROM, 20_000, RADIX_SORT_MIN - 1, RADIX_SORT_MIN])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_stable_argsort_equals_the_stable_sort_at_every_length(n, dtype):
    g = torch.Generator().manual_seed(n)
    keys = torch.randint(0, max(1, n // 4), (n,), generator=g, dtype=dtype)  # many ties
    order = stable_argsort(keys)
    assert torch.equal(order, torch.sort(keys, stable=True).indices)
    assert order.dtype == torch.int64 and order.numel() == n


@pytest.mark.parametrize("n", [1, 100, 4_700, 20_000, RADIX_SORT_MIN + 5])
@pytest.mark.parametrize("bound", [1, 3, 1 << 16])
def test_keys_below_a_known_short_bound_sort_stably_too(n, bound):
    g = torch.Generator().manual_seed(n + bound)
    keys = torch.randint(0, bound, (n,), generator=g)
    keys[-1] = bound - 1  # the largest key allowed
    order = stable_argsort(keys, bound=bound)
    assert torch.equal(order, torch.sort(keys, stable=True).indices)
    assert order.dtype == torch.int64


def test_keys_equal_to_the_pad_value_still_sort_before_the_padding():
    top = torch.iinfo(torch.int64).max
    keys = torch.tensor([top, 3, top, 1] * (PAD_FROM // 4 + 1))
    order = stable_argsort(keys)
    assert order.max() < keys.numel()
    assert torch.equal(order, torch.sort(keys, stable=True).indices)
