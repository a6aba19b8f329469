"""A rank killed during two-rank training: the other exits within seconds with one error line
that names the dead rank and the phase, and leaves the traceback in the run's folder."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from helpers.processes import launcher_env, rank_process
from helpers.recipe import TRAIN

pytestmark = pytest.mark.distributed

PHASES = ("gradient-queue reduction", "model synchronisation", "checkpoint", "validation", "training")


def test_a_killed_rank_ends_the_other_in_one_line(tmp_path):
    env = launcher_env()
    cmd = [
        *TRAIN,
        "data.scale=0.02",
        "loader.batch_size=64",
        "trainer.max_steps=-1",
        "trainer.max_epochs=50",
        "early_stopping.patience_batches=1000000",
        "last_checkpoint_every_s=0",
        "strategy=mqgnn",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        last = tmp_path / "checkpoints" / "last.ckpt"
        deadline = time.monotonic() + 240
        while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert last.exists(), "training never reached an epoch's end"
        victim = rank_process(proc.pid, 1)  # Lightning's launcher starts rank 1 as a child
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert took < 30, took
    assert proc.returncode == 1, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    line = errors[0]
    assert line.startswith("error: rank 0 of 2: ") and "failed: rank 1 died or stopped answering" in line, (
        line
    )
    assert any(f": {phase} failed" in line for phase in PHASES), line
    log = tmp_path / "error_rank0.log"
    assert f"(traceback: {log})" in line and "Traceback" in log.read_text()
