"""Lightning's DDP comm-hook tests, ported to the gradient queue at staleness 1 (2 CPU ranks): each
fit finishes and its hook ran; post-local SGD is refused with the reason."""

import json
import subprocess
import sys

import pytest
from helpers.paths import HELPERS, REPO
from helpers.processes import launcher_env

pytestmark = pytest.mark.distributed
SCRIPT = HELPERS / "lightning_hook_ports.py"


def run(tmp_path, start_method: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), start_method],
        cwd=REPO,
        env=launcher_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"results_{start_method}.json").read_text())


def test_lightnings_comm_hook_tests_pass_at_staleness_one(tmp_path):
    results = run(tmp_path, "popen")
    for name in ("fp16_compress_comm_hook", "sgd_comm_hook", "fp16_compress_wrap_sgd_comm_hook"):
        assert results[name]["finished"] and results[name]["calls"] >= 1, (name, results[name])
    assert "model_averaging_period" in results["post_local_sgd_comm_hook"]
    assert "sync_period" in results["post_local_sgd_comm_hook"]


@pytest.mark.slow  # spawned ranks import the stack again
def test_lightnings_spawn_comm_hook_test_passes_at_staleness_one(tmp_path):
    assert run(tmp_path, "spawn")["spawn_fp16_compress_comm_hook"]["finished"]
