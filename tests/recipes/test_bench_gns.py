"""The GNS benchmark end to end on cora (converted from its committed files): recipe runs to a step
cap, the validation curve read back from each run's metrics log (the clocks the recipe logs at every
validation), the table against node-wise sampling, and a second invocation that keeps the runs its
JSONL already holds."""

import json
import subprocess
import sys

import pytest
from helpers.paths import REPO


@pytest.mark.slow  # four recipe processes: ~45 s; the validation clocks have a fast test of their own
def test_gns_benchmark_reads_curves_and_sets_gns_against_node_wise(tmp_path, served_data):
    jsonl = tmp_path / "runs.jsonl"
    cmd = [sys.executable, str(REPO / "recipes" / "bench.py"), "gns", "--datasets", "cora"]
    cmd += ["--models", "sage", "--variants", "nodewise,gns", "--seeds", "0", "--jsonl", str(jsonl)]
    cmd += ["--extra", "trainer.max_steps=40 val_every_batches=10 early_stopping.patience_batches=1000"]
    cmd += ["--out", str(tmp_path / "gns.md")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = {r["variant"]: r for r in map(json.loads, jsonl.read_text().splitlines())}
    assert set(runs) == {"nodewise", "gns"}
    for run in runs.values():
        train_s, wall_s, val = zip(*run["curve"])
        assert len(val) == 4  # a validation every 10 of the 40 batches, each with its clocks
        assert all(a < b for a, b in zip(train_s, train_s[1:]))  # training time only grows
        assert all(t < w for t, w in zip(train_s, wall_s))  # wall time counts validation too
        assert all(0 <= v <= 1 for v in val)
    # LABOR-* layers and a shared-variate fill move fewer rows than node-wise sampling
    assert 0 < runs["gns"]["rows"] < runs["nodewise"]["rows"]
    table = (tmp_path / "gns.md").read_text()
    assert "| cora | sage | nodewise |" in table and "| cora | sage | gns |" in table
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(jsonl.read_text().splitlines()) == 2  # nothing ran twice


def test_node_wise_sampling_trains_the_gns_models_network(monkeypatch):
    """``model=sage`` ships another width, start and rate than ``model=sage_gns``; the benchmark
    gives every variant the GNS model's width and start, so its table compares samplers only."""
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks._recipe import network_overrides, recipe_config

    network = network_overrides("sage_gns", ("hidden", "glorot_init"))
    assert network == ["model.module.hidden=256", "model.module.glorot_init=false"]
    for model in ("sage", "sage_gns"):
        module = recipe_config([f"model={model}", *network]).model.module
        assert (module.hidden, module.glorot_init) == (256, False)
    assert network_overrides("gcn_gns", ("hidden", "glorot_init")) == network  # sage_gns with GCN's operator
    assert network_overrides("sage") == [
        "model.module.lr=0.01",
        "model.module.hidden=128",
        "model.module.glorot_init=true",
    ]
    assert network_overrides("gcn", ("glorot_init",)) == ["model.module.glorot_init=null"]
