"""Spawned two-rank fits exit cleanly, many times in a row, on a loaded machine.

A rank that trained and then died at interpreter exit (``terminate called without an active
exception``, SIGABRT) turns a successful run into ``ProcessExitedException``: rare, so only a long
run of fits under load shows it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.paths import HELPERS, REPO
from helpers.processes import launcher_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_spawned_fits_exit_cleanly_under_load():
    # 51 fits (17 each of staleness 0, 1, and 1 with sync_period=3), three busy processes beside them
    env = launcher_env()
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "exit_stress.py"), "--fits", "51", "--load", "3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["fits"] == 51
    assert report["abnormal"] == [], report["abnormal"]
