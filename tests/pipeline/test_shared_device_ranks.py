"""Two ranks on one device over gloo, through Lightning: two torchrun "nodes" of one process each
on device 0, each rank with its own device-resident loader, device queue and gradient queue. On a
GPU (the ``gpu`` twin) this is the multi-rank CUDA path with a single card; on the CPU the same
code. Each rank trains on its own disjoint, equal share, its batches on the device, and the
ranks end with the same weights."""

from __future__ import annotations

import pytest
import torch
from helpers.devices import require_cuda
from helpers.paths import HELPERS, REPO
from helpers.pipeline import small_dataset
from helpers.processes import run_concurrently, two_node_torchrun

SCRIPT = HELPERS / "shared_device_ranks.py"
EPOCHS = 2


def check_two_ranks(tmp_path, device: str, staleness: int) -> None:
    run_concurrently(two_node_torchrun(SCRIPT, str(tmp_path), device, str(staleness)), REPO, timeout=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    train = small_dataset(1200).train_idx
    for r in ranks:
        assert r["world_size"] == 2 and r["device_loader"], r["loader"]
        assert [d.split(":")[0] for d in r["devices"]] == [device], r["devices"]
        assert r["queue_sizes"] and min(r["queue_sizes"]) >= 1
        stats = r["stats"]
        assert stats["skipped_steps"] == staleness  # the gradient queue's fill
        assert stats["applied_steps"] == stats["steps"] - staleness > 0
        assert (stats["syncs"] > 0) == (staleness > 0)
    for epoch in range(EPOCHS):
        a, b = (torch.cat(r["seen"][epoch]) for r in ranks)
        assert len(ranks[0]["seen"][epoch]) == len(ranks[1]["seen"][epoch])
        assert a.numel() == b.numel() == -(-train.numel() // 2)
        assert torch.isin(a, b).sum().item() <= 1  # disjoint but for the pad of an odd split
        assert torch.unique(torch.cat([a, b])).numel() == train.numel()
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])


@pytest.mark.distributed
@pytest.mark.parametrize("staleness", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_two_ranks_share_the_cpu_device(tmp_path, staleness):
    check_two_ranks(tmp_path, "cpu", staleness)


@pytest.mark.gpu
@pytest.mark.distributed
@pytest.mark.parametrize("staleness", [0, 1])
def test_two_ranks_share_one_cuda_device(tmp_path, staleness):
    require_cuda()
    check_two_ranks(tmp_path, "cuda", staleness)
