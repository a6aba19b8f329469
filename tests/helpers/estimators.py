"""Monte Carlo checks that a sampler's blocks estimate the exact operator without bias."""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.exact import exact_operator, full_block


def assert_input_layer_unbiased(
    graph: CSRGraph,
    aggregation: str,
    draw: Callable[[int, torch.Tensor], MiniBatch],
    seeds: torch.Tensor,
    trials: int = 1500,
) -> None:
    """The mean over ``trials`` draws of the input block's aggregation of random features is
    within 4.5 standard errors of the exact operator (``P H`` for gcn, the neighbour mean for
    mean). ``draw(t, seeds)`` returns draw ``t``'s batch on the host, after whatever redraw (a
    GNS cache's, say) that draw needs."""
    h = torch.randn(graph.num_nodes, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    exact_block, _ = full_block(graph, seeds, exact_operator(graph, aggregation))
    truth = exact_block.aggregate(h.float()).double()
    est = torch.zeros(trials, len(seeds), 2, dtype=torch.float64)
    torch.manual_seed(7)
    for t in range(trials):
        b = draw(t, seeds)
        est[t] = b.blocks[0].aggregate(h[b.input_nodes].float()).double()
    se = est.std(0) / trials**0.5
    assert ((est.mean(0) - truth).abs() <= 4.5 * se + 1e-5).all()
