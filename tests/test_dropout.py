"""The fast CPU dropout keeps nn.Dropout's contract: drop rate, unbiased scaling, gradients,
reproducibility, identity in eval mode."""

import pytest
import torch

from lightning_mqgnn.models.dropout import Dropout, quantised_drop_probability, random_keep_mask


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_mask_drops_at_rate_p_and_preserves_the_mean(p):
    torch.manual_seed(0)
    mask = random_keep_mask(torch.Size([1000, 500]), p)
    q = quantised_drop_probability(p)
    assert abs(q - p) <= 2**-17
    dropped = (mask == 0).double().mean().item()
    # 500k Bernoulli(q) draws: standard error sqrt(q(1-q)/n) < 7.1e-4; 5 standard errors
    assert abs(dropped - q) < 5 * (q * (1 - q) / mask.numel()) ** 0.5
    assert torch.all((mask == 0) | torch.isclose(mask, torch.tensor(1 / (1 - q))))
    assert abs(mask.double().mean().item() - 1.0) < 5 * (q / (1 - q) / mask.numel()) ** 0.5


def test_columns_and_rows_are_not_correlated():
    """The four 16-bit lanes of one 64-bit draw land on neighbouring elements: they must be
    independent, so the drop rate of every lane position (element index mod 4) is p."""
    torch.manual_seed(1)
    mask = random_keep_mask(torch.Size([250_000, 4]), 0.5)
    lanes = (mask == 0).double().mean(0)
    assert torch.all((lanes - 0.5).abs() < 5 * (0.25 / 250_000) ** 0.5)
    both = ((mask[:, 0] == 0) & (mask[:, 1] == 0)).double().mean().item()
    assert abs(both - 0.25) < 5 * (0.1875 / 250_000) ** 0.5


def test_gradient_is_the_mask_and_seeds_reproduce_it():
    layer = Dropout(0.3)
    h = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(5)
    out = layer(h)
    out.sum().backward()
    torch.manual_seed(5)
    again = layer(h.detach())
    assert torch.equal(out.detach(), again)
    kept = out.detach() != 0
    assert torch.allclose(
        h.grad[kept], torch.full_like(h.grad[kept], 1 / (1 - quantised_drop_probability(0.3)))
    )
    assert torch.all(h.grad[~kept] == 0)


def test_eval_mode_and_zero_rate_are_identity_and_bad_rates_are_refused():
    h = torch.randn(8, 8)
    assert Dropout(0.0)(h) is h
    assert Dropout(0.5).eval()(h) is h
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)
