"""A rank killed during sampled training: the others exit within seconds, each with one error
line that names the dead rank and the phase, and leave the traceback in the run's folder. A rank
that hangs instead ends the other after the strategy's step timeout, and is ended with it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest
from helpers.processes import group_members, launcher_env, rank_process
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


def start_training(
    tmp_path, strategy: str, ranks: int, *extra: str, batch_size: int = 64, **env: str
) -> subprocess.Popen:
    """A recipe job of ``ranks`` CPU ranks that trains for long, writing last.ckpt at each epoch's
    end, in a session of its own (``env``: added to its environment)."""
    cmd = [
        *TRAIN,
        "data.scale=0.02",
        f"loader.batch_size={batch_size}",
        "trainer.max_steps=-1",
        "trainer.max_epochs=50",
        "early_stopping.patience_batches=1000000",
        "last_checkpoint_every_s=0",
        f"strategy={strategy}",
        "trainer.accelerator=cpu",
        f"trainer.devices={ranks}",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        env=launcher_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_training(proc: subprocess.Popen, tmp_path, checkpoint: str = "last.ckpt") -> None:
    """Until the run writes ``checkpoint`` (last.ckpt: an epoch's end; best.ckpt: a validation)."""
    path = tmp_path / "checkpoints" / checkpoint
    deadline = time.monotonic() + 240
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.exists(), f"training never wrote {checkpoint}"


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
    proc = start_training(tmp_path, strategy, ranks)
    try:
        wait_for_training(proc, tmp_path)
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


STEP_TIMEOUT_S = 4


@pytest.mark.parametrize(
    "staleness", [1, pytest.param(0, marks=pytest.mark.slow)], ids=["gradient-queue", "ddp-wrapper"]
)
def test_a_hung_rank_ends_the_other_after_the_step_timeout_and_is_ended_with_it(tmp_path, staleness):
    # 229 batches an epoch, a validation every 40: the first best.ckpt comes mid-epoch, far from
    # the meeting at the next epoch's first batch, which keeps the group's own timeout
    proc = start_training(
        tmp_path,
        "mqgnn",
        2,
        "val_every_batches=40",
        "val_share=null",
        f"strategy.staleness={staleness}",
        f"strategy.step_timeout={STEP_TIMEOUT_S}",
        batch_size=8,
    )
    pid = None
    try:
        wait_for_training(proc, tmp_path, "best.ckpt")
        pid = rank_process(proc.pid, 1)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # alive, holding its sockets open, answering nothing
        stopped_at = time.monotonic()
        try:
            _, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # the stopped rank holds the pipes: say what the run printed
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run outlived the stop by 120 s:\n{proc.communicate()[1][-3000:]}")
        took = time.monotonic() - stopped_at
        left = group_members(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if pid is not None and psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
    # the step's collective waited its timeout, not the default group's 30 minutes
    assert STEP_TIMEOUT_S <= took < STEP_TIMEOUT_S + 15, took
    assert proc.returncode == 1, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    step_phases = ("gradient-queue reduction", "gradient all-reduce", "model synchronisation", "training")
    assert errors[0].startswith("error: rank 0 of 2: "), errors[0]
    assert any(f": {phase} failed: rank 1 died or stopped answering" in errors[0] for phase in step_phases), (
        errors[0]
    )
    assert f"{STEP_TIMEOUT_S * 1000}ms" in errors[0], errors[0]  # gloo's sentence names the timeout
    assert not left, "the hung rank outlived the run"


# rank 1 stops (SIGSTOP) at its tenth step; rank 0 fails there with an error no handler foresees
STOP_AND_FAIL_MODEL = """
import os, signal
from lightning_mqgnn.models import NodeClassifier


class StopAndFail(NodeClassifier):
    def training_step(self, batch, batch_idx):
        if self.global_step == 10:
            if self.global_rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                raise ZeroDivisionError("an error no handler foresees")
        return super().training_step(batch, batch_idx)
"""


def test_an_unforeseen_error_on_rank_0_ends_the_ranks_it_started(tmp_path):
    (tmp_path / "stop_and_fail.py").write_text(STOP_AND_FAIL_MODEL)
    proc = start_training(
        tmp_path / "run",
        "mqgnn",
        2,
        "model.module._target_=stop_and_fail.StopAndFail",
        PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p),
    )
    try:
        _, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:  # the stopped rank holds the pipes
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the stopped rank outlived the run:\n{proc.communicate()[1][-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, stderr[-3000:]
    assert "ZeroDivisionError: an error no handler foresees" in stderr, stderr[-3000:]  # the traceback stands
    assert not group_members(proc.pid)
