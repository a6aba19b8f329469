"""A rank killed during sampled training: the others exit within seconds, each with one error
line that names the dead rank and the phase, and leave the traceback in the run's folder."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from helpers.processes import launcher_env, rank_process
from helpers.recipe import TRAIN

pytestmark = pytest.mark.distributed

PHASES = (
    "gradient-queue reduction",
    "gradient all-reduce",
    "model synchronisation",
    "checkpoint",
    "validation",
    "training",
)


@pytest.mark.parametrize(
    "strategy, ranks, victim",
    [
        ("mqgnn", 2, 1),
        pytest.param("ddp", 2, 1, marks=pytest.mark.slow),
        pytest.param("mqgnn", 3, 2, marks=pytest.mark.slow),
    ],
    ids=["mqgnn-2-ranks", "ddp-2-ranks", "mqgnn-3-ranks"],
)
def test_a_killed_rank_ends_the_others_in_one_line_each(tmp_path, strategy, ranks, victim):
    env = launcher_env()
    cmd = [
        *TRAIN,
        "data.scale=0.02",
        "loader.batch_size=64",
        "trainer.max_steps=-1",
        "trainer.max_epochs=50",
        "early_stopping.patience_batches=1000000",
        "last_checkpoint_every_s=0",
        f"strategy={strategy}",
        "trainer.accelerator=cpu",
        f"trainer.devices={ranks}",
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
        pid = rank_process(proc.pid, victim)  # Lightning's launcher starts the others as children
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert took < 30, took
    # each survivor prints its line (they share the launcher's stderr); Lightning's launcher may
    # SIGKILL rank 0 once it sees a child gone, before rank 0 has printed
    survivors = [r for r in range(ranks) if r != victim]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in stderr, stderr[-3000:]
    if ranks == 2:
        assert proc.returncode == 1, stderr[-3000:]
        assert len(errors) == 1, stderr[-3000:]
    else:
        assert proc.returncode in (1, -signal.SIGKILL), stderr[-3000:]
        assert 1 <= len(errors) <= len(survivors), stderr[-3000:]
    for line in errors:
        rank = int(line.split()[2])
        assert rank in survivors, line
        assert line.startswith(f"error: rank {rank} of {ranks}: "), line
        assert f"failed: rank {victim} died or stopped answering" in line, line
        assert any(f": {phase} failed" in line for phase in PHASES), line
        log = tmp_path / f"error_rank{rank}.log"
        assert f"(traceback: {log})" in line and "Traceback" in log.read_text()
    if ranks == 2 or proc.returncode == 1:
        assert any(line.startswith("error: rank 0 ") for line in errors), stderr[-3000:]
