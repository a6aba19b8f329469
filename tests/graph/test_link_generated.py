"""generate_link_graph: valid, deterministic, and its links predictable from the features."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.graph.link_generated import generate_link_graph
from lightning_mqgnn.graph.link_split import random_link_split
from lightning_mqgnn.graph.validate import describe_graph, validate_dataset
from lightning_mqgnn.models.link_metrics import hits_at_k


@pytest.fixture(scope="module")
def default():
    return generate_link_graph()


def test_valid_undirected_power_law_and_homophilous(default):
    ds = validate_dataset(default)
    report = describe_graph(ds.graph)
    assert ds.num_nodes == 8000 and report.symmetric
    assert 10 < report.mean_degree < 13  # 12 asked, less the merged duplicates
    assert report.max_degree > 10 * report.mean_degree  # a power-law tail, not Poisson
    rows = ds.graph.row_ids()
    same = (ds.labels[rows] == ds.labels[ds.graph.indices]).double().mean()
    assert same > 0.75  # 0.85 drawn in-community, less the merged in-community duplicates; chance 1/128


def test_deterministic_per_seed():
    a, b, c = (generate_link_graph(600, seed=s) for s in (1, 1, 2))
    assert torch.equal(a.graph.indptr, b.graph.indptr) and torch.equal(a.graph.indices, b.graph.indices)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.features, c.features)


def cosine(x: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    x = torch.nn.functional.normalize(x, dim=1)
    return (x[pairs[0]] * x[pairs[1]]).sum(1)


def test_features_predict_links_on_the_default_split(default):
    _, split = random_link_split(default.graph, seed=0)
    num_neg = split.test_neg.shape[1]
    found = hits_at_k(cosine(default.features, split.test_pos), cosine(default.features, split.test_neg), 50)
    random = 50 / num_neg  # the chance a positive outscores the 50th of num_neg random scores
    assert found > 10 * random


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match=r"needs >= 16 nodes.*num_nodes=4,") as err:
        generate_link_graph(4)
    assert "\n" not in str(err.value)
