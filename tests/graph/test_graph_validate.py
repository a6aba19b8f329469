"""validate_dataset: every malformed field is a ValueError naming dataset, field and value."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers.graphs import ring_dataset

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.validate import describe_graph, validate_dataset


def test_valid_dataset_passes_unchanged():
    ds = ring_dataset()
    assert validate_dataset(ds) is ds


def test_index_out_of_range_names_value_and_bound():
    ds = ring_dataset()
    bad = ds.graph.indices.clone()
    bad[3] = 12
    ds = replace(ds, graph=CSRGraph(ds.graph.indptr, bad, 12))
    with pytest.raises(ValueError, match=r"ring: field 'indices' has node id 12 outside \[0, 12\)"):
        validate_dataset(ds)


def test_indptr_problems():
    ds = ring_dataset()
    g = ds.graph
    short = replace(ds, graph=CSRGraph(g.indptr[:-1], g.indices, 12))
    with pytest.raises(ValueError, match=r"field 'indptr' has length 12, expected 13"):
        validate_dataset(short)
    dec = g.indptr.clone()
    dec[4] = dec[6]
    with pytest.raises(ValueError, match=r"field 'indptr' decreases at row 4"):
        validate_dataset(replace(ds, graph=CSRGraph(dec, g.indices, 12)))
    with pytest.raises(ValueError, match=r"field 'indptr' ends at 24, but 'indices' holds 23"):
        validate_dataset(replace(ds, graph=CSRGraph(g.indptr, g.indices[:-1], 12)))
    with pytest.raises(ValueError, match=r"field 'indptr' starts at 1"):
        validate_dataset(replace(ds, graph=CSRGraph(g.indptr + 1, g.indices, 12)))


def test_self_loop_and_duplicate_edges_rejected():
    ds = ring_dataset()
    g = ds.graph
    loop = g.indices.clone()
    loop[0] = 0  # row 0 lists itself
    with pytest.raises(ValueError, match=r"self loop at node 0"):
        validate_dataset(replace(ds, graph=CSRGraph(g.indptr, loop, 12)))
    dup = g.indices.clone()
    dup[int(g.indptr[5]) + 1] = dup[int(g.indptr[5])]  # row 5 lists neighbour 4 twice
    with pytest.raises(ValueError, match=r"row 5 has a duplicate edge 4 -> 5"):
        validate_dataset(replace(ds, graph=CSRGraph(g.indptr, dup, 12)))


def test_non_finite_feature_names_node_and_column():
    ds = ring_dataset()
    x = ds.features.clone()
    x[7, 2] = float("nan")
    with pytest.raises(ValueError, match=r"field 'features' has non-finite value nan at node 7, column 2"):
        validate_dataset(replace(ds, features=x))
    x[7, 2] = float("inf")
    with pytest.raises(ValueError, match=r"non-finite value inf at node 7, column 2"):
        validate_dataset(replace(ds, features=x))
    with pytest.raises(
        ValueError, match=r"field 'features' must be float32, float16 or bfloat16, got torch.float64"
    ):
        validate_dataset(replace(ds, features=ds.features.double()))
    with pytest.raises(ValueError, match=r"field 'features' has shape \(11, 4\)"):
        validate_dataset(replace(ds, features=ds.features[:11]))


def test_label_out_of_range_names_class_and_node():
    ds = ring_dataset()
    y = ds.labels.clone()
    y[4] = 3
    with pytest.raises(ValueError, match=r"field 'labels' has class 3 at node 4, outside \[0, 3\)"):
        validate_dataset(replace(ds, labels=y))
    y[4] = -1
    with pytest.raises(ValueError, match=r"class -1 at node 4"):
        validate_dataset(replace(ds, labels=y))


def test_multilabel_values_and_shape():
    ds = ring_dataset()
    y = torch.zeros(12, 5)
    y[::2, 1] = 1.0
    ok = replace(ds, labels=y, num_classes=5, metric="rocauc")
    assert validate_dataset(ok).multilabel
    y2 = y.clone()
    y2[3, 4] = 0.5
    with pytest.raises(ValueError, match=r"field 'labels' has value 0.5 at node 3, task 4"):
        validate_dataset(replace(ok, labels=y2))
    y2[3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"value nan at node 3, task 4"):
        validate_dataset(replace(ok, labels=y2))
    with pytest.raises(ValueError, match=r"field 'labels' has shape \(12, 5\), expected \[12, 6\]"):
        validate_dataset(replace(ok, num_classes=6))


def test_split_problems_name_the_id():
    ds = ring_dataset()
    with pytest.raises(ValueError, match=r"fields 'train_idx' and 'test_idx' overlap: node id 2 is in both"):
        validate_dataset(replace(ds, test_idx=torch.tensor([2, 11])))
    with pytest.raises(ValueError, match=r"field 'val_idx' is empty"):
        validate_dataset(replace(ds, val_idx=torch.tensor([], dtype=torch.int64)))
    with pytest.raises(ValueError, match=r"field 'test_idx' has node id 40 outside \[0, 12\)"):
        validate_dataset(replace(ds, test_idx=torch.tensor([10, 40])))
    with pytest.raises(ValueError, match=r"field 'train_idx' lists node id 1 twice"):
        validate_dataset(replace(ds, train_idx=torch.tensor([0, 1, 1])))


def test_metric_and_source_in_message():
    ds = ring_dataset()
    with pytest.raises(ValueError, match=r"ring \(/data/ring.npz\): field 'metric' is 'f1'"):
        validate_dataset(replace(ds, metric="f1"), source="/data/ring.npz")


def test_directed_graph_allowed_and_reported():
    src = torch.tensor([0, 1, 2])
    g = CSRGraph.from_edges(src, (src + 1) % 3, 3)  # directed 3-cycle
    ds = replace(
        ring_dataset(3, num_classes=2),
        graph=g,
        train_idx=torch.tensor([0]),
        val_idx=torch.tensor([1]),
        test_idx=torch.tensor([2]),
    )
    assert validate_dataset(ds) is ds
    report = describe_graph(g)
    assert not report.symmetric and report.num_edges == 3 and report.max_degree == 1
    with pytest.raises(ValueError, match=r"field 'graph' is directed"):
        validate_dataset(ds, require_symmetric=True)
    assert describe_graph(ring_dataset().graph).symmetric
