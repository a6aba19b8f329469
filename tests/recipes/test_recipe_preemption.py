"""The recipe preempted: SIGTERM to a job's whole process group (as a scheduler sends it) stops a
pipelined run with sampler workers inside an epoch, with one ``stopped by`` line, exit status
143, the checkpoint written and no process of the job left; the same command again resumes
inside that epoch and ends as the run that was never stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest
import torch
from helpers.paths import REPO
from helpers.processes import group_members, start_job
from helpers.recipe import TRAIN, result_fields

RUN = (
    "data.scale=0.1",
    "loader=pipeline",
    "loader.batch_size=32",  # about 270 batches an epoch: a signal lands inside one
    "loader.num_workers=1",
    "loader.producer=workers",
    "trainer.max_steps=-1",
    "trainer.max_epochs=3",
    "early_stopping.patience_batches=1000000",
    "last_checkpoint_every_s=0",
    "val_every_batches=0",
    "ckpt_path=auto",
    "trainer.enable_progress_bar=false",
)


def start(run_dir) -> subprocess.Popen:
    return start_job([*TRAIN, *RUN, f"hydra.run.dir={run_dir}"], dict(os.environ), REPO)


def test_sigterm_to_the_job_stops_it_in_one_line_and_the_same_command_resumes(tmp_path):
    straight = start(tmp_path / "straight")
    straight_out, _ = straight.communicate(timeout=300)
    assert straight.returncode == 0, straight_out[-3000:]

    job = tmp_path / "job"
    proc = start(job)
    last = job / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    # epoch 0 has ended (the signal is checked before the epoch-end checkpoint is written), so the
    # signal is seen at the end of one of epoch 1's first steps
    assert last.exists(), "no epoch-end checkpoint before the signal"
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert workers, "the run has no sampler worker"
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the signalled run did not exit within 30 s")
    assert time.monotonic() - signalled < 30
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    stops = [line for line in out.splitlines() if line.startswith("stopped by")]
    assert len(stops) == 1, out[-3000:]
    assert stops[0].startswith("stopped by SIGTERM at epoch 1 after"), stops[0]
    assert stops[0].endswith("run again with ckpt_path=auto to resume"), stops[0]
    assert "Traceback" not in out and "WorkerError" not in out, out[-3000:]
    assert "RESULT" not in out
    time.sleep(0.5)
    assert not group_members(proc.pid), "a process of the job outlived it"

    again = start(job)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    assert "ckpt_path=auto: resuming from" in out
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(last, weights_only=True)
    assert a["global_step"] == b["global_step"] > 0
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    # the whole run's figures: best validation and its checkpoint's test score, every batch
    fields_a, fields_b = result_fields(straight_out), result_fields(out)
    for key in ("val", "test", "epochs", "batches"):
        assert fields_a[key] == fields_b[key], key
