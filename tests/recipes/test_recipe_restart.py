"""``torchrun --max-restarts`` with ``ckpt_path=auto``: a rank killed or preempted mid-run, the
group restarted, and the run finished as the one that was never interrupted; a two-rank job under
Lightning's launcher preempted by SIGTERM to its process group, and the same command resuming it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO
from helpers.processes import group_members, launcher_env, rank_process, start_job

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # four rank processes import the stack, twice

RUN = (
    "data.scale=0.02",
    "loader.batch_size=64",  # 30 batches an epoch: a kill lands inside one
    "trainer.max_steps=-1",
    "trainer.max_epochs=5",
    "early_stopping.patience_batches=1000000",
    "last_checkpoint_every_s=0",
    "val_every_batches=0",
    "strategy=mqgnn",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.enable_progress_bar=false",
    "ckpt_path=auto",
)


def _torchrun(run_dir: Path) -> subprocess.Popen:
    # a restarted group must not read the gloo addresses of the one before from a store the agent
    # shares with it: torchrun's own switch, as the docs tell users
    env = launcher_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        str(REPO / "recipes" / "train.py"),
        *RUN,
        f"hydra.run.dir={run_dir}",
    ]
    return start_job(cmd, env, REPO)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{out[-3000:]}")
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The last checkpoint of the run that was never interrupted."""
    run_dir = tmp_path_factory.mktemp("straight")
    proc = _torchrun(run_dir)
    out = _finish(proc, 600)
    assert proc.returncode == 0, out[-3000:]
    return run_dir / "checkpoints" / "last.ckpt"


def _wait_for_checkpoint(proc: subprocess.Popen, last: Path) -> None:
    deadline = time.monotonic() + 300
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert last.exists(), "no epoch-end checkpoint before the fault"


def _assert_same_end(straight: Path, last: Path) -> None:
    a = torch.load(straight, weights_only=True)
    b = torch.load(last, weights_only=True)
    assert a["global_step"] == b["global_step"] > 0
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_or_signalled_rank_restarts_and_the_run_ends_as_if_uninterrupted(straight, tmp_path, fault):
    """SIGKILL: the group restarts from the last epoch-end checkpoint. SIGTERM (a preemption of
    one rank): both ranks stop at the same step and write ``last.ckpt`` there, and the restarted
    group resumes inside that epoch."""
    job = tmp_path / "job"
    proc = _torchrun(job)
    last = job / "checkpoints" / "last.ckpt"
    _wait_for_checkpoint(proc, last)
    # torchrun's agent is the Popen child; its workers are the agent's children
    victim = rank_process(proc.pid, 1)
    assert victim is not None
    os.kill(victim, fault)
    out = _finish(proc, 600)
    assert proc.returncode == 0, out[-3000:]
    assert "ckpt_path=auto: resuming from" in out, out[-3000:]  # the restarted group resumed
    if fault == signal.SIGTERM:
        assert "stopped by SIGTERM at epoch" in out, out[-3000:]
    _assert_same_end(straight, last)


def test_sigterm_to_a_two_rank_job_stops_it_in_one_line_and_the_same_command_resumes(straight, tmp_path):
    """Lightning's launcher (2 ranks, the pipelined loader's workers): SIGTERM to the whole
    process group, as a scheduler sends it."""
    job = tmp_path / "job"
    cmd = [
        sys.executable,
        str(REPO / "recipes" / "train.py"),
        *RUN,
        "loader=pipeline",
        "loader.num_workers=1",
        "loader.producer=workers",
        f"hydra.run.dir={job}",
    ]
    env = launcher_env()
    proc = start_job(cmd, env, REPO)
    last = job / "checkpoints" / "last.ckpt"
    _wait_for_checkpoint(proc, last)  # epoch 0 has ended: the signal lands inside epoch 1
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    out = _finish(proc, 30)
    assert time.monotonic() - signalled < 30
    # Lightning's launcher SIGKILLs rank 0 if it polls after rank 1 has exited and before rank 0 has
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGKILL), out[-3000:]
    stops = [line for line in out.splitlines() if line.startswith("stopped by")]
    assert len(stops) <= 1, out[-3000:]
    assert proc.returncode == -signal.SIGKILL or len(stops) == 1, out[-3000:]
    assert "Traceback" not in out and "WorkerError" not in out, out[-3000:]
    time.sleep(1.0)
    leftover = group_members(proc.pid)
    assert not leftover, f"processes of the job outlived it: {leftover}"

    again = start_job(cmd, env, REPO)
    out = _finish(again, 600)
    assert again.returncode == 0, out[-3000:]
    assert "ckpt_path=auto: resuming from" in out, out[-3000:]
    _assert_same_end(straight, last)
