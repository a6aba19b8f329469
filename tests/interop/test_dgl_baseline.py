"""The DGL baseline recipe: its timing trim, its dataset reader, and (in the DGL environment) a run."""

from __future__ import annotations

import pytest
import torch
from helpers.paths import REPO

from lightning_mqgnn.graph.generated import generate_graph


@pytest.fixture
def recipe(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import dgl_baseline

    return dgl_baseline


def test_trimmed_mean_drops_first_and_last_twenty_batches(recipe):
    times = [100.0] * 20 + [1.0, 2.0, 3.0] + [100.0] * 20
    assert recipe.trimmed_mean(times) == 2.0
    assert recipe.trimmed_mean([1.0, 3.0]) == 2.0  # too few batches to trim: all of them


def test_load_dataset_resolves_shared_names(recipe, shared_data):
    ds = recipe.load_dataset("cora")
    assert (ds.name, ds.num_nodes, ds.num_classes, ds.metric) == ("cora", 2708, 7, "accuracy")
    wide = recipe.load_dataset("citeseer")  # through conf/data/citeseer.yaml, as the recipe loads it
    assert wide.num_features == 1024
    with pytest.raises(ValueError, match=r"unknown dataset 'nope' \(known: amazon_computers, "):
        recipe.load_dataset("nope")


@pytest.mark.dgl
@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_dgl_baseline_trains_and_reports_per_batch_times(recipe, model):
    pytest.importorskip("dgl")
    ds = generate_graph("arxiv", num_nodes=1200, num_features=32, num_classes=4, seed=0)
    out = recipe.run_dgl_baseline(
        ds, model=model, fanouts=(5, 5), batch_size=128, epochs=4, hidden=32, lr=1e-2
    )
    per_epoch = -(-ds.train_idx.numel() // 128)
    assert out["batches_per_epoch"] == per_epoch
    assert len(out["batch_times"]) == 4 * per_epoch and len(out["epoch_times"]) == 4
    assert all(t > 0 for t in out["batch_times"])
    assert out["train_time"] == pytest.approx(sum(out["epoch_times"]))
    assert out["best_epoch"] == max(range(4), key=lambda e: out["val_scores"][e])
    assert out["test_metric"] == out["test_scores"][out["best_epoch"]]
    assert sum(out["losses"][-per_epoch:]) < sum(out["losses"][:per_epoch])
    majority = torch.bincount(ds.labels[ds.test_idx]).max().item() / ds.test_idx.numel()
    assert out["test_metric"] > majority + 0.1, (out["test_metric"], majority)
