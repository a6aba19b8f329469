"""Debiasing weights for successive sampling (Chen et al.; paper eq. 13).

Plain importance weights ``1/(s p_j)`` (eq. 8, 11) are unbiased only for draws *with*
replacement. For ``m`` successive draws ``i_1..i_m`` (draw order) each partial estimate

    Π_k = Σ_{l<k} x_{i_l} + (1 - S_{k-1}) x_{i_k} / p_{i_k},   S_{k-1} = Σ_{l<k} p_{i_l}

is unbiased for ``Σ_j x_j``, and so is the recursive average ``Y_k = (1-α_k) Y_{k-1} + α_k Π_k``
with fixed ``α_k = n / (k (n-k+1))`` (1-indexed, α_1 = 1; eq. 13). ``Y_m = Σ_k w_k x_{i_k}``;
this module returns those ``w`` in O(m) instead of the reference's O(m²) loop.
"""

from __future__ import annotations

import torch
from torch import Tensor


def debias_alphas(m: int, n: int, device: torch.device | str = "cpu") -> Tensor:
    """α_1..α_m of eq. 13 (float64); ``n`` = length of the probability vector (graph nodes)."""
    k = torch.arange(m, dtype=torch.float64, device=device)  # 0-indexed: α = n / ((k+1)(n-k))
    return n / ((k + 1.0) * (n - k))


def debias_weights(p_drawn: Tensor, n: int) -> Tensor:
    """Weights ``w`` with ``Σ_k w_k x_{i_k}`` unbiased for ``Σ_j x_j`` (eq. 13), in float64.

    ``p_drawn``: the *normalised* probabilities of the drawn items in draw order (last dim; any
    leading dims are independent samples); ``n``: the length of the full probability vector, zero
    entries included (Chen et al.'s ``len(p)``, the number of graph nodes). The weights include
    the ``1/s`` of eq. 11.
    """
    m = p_drawn.shape[-1]
    if m == 0:
        return torch.zeros(p_drawn.shape, dtype=torch.float64, device=p_drawn.device)
    if n < m:
        raise ValueError(f"debias_weights: n={n} must be at least the number of draws m={m}")
    p = p_drawn.to(torch.float64)
    alpha = debias_alphas(m, n, p.device)
    # 1 - S_{k-1}; rounds slightly negative when the draws exhaust the support
    remaining = (1.0 - (torch.cumsum(p, -1) - p)).clamp_(min=0.0)
    # c_k = α_k Π_{l>k} (1 - α_l): the weight of Π_k in Y_m
    keep = torch.flip(torch.cumprod(torch.flip(1.0 - alpha, [0]), 0), [0])  # Π_{l>=k}
    c = alpha * torch.cat([keep[1:], keep.new_ones(1)])
    # item k enters Π_k through its importance term and every later Π_j as an exact term
    later = torch.flip(torch.cumsum(torch.flip(c, [0]), 0), [0]) - c  # Σ_{j>k} c_j
    return c * remaining / p + later
