"""RankFailure: a collective's report that another rank is gone becomes one line naming this rank,
the failed ones where known (this host's ranks whose process ended: reaped or a zombie; in a
group of two, the other), and the phase; every other error passes unchanged."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

from lightning_mqgnn.strategy import RankFailure, rank_failure
from lightning_mqgnn.strategy.rank_failure import Peer, collective_phase, dead_ranks, peer_failed

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


def _ended_child(reap: bool) -> int:
    """The pid of a child that has exited: reaped (gone) or not (a zombie)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    if reap:
        child.wait()
    else:
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        _unreaped.append(child)  # waited for at the end of the test session
    return child.pid


_unreaped: list[subprocess.Popen] = []


@pytest.fixture
def peers(monkeypatch):
    """Set the peers a failure is judged by: rank -> Peer."""

    def set_peers(*peers):
        monkeypatch.setattr(rank_failure, "_peers", list(peers))

    yield set_peers
    for child in _unreaped:
        child.wait()
    _unreaped.clear()


def test_the_ranks_whose_process_ended_on_this_host_are_named(peers, monkeypatch):
    monkeypatch.setattr(dist, "get_rank", lambda: 0)  # rank 0 of a group of four
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    here = socket.gethostname()
    alive = Peer(here, os.getpid())
    peers(alive, Peer(here, _ended_child(reap=True)), alive, Peer(here, _ended_child(reap=False)))
    assert dead_ranks(rank=0, world=4) == [1, 3]
    error = rank_failure.rank_failure("model synchronisation", RuntimeError("Connection reset by peer"))
    assert "failed: ranks 1, 3 died or stopped answering" in str(error)
    assert error.failed_ranks == [1, 3] and error.failed_rank is None


def test_the_ranks_stopped_or_ended_on_this_host_are_told_apart(peers):
    here = socket.gethostname()
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        while psutil.Process(stopped.pid).status() != psutil.STATUS_STOPPED:
            time.sleep(0.01)
        peers(
            Peer(here, os.getpid()),
            Peer(here, stopped.pid),
            Peer(here, _ended_child(reap=True)),
            Peer("elsewhere", stopped.pid),  # not this host's: not judged
            Peer(here, os.getpid()),
        )
        assert rank_failure.halted_ranks(rank=0, world=5) == {1: "stopped", 2: "ended"}
        assert rank_failure.halted_ranks(rank=0, world=4) == {}  # peers of another group
    finally:
        stopped.kill()
        stopped.wait()


def test_a_rank_on_another_host_or_still_running_is_not_named(peers):
    here = socket.gethostname()
    peers(Peer(here, os.getpid()), Peer("elsewhere", _ended_child(reap=True)), Peer(here, os.getpid()))
    start = time.monotonic()
    assert dead_ranks(rank=0, world=3, grace_s=0.2) == []
    assert time.monotonic() - start >= 0.2  # it waited for a peer that raised to end
    peers(Peer(here, os.getpid()), Peer("elsewhere", 1))
    assert dead_ranks(rank=0, world=2, grace_s=0.0) == [1]  # in a group of two: the other
    peers()  # peers never exchanged (a group of two)
    assert dead_ranks(rank=1, world=2) == [0] and dead_ranks(rank=1, world=3) == []


@pytest.mark.parametrize("bad", [0, -1.0, True, "30"])
def test_a_step_timeout_that_is_not_a_positive_number_of_seconds_is_refused(bad):
    from lightning_mqgnn.strategy import MQGNNStrategy

    with pytest.raises(ValueError, match=r"step_timeout must be None or a number of seconds > 0, got"):
        MQGNNStrategy(step_timeout=bad)
    assert MQGNNStrategy(step_timeout=None).step_timeout is None
    assert MQGNNStrategy(step_timeout=2).step_timeout.total_seconds() == 2.0


def test_a_torch_that_cannot_change_a_groups_timeout_keeps_the_groups_own_and_says_so(monkeypatch):
    # torch 2.2 (the DGL environment's) has neither torch.distributed.set_timeout nor _set_pg_timeout
    from lightning_mqgnn.strategy import MQGNNStrategy, process_group

    monkeypatch.setattr(process_group, "_timeout_setter", None)
    assert not process_group.can_set_timeout()
    with pytest.warns(UserWarning, match=r"step_timeout=30.0 needs torch >= 2.3.*the group's `timeout`"):
        strategy = MQGNNStrategy()
    assert strategy.step_timeout is None
    with pytest.raises(RuntimeError, match=r"cannot change a process group's timeout"):
        process_group.set_timeout(strategy.group_timeout)


def test_the_default_groups_timeout_is_the_one_set_on_that_group_not_on_one_before_it(tmp_path):
    """A default group made anew has no recorded timeout until ``set_timeout`` gives it one: a
    rank-failure line never names the timeout of a group destroyed before."""
    from lightning_mqgnn.strategy import process_group

    def init(name: str) -> None:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / name}", rank=0, world_size=1)

    assert process_group.default_group_timeout() is None  # no group
    init("first")
    try:
        process_group.set_timeout(timedelta(seconds=2))
        assert process_group.default_group_timeout() == timedelta(seconds=2)
    finally:
        dist.destroy_process_group()
    assert process_group.default_group_timeout() is None
    init("second")
    try:
        assert process_group.default_group_timeout() is None  # the first group's 2 s is not this one's
        process_group.set_timeout(timedelta(seconds=3))
        assert process_group.default_group_timeout() == timedelta(seconds=3)
    finally:
        dist.destroy_process_group()


# rank 1 joins, then answers nothing; rank 0 waits 1 s per collective, in two collectives
_SILENT_PEER = """
import sys, time, torch, torch.distributed as dist
from datetime import timedelta
from lightning_mqgnn.strategy.process_group import set_timeout
from lightning_mqgnn.strategy.rank_failure import RankFailure, collective_phase
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank, world_size=2)
dist.barrier()
if rank == 1:
    time.sleep(60)
set_timeout(timedelta(seconds=1))
for phase in ("gradient-queue reduction", "model synchronisation"):
    try:
        with collective_phase(phase):
            dist.all_reduce(torch.ones(4))
    except RankFailure as error:
        print(error, flush=True)
"""


def test_a_collective_after_a_timeout_closed_the_connection_names_the_timeout():
    # gloo closes a connection whose collective timed out; every later collective on it (or one
    # in flight beside it) says "Application timeout caused pair closure", not the timeout
    from helpers.processes import free_port, launcher_env

    port = str(free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _SILENT_PEER, str(rank), port],
            env=launcher_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    ]
    try:
        out, err = ranks[1].communicate(timeout=60)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert ranks[1].returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert len(lines) == 2, err[-3000:]
    # gloo's own sentence for the collective that timed out (which operation waited may vary)
    assert lines[0].startswith(
        "rank 0 of 2: gradient-queue reduction failed: rank 1 died or stopped answering "
        "(Timed out waiting 1000ms for "
    ), lines[0]
    assert lines[1] == (
        "rank 0 of 2: model synchronisation failed: rank 1 died or stopped answering "
        "(a collective on the connection to it timed out waiting 1000ms)"
    ), lines[1]
