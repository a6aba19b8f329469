"""Lightning's DDP integration tests ``test_ddp_wrapper`` and ``test_ddp_gradients_synced``, every
parametrisation of each in one pytest process on 2 CPU ranks, under Lightning's ``DDPStrategy``
and under ``MQGNNStrategy(staleness=0)``: ours passes every test DDP passes.

In one process the subprocess launcher starts, for each test, a rank 1 that runs the same pytest
command from its first test, so rank 1 runs another test than rank 0; DDP passes where the two
tests' collectives happen to match, and waits on its group's timeout where they do not. Each run
is therefore cut after ``RUN_S`` and its rank processes killed; rank 0's outcomes are read from
``helpers/port_outcomes.py``'s file."""

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers.paths import HELPERS, REPO
from helpers.processes import launcher_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
RUN_S = 120


def passed(tmp_path, strategy: str, selection: str) -> set[str]:
    out = tmp_path / f"{strategy.replace(':', '')}_{selection}.jsonl"
    env = launcher_env(PYTHONPATH=str(REPO), PORT_STRATEGY=strategy, PORT_OUTCOMES=str(out))
    # rank 0 is the process pytest runs as: `exec` keeps the shell's pid, named before it
    command = (
        f"export PORT_PARENT_PID=$$; exec {sys.executable} -m pytest -q -p no:cacheprovider "
        f"-p helpers.port_outcomes -o addopts='' {HELPERS / 'ddp_integration_port.py'} -k {selection}"
    )
    proc = subprocess.Popen(["bash", "-c", command], cwd=REPO, env=env, start_new_session=True)
    try:
        proc.wait(timeout=RUN_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # rank 0 and every rank it launched
        proc.wait()
    lines = out.read_text().splitlines() if out.exists() else []
    return {o["test"] for o in map(json.loads, lines) if o["outcome"] == "passed"}


@pytest.mark.parametrize("selection", ["test_ddp_wrapper", "test_ddp_gradients_synced"])
def test_every_test_ddp_passes_in_one_process_passes_at_staleness_zero(tmp_path, selection):
    by_ddp = passed(tmp_path, "ddp", selection)
    ours = passed(tmp_path, "mqgnn:0", selection)
    assert by_ddp, "DDP passed none: the port does not run"
    assert by_ddp <= ours, f"DDP passed {sorted(by_ddp)}, MQGNNStrategy(staleness=0) {sorted(ours)}"
