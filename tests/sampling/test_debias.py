"""Debias weights (eq. 13) and successive sampling: exactness of the O(m) form, unbiasedness."""

from __future__ import annotations

import torch

from lightning_mqgnn.sampling.debias import debias_alphas, debias_weights
from lightning_mqgnn.sampling.successive import gumbel_top_k, successive_sample


def reference_weights(p: torch.Tensor, n: int) -> torch.Tensor:
    """Chen et al.'s ``estWRS_weights`` recursion, O(m²), written out as a loop."""
    w = torch.zeros(p.numel(), dtype=torch.float64)
    mass = 0.0
    for k in range(p.numel()):
        a = n / ((k + 1) * (n - k))
        w[k] = a * max(1.0 - mass, 0.0) / p[k]
        w[:k] = w[:k] * (1.0 - a) + a
        mass += float(p[k])
    return w


def skewed(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64) ** 3
    return p / p.sum()


def batched_ppswor(p: torch.Tensor, m: int, trials: int, seed: int) -> torch.Tensor:
    """``trials`` independent successive samples (draw order) by Gumbel-top-k, as a [T, m] tensor."""
    g = torch.Generator().manual_seed(seed)
    gumbel = -torch.empty(trials, p.numel(), dtype=torch.float64).exponential_(generator=g).log()
    return torch.topk(p.log() + gumbel, m, dim=1).indices


def test_linear_time_weights_equal_reference_recursion():
    for n, m, seed in [(30, 8, 0), (300, 40, 1), (12, 12, 2), (1, 1, 3)]:
        p = skewed(n, seed)
        idx = batched_ppswor(p, m, 1, seed)[0]
        torch.testing.assert_close(
            debias_weights(p[idx], n), reference_weights(p[idx], n), rtol=1e-10, atol=1e-12
        )


def test_alphas_match_simple_random_sampling():
    # α_1 = 1, and with uniform p the weights are exactly n/m (simple random sampling, eq. 13)
    assert float(debias_alphas(5, 40)[0]) == 1.0
    p = torch.full((7,), 1 / 40, dtype=torch.float64)
    torch.testing.assert_close(debias_weights(p, 40), torch.full((7,), 40 / 7, dtype=torch.float64))


def test_debias_is_unbiased_where_plain_importance_weights_are_not():
    # Monte Carlo, 2e5 successive samples of m=8 from n=30 skewed p: the debiased sum matches the
    # true sum within 4 standard errors; the plain 1/(s p) sum misses it by more than 20.
    n, m, trials = 30, 8, 200_000
    p = skewed(n, 0)
    x = torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 2.0
    idx = batched_ppswor(p, m, trials, 2)
    debiased = (debias_weights(p[idx], n) * x[idx]).sum(1)
    plain = (x[idx] / (m * p[idx])).sum(1)
    truth = float(x.sum())
    se_d = float(debiased.std()) / trials**0.5
    se_p = float(plain.std()) / trials**0.5
    assert abs(float(debiased.mean()) - truth) < 4 * se_d
    assert abs(float(plain.mean()) - truth) > 20 * se_p


def test_debias_handles_a_sample_that_exhausts_the_support():
    # every node with p > 0 drawn: 1 - S is clamped at 0, weights stay finite; with n = nnz(p) the
    # last α is 1 and the estimate is exact, with zero-p entries in n it is still unbiased
    p = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0], dtype=torch.float64)
    x = torch.tensor([1.0, 7.0, -2.0, 4.0, 9.0], dtype=torch.float64)  # zero-p entries never count
    for seed in range(3):
        pos = successive_sample(p, 10, torch.Generator().manual_seed(seed))
        assert sorted(pos.tolist()) == [0, 2, 3]
    trials = 20_000
    idx = batched_ppswor(p, 3, trials, 1)
    w = debias_weights(p[idx], p.numel())
    assert torch.isfinite(w).all()
    est = (w * x[idx]).sum(1)
    exact = (debias_weights(p[idx], 3) * x[idx]).sum(1)
    torch.testing.assert_close(exact, torch.full((trials,), 3.0, dtype=torch.float64))
    assert abs(float(est.mean()) - 3.0) < 4 * float(est.std()) / trials**0.5


def second_draw_law(p: torch.Tensor) -> torch.Tensor:
    """P(second draw = j) = Σ_{i≠j} p_i p_j / (1 - p_i) under successive sampling."""
    joint = p[:, None] * p[None, :] / (1.0 - p[:, None])
    joint.fill_diagonal_(0.0)
    return joint.sum(0)


def test_successive_sample_draws_in_successive_order():
    # rejection path (s small against the support): first draws ~ p, second draws ~ their exact law
    p = skewed(40, 5)
    trials = 3000
    gen = torch.Generator().manual_seed(6)
    first = torch.zeros(40, dtype=torch.float64)
    second = torch.zeros(40, dtype=torch.float64)
    for _ in range(trials):
        pos = successive_sample(p, 5, gen)
        assert pos.unique().numel() == 5
        first[pos[0]] += 1
        second[pos[1]] += 1
    for emp, law in [(first / trials, p), (second / trials, second_draw_law(p))]:
        tol = 5 * (law * (1 - law) / trials).sqrt() + 1e-3
        assert ((emp - law).abs() <= tol).all()


def test_gumbel_and_stalled_rejection_follow_the_same_law():
    # one item holds almost all mass: rejection stalls and hands over to Gumbel-top-k mid-sample
    p = torch.full((100,), 1e-4, dtype=torch.float64)
    p[3] = 1.0 - 99e-4
    trials = 1500
    gen = torch.Generator().manual_seed(7)
    second = torch.zeros(100, dtype=torch.float64)
    for _ in range(trials):
        pos = successive_sample(p, 25, gen)
        assert pos.numel() == 25 and pos.unique().numel() == 25 and int(pos[0]) in range(100)
        second[pos[1]] += 1
    law = second_draw_law(p)
    tol = 5 * (law * (1 - law) / trials).sqrt() + 2e-3
    assert ((second / trials - law).abs() <= tol).all()
    top = gumbel_top_k(p, 100, gen)
    assert top.unique().numel() == 100


def test_zero_probability_and_empty_cases():
    assert successive_sample(torch.zeros(4, dtype=torch.float64), 3).numel() == 0
    assert successive_sample(torch.tensor([0.0, 2.0, 0.0]), 3).tolist() == [1]
    assert debias_weights(torch.empty(0, dtype=torch.float64), 10).numel() == 0


def test_guided_cdf_draws_are_exactly_the_inverse_cdf():
    # guide table + window search == searchsorted(cdf, u, right=True), zero-p entries and the
    # u == total rounding case included
    from lightning_mqgnn.sampling.successive import GuidedCDF

    g = torch.Generator().manual_seed(16)
    for n in (1, 7, 300, 20_000):
        p = torch.rand(n, generator=g, dtype=torch.float64) ** 8
        p[torch.rand(n, generator=g) < 0.3] = 0.0
        p[0] += 1e-3
        cdf = torch.cumsum(p, 0)
        last = int((p > 0).nonzero()[-1])
        u = torch.rand(50_000, generator=g, dtype=torch.float64) * cdf[-1]
        u[:2] = torch.tensor([0.0, float(cdf[-1])])
        expect = torch.searchsorted(cdf, u, right=True).clamp_(max=last)
        assert torch.equal(GuidedCDF(cdf, last).positions(u), expect)
