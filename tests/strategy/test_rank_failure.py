"""RankFailure: a collective's report that another rank is gone becomes one line naming this rank,
the failed one where known, and the phase; every other error passes unchanged."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from lightning_mqgnn.strategy import RankFailure
from lightning_mqgnn.strategy.rank_failure import collective_phase, peer_failed

GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:60044. This is typically caused by a remote worker crashing.\nmore lines"
)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_peer_failure_becomes_one_line_naming_the_phase(one_rank_group):
    with pytest.raises(RankFailure) as info, collective_phase("gradient-queue reduction"):
        raise RuntimeError(GLOO_RESET)
    error = info.value
    assert str(error) == (
        "rank 0 of 1: gradient-queue reduction failed: another rank died or stopped answering "
        "(Connection closed by peer [127.0.0.1]:60044)"
    )
    assert error.phase == "gradient-queue reduction" and error.rank == 0 and error.failed_rank is None
    assert isinstance(error.__cause__, RuntimeError)  # the backend's error, for the log


def test_other_errors_pass_unchanged(one_rank_group):
    with pytest.raises(ValueError, match="not a collective"), collective_phase("validation"):
        raise ValueError("not a collective")
    with pytest.raises(RuntimeError, match="CUDA out of memory") as info, collective_phase("training"):
        raise RuntimeError("CUDA out of memory")
    assert not isinstance(info.value, RankFailure)
    with (
        pytest.raises(RankFailure, match="rank 0 of 1: checkpoint failed") as nested,
        collective_phase("validation"),
        collective_phase("checkpoint"),
    ):
        raise RuntimeError("Connection reset by peer")
    assert nested.value.phase == "checkpoint"  # the innermost phase names it


def test_without_a_process_group_nothing_is_rewritten():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="Connection closed by peer") as info, collective_phase("training"):
        raise RuntimeError(GLOO_RESET)
    assert not isinstance(info.value, RankFailure)
    assert peer_failed(dist.DistNetworkError("anything")) and not peer_failed(RuntimeError("shape mismatch"))
