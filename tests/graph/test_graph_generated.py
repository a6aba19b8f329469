"""generate_graph: deterministic, preset-shaped, power-law, homophilous and learnable."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.graph.generated import PRESETS, generate_graph


def _nearest_centroid_accuracy(x, y, train, test, num_classes):
    sums = torch.zeros(num_classes, x.shape[1]).index_add_(0, y[train], x[train])
    centroids = sums / torch.bincount(y[train], minlength=num_classes).clamp(min=1)[:, None].float()
    return (torch.cdist(x[test], centroids).argmin(1) == y[test]).float().mean().item()


def _neighbour_mean(graph, x):
    """Mean over each node and its neighbours (one hop of eq. 17 without learned weights)."""
    rows = graph.row_ids()
    total = x.clone().index_add_(0, rows, x[graph.indices])
    return total / (graph.in_degrees() + 1).float()[:, None]


@pytest.fixture(scope="module")
def arxiv_small():
    return generate_graph("arxiv", scale=0.05, seed=3)


def test_deterministic_per_seed():
    a = generate_graph("arxiv", scale=0.01, seed=1)
    b = generate_graph("arxiv", scale=0.01, seed=1)
    c = generate_graph("arxiv", scale=0.01, seed=2)
    for field in ("features", "labels", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert torch.equal(a.graph.indptr, b.graph.indptr) and torch.equal(a.graph.indices, b.graph.indices)
    assert not torch.equal(a.labels, c.labels)


def test_sizes_split_and_degree(arxiv_small):
    ds = arxiv_small
    p = PRESETS["arxiv"]
    assert ds.num_nodes == round(p.num_nodes * 0.05)
    assert ds.num_features == 128 and ds.num_classes == 40 and ds.metric == "accuracy"
    assert ds.graph.is_symmetric()
    mean_degree = ds.graph.num_edges / ds.num_nodes
    assert abs(mean_degree - 13.7) / 13.7 < 0.03
    n = ds.num_nodes
    assert abs(ds.train_idx.numel() - 0.54 * n) <= 1 and abs(ds.val_idx.numel() - 0.18 * n) <= 1
    assert ds.train_idx.numel() + ds.val_idx.numel() + ds.test_idx.numel() == n


def test_degree_distribution_is_skewed(arxiv_small):
    deg = arxiv_small.graph.in_degrees().float()
    assert deg.max() > 15 * deg.mean()  # hubs
    top = torch.sort(deg, descending=True).values[: deg.numel() // 100]
    assert top.sum() / deg.sum() > 0.08  # the top 1% of nodes hold > 8% of edge endpoints
    assert torch.median(deg) < deg.mean()  # long right tail


def test_edges_are_homophilous(arxiv_small):
    g, y = arxiv_small.graph, arxiv_small.labels
    same = (y[g.row_ids()] == y[g.indices]).float().mean().item()
    assert 0.55 < same < 0.68  # homophily 0.6, +- merged intra-class duplicates / in-class random draws
    strong = generate_graph("arxiv", scale=0.02, seed=0, homophily=0.9)
    g2, y2 = strong.graph, strong.labels
    assert (y2[g2.row_ids()] == y2[g2.indices]).float().mean().item() > max(0.85, same + 0.25)


def test_neighbour_averaging_beats_raw_features(arxiv_small):
    ds = arxiv_small
    args = (ds.labels, ds.train_idx, ds.test_idx, ds.num_classes)
    raw = _nearest_centroid_accuracy(ds.features, *args)
    smoothed = _nearest_centroid_accuracy(_neighbour_mean(ds.graph, ds.features), *args)
    assert 0.3 < raw < 0.65  # features alone are informative but ambiguous
    assert smoothed > raw + 0.2


def test_small_scale_caps_dense_presets():
    ds = generate_graph("reddit", scale=0.005, seed=0)  # 1,165 nodes cannot hold degree 490
    assert ds.num_features == 602 and ds.num_classes == 41 and ds.metric == "micro_f1"
    mean_degree = ds.graph.num_edges / ds.num_nodes
    assert mean_degree <= 0.05 * (ds.num_nodes - 1) * 1.02
    assert mean_degree > 0.05 * (ds.num_nodes - 1) * 0.9


def test_proteins_like_is_multilabel_and_learnable():
    ds = generate_graph("proteins", scale=0.02, seed=0)
    assert ds.multilabel and ds.labels.shape == (ds.num_nodes, 112) and ds.labels.dtype == torch.float32
    assert ds.num_features == 8 and ds.metric == "rocauc"
    rate = ds.labels.mean(0)
    assert 0.1 < float(rate.mean()) < 0.35 and float(rate.min()) > 0.0
    # labels follow the graph: a node's label vector correlates with its neighbours' mean
    rows = ds.graph.row_ids()
    nbr = torch.zeros_like(ds.labels).index_add_(0, rows, ds.labels[ds.graph.indices])
    nbr /= ds.graph.in_degrees().clamp(min=1).float()[:, None]
    centred = ds.labels - rate
    corr = (centred * (nbr - rate)).sum() / (centred.norm() * (nbr - rate).norm())
    assert corr > 0.1


def test_overrides_and_bad_arguments():
    ds = generate_graph("products", num_nodes=500, mean_degree=8.0, num_features=16, num_classes=5, seed=0)
    assert ds.num_nodes == 500 and ds.num_features == 16 and ds.num_classes == 5
    assert abs(ds.graph.num_edges / 500 - 8.0) < 0.5
    with pytest.raises(ValueError, match="unknown preset 'mag'"):
        generate_graph("mag")
    with pytest.raises(ValueError, match="scale must be positive"):
        generate_graph("arxiv", scale=0)
    with pytest.raises(ValueError, match="homophily must be in"):
        generate_graph("arxiv", scale=0.01, homophily=1.5)
