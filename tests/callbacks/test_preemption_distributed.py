"""Preemption on 2 gloo ranks: SIGTERM to rank 1 alone stops both ranks at the end of the same
step (one all-reduce of the signal), both exit with 143, and the fit resumed from the
``last.ckpt`` written there ends on every rank with parameters and buffers equal, bit for bit, to
those of the fit that was never stopped: ``ddp`` and ``MQGNNStrategy`` at staleness 0 and 1 (with
and without a short model-synchronisation period), with each of the three training loaders."""

import signal
import subprocess
import sys

import pytest
import torch
from helpers.paths import HELPERS, REPO
from helpers.processes import launcher_env

SCRIPT = HELPERS / "preemption_ranks.py"
sys.path.insert(0, str(HELPERS))
from preemption_ranks import CASES, SIGNAL_STEP  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 3 fits of 2 fresh ranks a case: ~1 min


def run(tmp_path, case: str, phase: str) -> subprocess.CompletedProcess:
    env = launcher_env(PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), case, phase],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_sigterm_to_one_rank_stops_both_and_the_resumed_fit_is_exact(tmp_path, case):
    through = run(tmp_path, case, "through")
    assert through.returncode == 0, through.stderr[-3000:]

    stop = run(tmp_path, case, "stop")
    # Lightning's launcher SIGKILLs rank 0 if it polls after rank 1 has exited and before rank 0 has
    assert stop.returncode in (128 + signal.SIGTERM, -signal.SIGKILL), stop.stderr[-3000:]
    for rank in (0, 1):
        line = (tmp_path / f"stopped_rank{rank}.txt").read_text()
        assert line.startswith(f"{SIGNAL_STEP + 1} stopped by SIGTERM at epoch 1 after"), line
    assert not (tmp_path / "stop_rank0.pt").exists()  # neither fit ran to its end

    resume = run(tmp_path, case, "resume")
    assert resume.returncode == 0, resume.stderr[-3000:]
    for rank in (0, 1):
        a = torch.load(tmp_path / f"through_rank{rank}.pt", weights_only=True)
        b = torch.load(tmp_path / f"resume_rank{rank}.pt", weights_only=True)
        assert a["step"] == b["step"] > SIGNAL_STEP
        differ = [k for k in a["state"] if not torch.equal(a["state"][k], b["state"][k])]
        assert not differ, f"rank {rank}: {differ}"
