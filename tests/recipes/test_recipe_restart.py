"""``torchrun --max-restarts`` with ``ckpt_path=auto``: a rank killed mid-run, the group restarted,
and the run finished as the one that was never interrupted."""

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
from helpers.processes import launcher_env, rank_process

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
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{out[-3000:]}")
    return out


def test_a_killed_rank_restarts_and_the_run_ends_as_if_uninterrupted(tmp_path):
    straight = _torchrun(tmp_path / "straight")
    out = _finish(straight, 600)
    assert straight.returncode == 0, out[-3000:]

    job = tmp_path / "job"
    proc = _torchrun(job)
    last = job / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert last.exists(), "no epoch-end checkpoint before the kill"
    # torchrun's agent is the Popen child; its workers are the agent's children
    victim = rank_process(proc.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    out = _finish(proc, 600)
    assert proc.returncode == 0, out[-3000:]
    assert "ckpt_path=auto: resuming from" in out, out[-3000:]  # the restarted group resumed

    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(last, weights_only=True)
    assert a["global_step"] == b["global_step"] > 0
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
