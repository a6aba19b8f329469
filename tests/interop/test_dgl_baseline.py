"""The DGL baseline recipe: its timing trim, its error without DGL, its dataset reader, and (in the
DGL environment) a run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.graphs import valid_npz_arrays
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


def test_without_dgl_bench_prints_one_line_naming_dgl_before_the_dataset_loads(tmp_path):
    # dgl hidden, so the check runs the same in the main and the DGL environment; the dataset is
    # a file that is not there, whose error would end the run if it were read first
    missing = tmp_path / "missing.npz"
    code = (
        "import runpy, sys\n"
        "sys.modules['dgl'] = None\n"
        f"sys.argv = ['bench.py', 'dgl_baseline', '--data', {str(missing)!r}, '--epochs', '1']\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO / "recipes", capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: this needs DGL, which failed to import (") and ".ci/dgl_env.sh" in last
    assert "missing.npz" not in proc.stderr and proc.stdout == ""


def test_load_dataset_resolves_registered_names(recipe, served_data, monkeypatch, tmp_path):
    ds = recipe.load_dataset("cora")
    assert (ds.name, ds.num_nodes, ds.num_classes, ds.metric) == ("cora", 2708, 7, "accuracy")
    mirror = tmp_path / "mirror"  # a citeseer.npz 1,100 columns wide where the registry reads first
    mirror.mkdir()
    np.savez(mirror / "citeseer.npz", **valid_npz_arrays(num_nodes=10, num_cols=1100))
    monkeypatch.setenv("MQGNN_DATA_MIRROR", str(mirror))
    wide = recipe.load_dataset("citeseer")  # through conf/data/citeseer.yaml, as the recipe loads it
    assert (wide.name, wide.num_nodes, wide.num_features) == ("citeseer", 10, 1024)
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
