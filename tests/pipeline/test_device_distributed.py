"""The device-resident loader (device=cpu) under Lightning's DDP on 2 gloo ranks, sampling in a
thread or in sampler processes: each rank samples its own share on its own device, batch for
batch what SequentialLoader makes for that rank, and no sampler thread or process outlives the
fit."""

import os
import subprocess
import sys

import pytest
import torch
from helpers.paths import HELPERS, REPO
from helpers.pipeline import small_dataset

SCRIPT = HELPERS / "device_ranks.py"


@pytest.mark.distributed
@pytest.mark.parametrize("device_sampler", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_two_cpu_ranks_sample_their_own_shares_on_their_devices(tmp_path, device_sampler):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), device_sampler],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    train = small_dataset(1200).train_idx
    for r in ranks:
        assert r["same"] and all(r["same"])  # the device loader's batches, equal to the reference
        assert r["threads"] == [] and r["processes"] == []  # nothing outlives the fit
    for epoch in (0, 1):
        a, b = (torch.cat(r["seen"][epoch]) for r in ranks)
        assert len(ranks[0]["seen"][epoch]) == len(ranks[1]["seen"][epoch])
        assert a.numel() == b.numel() == -(-train.numel() // 2)
        assert torch.isin(a, b).sum().item() <= 1  # disjoint but for the pad of an odd split
        assert torch.unique(torch.cat([a, b])).numel() == train.numel()
