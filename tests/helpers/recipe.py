"""Running ``recipes/train.py`` in a fresh interpreter and reading what it prints."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.paths import CONF, REPO

TRAIN = [sys.executable, str(REPO / "recipes" / "train.py")]


def recipe_config(*overrides: str):
    """The recipe's configuration (``lightning_mqgnn/conf/config.yaml``) composed with ``overrides``, as
    ``recipes/train.py`` would run it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_recipe(
    out_dir, *overrides: str, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The recipe with ``overrides``; ``env`` adds to (or, with an empty value, removes from) this
    process's environment."""
    cmd = [*TRAIN, *overrides, "trainer.enable_progress_bar=false", f"hydra.run.dir={out_dir}"]
    environ = {**os.environ, **(env or {})}
    environ = {k: v for k, v in environ.items() if v != ""}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)


# what Lightning and torch printed on a plain run of the recipe that was not the user's to act on
NOT_THE_USERS = (
    "tensorboardX",  # logger=True without TensorBoard installed
    "💡 Tip",  # Lightning's advertisements of its cloud services
    "LeafSpec",  # torch 2.13's deprecation, raised by Lightning's own pytree code
    "smaller than the logging interval",
    "transfer_batch_to_device",
    "weights_only",
    "exists and is not empty",  # a resumed run writing into its own checkpoint folder
    "all_gather is deprecated",
    "val_check_interval=1.0",
)


def assert_quiet(proc: subprocess.CompletedProcess) -> None:
    """The run printed none of ``NOT_THE_USERS``, and its stage times are named in their unit."""
    printed = proc.stdout + proc.stderr
    for fragment in NOT_THE_USERS:
        assert fragment not in printed, [line for line in printed.splitlines() if fragment in line]
    stages = [line for line in proc.stderr.splitlines() if line.startswith("stage times")]
    assert len(stages) == 1, proc.stderr[-3000:]
    assert "_ms=" in stages[0] and "_s=" not in stages[0], stages[0]


def result_fields(stdout: str) -> dict[str, str]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, stdout[-2000:]
    return dict(item.split("=", 1) for item in lines[0].split()[1:])


def assert_one_error_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
