"""The device-sampling benchmark runs end to end at a tiny scale (on the CPU without a GPU):
every configuration and loader gets a row with measured times, and the accuracy comparison a
row per loader, in the markdown and the JSON it writes."""

import json
import subprocess
import sys

import pytest
import torch
from helpers.paths import REPO


@pytest.mark.slow  # the benchmark end to end, half a minute
def test_device_sampling_benchmark_smoke_runs(tmp_path):
    cmd = [sys.executable, str(REPO / "recipes" / "bench.py"), "device_sampling", "--smoke", "--seeds", "0"]
    cmd += ["--accuracy-datasets", "products_like", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "device_sampling.json").read_text())
    rows = {(r["config"], r["loader"]): r for r in result["speed"]}
    loaders = ("sequential", "pipeline", "device", "device_process")
    assert set(rows) == {(c, x) for c in ("salient", "paper") for x in loaders}
    for (_, loader), r in rows.items():
        assert r["epoch_s"] > 0 and r["batch_ms"] > 0
        # the device loaders report their sampling time, from the thread or the processes
        assert (r["sample_ms"] is not None) == loader.startswith("device")
    accuracy = {r["loader"]: r for r in result["accuracy"]}
    assert set(accuracy) == {"sequential", "device"}
    if not torch.cuda.is_available():  # on the CPU the device loader draws the sequential batches
        assert accuracy["device"]["test_metrics"] == accuracy["sequential"]["test_metrics"]
    assert "| salient | device |" in (tmp_path / "device_sampling.md").read_text()
    # the host-sync census: every sampler counted
    syncs = result["host_syncs"]
    assert {r["sampler"] for r in syncs} == {
        "sage 15,10,5",
        "gcn 5,5",
        "fastgcn_fd 1024,512",
        "ladies_fd 1024,512",
        "sage_gns 5,5",
    }
    assert not any("failed" in r["site"] for r in syncs)
    # on the CPU the node-wise draws and the relabelling are compiled passes: no host sync left
    # in them (the vectorised forms count a nonzero or unique per layer in each)
    sage = [r for r in syncs if r["sampler"] == "sage 15,10,5"]
    assert not any(name in r["site"] for r in sage for name in ("sample_neighbor_edges", "__call__")), sage
