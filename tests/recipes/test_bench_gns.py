"""The GNS benchmark end to end on cora: recipe runs to a step cap, the validation curve read back
from each run's metrics log (the clocks the recipe logs at every validation), the table against
node-wise sampling, and a second invocation that keeps the runs its JSONL already holds."""

import json
import subprocess
import sys

import pytest
from helpers.paths import REPO


@pytest.mark.slow  # four recipe processes: ~45 s; the validation clocks have a fast test of their own
def test_gns_benchmark_reads_curves_and_sets_gns_against_node_wise(tmp_path):
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
