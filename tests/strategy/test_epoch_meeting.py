"""The ranks' meeting at an epoch's first batch: keys every rank derives from the fit it agreed
on, gone once the ranks have left; ranks at different meetings end within ``step_timeout`` in
one line each; a rank-0 process that outlives its fit meets the new ranks of the next fit."""

import json
import subprocess
import sys
import time

import pytest
from helpers.paths import HELPERS, REPO
from helpers.processes import free_port, launcher_env

pytestmark = pytest.mark.distributed


def two_ranks(tmp_path, mode: str, timeout: float = 60) -> list[dict]:
    port = free_port()
    env = launcher_env(PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "meeting_ranks.py"), str(rank), str(port), mode, str(tmp_path)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_ranks_meet_at_keys_of_the_fit_they_agreed_on_and_leave_none_behind(tmp_path):
    ranks = two_ranks(tmp_path, "same")
    assert ranks[0]["fits"] == ranks[1]["fits"]  # one identifier per fit, the same on both ranks
    assert len(set(ranks[0]["fits"])) == 2  # and a new one for the second fit
    assert ranks[0]["keys_left"] == []


def test_ranks_waiting_at_different_meetings_each_end_in_one_line_within_the_step_timeout(tmp_path):
    start = time.monotonic()
    ranks = two_ranks(tmp_path, "apart")
    assert time.monotonic() - start < 30  # not the 60 s limit of a slow rank
    for rank, result in enumerate(ranks):
        error = result["error"]
        assert error is not None and "\n" not in error
        assert error.startswith(f"rank {rank} of 2: training failed: ") and result["failed_ranks"] == [
            1 - rank
        ]
        assert 1.0 <= result["after_s"] < 10
    # the first to see it names both meetings; the other may see that rank end first
    apart = [r["error"] for r in ranks if "wait at different epoch meetings and can never meet" in r["error"]]
    assert apart and all(" at " in line.split("(this rank at ")[1] for line in apart)


@pytest.mark.parametrize("staleness", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_a_rank_zero_process_that_outlives_its_fit_meets_the_new_ranks_of_the_next(tmp_path, staleness):
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "fresh_peer_fits.py"), str(tmp_path), str(staleness)],
        cwd=REPO,
        env=launcher_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fits = json.loads((tmp_path / "fits.json").read_text())
    assert [(f["finished"], f["epochs"], f["keys_left"]) for f in fits] == [(True, 2, [])] * 2
    assert fits[0]["fit_id"] != fits[1]["fit_id"]
