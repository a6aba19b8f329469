"""The pipeline under Lightning's DDP launchers on CPU (gloo), 2 ranks: each rank trains on its
own disjoint share of the seeds, with the same number of batches, and leaves no workers behind."""

import os
import subprocess
import sys

import pytest
import torch
from helpers.paths import HELPERS, REPO
from helpers.pipeline import assert_gone, small_dataset

SCRIPT = HELPERS / "pipeline_ranks.py"


@pytest.mark.distributed
@pytest.mark.slow  # two ranks start Lightning in fresh interpreters: 1-2 min on 2 shared cores
@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp"])
def test_two_cpu_ranks_train_on_disjoint_equal_shares(tmp_path, strategy):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), strategy],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    train = small_dataset(1200).train_idx
    for epoch in (0, 1):
        a, b = (torch.cat(r["seen"][epoch]) for r in ranks)
        assert len(ranks[0]["seen"][epoch]) == len(ranks[1]["seen"][epoch])  # uneven counts hang DDP
        assert a.numel() == b.numel() == -(-train.numel() // 2)
        assert torch.isin(a, train).all() and torch.isin(b, train).all()
        overlap = torch.isin(a, b).sum().item()
        assert overlap <= 1  # disjoint except the single wrap-around pad of an odd split
        assert torch.unique(torch.cat([a, b])).numel() == train.numel()
    assert ranks[0]["rank_pid"] != ranks[1]["rank_pid"]
    assert ranks[0]["pids"] and ranks[1]["pids"]  # each rank's epochs came from its workers
    assert_gone(ranks[0]["pids"] + ranks[1]["pids"])
