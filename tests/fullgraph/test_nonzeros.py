"""The stage transfers' lossless compression: a bitmap of the non-zero entries and their values."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.fullgraph.nonzeros import bitmap_bytes, nonzero_mask, pack_nonzeros, unpack_nonzeros


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (240, 16), (0, 16)])
@pytest.mark.parametrize("density", [0.0, 0.25, 1.0])
def test_rows_come_back_exactly(shape, density):
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < density)
    packed = pack_nonzeros(rows)
    numel = rows.numel()
    assert packed.bitmap.dtype == torch.uint8 and packed.bitmap.numel() == bitmap_bytes(numel)
    assert packed.values.numel() == int((rows != 0).sum())
    mask = nonzero_mask(packed.bitmap, numel)
    assert torch.equal(unpack_nonzeros(mask, packed.values, shape), rows)


def test_relu_dropout_rows_shrink_to_about_a_quarter():
    g = torch.Generator().manual_seed(0)
    h = torch.nn.functional.dropout(torch.relu(torch.randn(2000, 64, generator=g)), 0.5)
    packed = pack_nonzeros(h)
    dense = h.numel() * 4
    sent = packed.bitmap.numel() + packed.values.numel() * 4
    assert 0.25 < sent / dense < 0.32  # 1 bit + a quarter of 32 bits per entry


def test_special_values_travel_as_values():
    rows = torch.tensor([[0.0, -0.0, float("nan"), float("inf")], [-1.5, 0.0, 1e-38, 0.0]])
    packed = pack_nonzeros(rows)
    back = unpack_nonzeros(nonzero_mask(packed.bitmap, rows.numel()), packed.values, rows.shape)
    torch.testing.assert_close(back, rows, equal_nan=True)
    assert packed.values.numel() == 4


def test_a_bitmap_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="a bitmap of 20 entries has 3 bytes, got 2"):
        nonzero_mask(torch.zeros(2, dtype=torch.uint8), 20)
