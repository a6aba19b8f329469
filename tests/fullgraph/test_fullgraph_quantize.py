"""Stochastic row quantisation: unbiased, bounded error, exact pack/unpack, constant rows; and the
adaptive bit-width rule with its fresh fallback."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.fullgraph import AdaptiveRule, BitWidthController
from lightning_mqgnn.quantize import (
    QuantizedRows,
    dequantize,
    expected_noise_sq,
    message_bytes,
    pack,
    quantize,
    unpack,
)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("cols", [1, 7, 16])
def test_pack_unpack_round_trip(bits, cols):
    codes = torch.randint(0, 1 << bits, (5, cols), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.shape == (5, -(-cols * bits // 8))
    assert torch.equal(unpack(packed, bits, cols), codes)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stochastic_rounding_is_unbiased(bits):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=gen) * 3
    draws = 4000
    # each copy of a row is rounded independently with that row's min and step
    mean = dequantize(quantize(x.repeat(draws, 1), bits, gen)).reshape(draws, *x.shape).mean(0)
    step = (x.amax(1) - x.amin(1)) / ((1 << bits) - 1)
    # the mean of n draws of an error bounded by one step has std <= step / (2 sqrt(n))
    tol = 5 * step[:, None] / (2 * draws**0.5)
    assert bool(((mean - x).abs() <= tol + 1e-6).all())
    # a single draw errs by less than one step
    one = dequantize(quantize(x, bits, gen))
    assert bool(((one - x).abs() <= step[:, None] * (1 + 1e-5)).all())


def test_wire_bytes_round_trip_and_size():
    x = torch.randn(9, 13)
    q = quantize(x, 4)
    wire = q.to_bytes()
    assert wire.numel() == message_bytes(9, 13, 4) == 9 * (7 + 8)
    back = QuantizedRows.from_bytes(wire, 9, 13, 4)
    assert torch.equal(dequantize(back), dequantize(q))


def test_constant_and_empty_rows():
    x = torch.full((3, 5), 2.5)
    assert torch.equal(dequantize(quantize(x, 2)), x)
    assert dequantize(quantize(torch.empty(0, 5), 2)).shape == (0, 5)


def test_target_is_the_fewest_bits_whose_predicted_noise_fits_the_drift():
    rule = AdaptiveRule(noise_to_drift=1.0)
    # noise 0.05 measured at 4 bits predicts 0.25 at 2 bits and 0.0029 at 8 bits
    assert rule.target_bits(4, noise=0.05, drift=0.5) == 2
    assert rule.target_bits(4, noise=0.05, drift=0.05) == 4
    assert rule.target_bits(4, noise=0.05, drift=0.01) == 8
    assert rule.target_bits(4, noise=0.05, drift=0.0) == 8  # nothing fits: the finest width


def test_rule_goes_up_and_down_and_falls_back_to_fresh():
    c = BitWidthController(AdaptiveRule(initial_bits=4, noise_to_drift=1.0, divergence_tol=0.1))
    assert c.policy().fresh and c.policy().bits is None  # first epoch: nothing stale to use
    c.update(drift=0.5, noise=None, loss=1.0, best_loss=float("inf"), first_loss=1.0)
    assert not c.policy().fresh and c.policy().bits == 4  # nothing measured yet: width kept
    c.update(drift=0.5, noise=0.05, loss=0.9, best_loss=1.0, first_loss=1.0)
    assert c.policy().bits == 2  # fast-changing messages: coarser codes suffice
    c.update(drift=0.01, noise=0.25, loss=0.8, best_loss=0.9, first_loss=1.0)
    assert c.policy().bits == 4  # settled messages: one step towards 8 per epoch
    c.update(drift=0.01, noise=0.05, loss=0.7, best_loss=0.8, first_loss=1.0)
    assert c.policy().bits == 8
    c.update(drift=0.01, noise=0.003, loss=0.7, best_loss=0.7, first_loss=1.0)
    assert c.policy().bits == 8 and not c.policy().fresh
    c.update(drift=0.01, noise=0.003, loss=0.9, best_loss=0.7, first_loss=1.0)  # loss diverges: fresh exact
    assert c.policy().fresh and c.policy().bits is None
    c.update(drift=0.5, noise=None, loss=0.6, best_loss=0.7, first_loss=1.0)
    assert not c.policy().fresh and c.policy().bits == 8
    c.update(drift=float("nan"), noise=0.003, loss=float("nan"), best_loss=0.6, first_loss=1.0)  # NaN: fresh
    assert c.policy().fresh
    c.update(drift=0.5, noise=None, loss=0.6, best_loss=0.6, first_loss=1.0)
    # near zero, a 30% rise is small against the first epoch's loss: no fallback
    c.update(drift=0.5, noise=0.003, loss=0.013, best_loss=0.01, first_loss=1.0)
    assert not c.policy().fresh


def test_rule_without_quantisation_sends_float32():
    c = BitWidthController(AdaptiveRule(), quantize=False)
    c.update(drift=0.1, noise=None, loss=1.0, best_loss=float("inf"), first_loss=1.0)
    assert c.policy().bits is None and not c.policy().fresh
    c.update(drift=0.1, noise=None, loss=5.0, best_loss=1.0, first_loss=1.0)  # no fallback in PipeGCN
    assert c.policy().bits is None and not c.policy().fresh


def test_rule_thresholds_are_checked():
    with pytest.raises(ValueError, match="noise_to_drift"):
        AdaptiveRule(noise_to_drift=0.0)
    with pytest.raises(ValueError, match="initial_bits"):
        AdaptiveRule(initial_bits=3)


@pytest.mark.parametrize("bits", [2, 4])
def test_expected_noise_matches_the_measured_error(bits):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 64, generator=gen)
    q = quantize(x, bits, gen)
    measured = float((dequantize(q) - x).pow(2).sum())
    assert expected_noise_sq(q) == pytest.approx(measured, rel=0.1)
