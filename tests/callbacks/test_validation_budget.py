"""ValidationTimeBudget: validations every few batches while they take at most a share of the
time, the first at the first epoch's end, and the same batches on every rank."""

import json
import subprocess
import sys

import pytest
from helpers.paths import HELPERS, REPO
from helpers.processes import launcher_env

from lightning_mqgnn.callbacks import ValidationTimeBudget

sys.path.insert(0, str(HELPERS))
from validation_budget_ranks import fit  # noqa: E402


def test_a_validation_is_skipped_while_validation_exceeds_its_share():
    """Batches cost 1 s, validations 3 s, half the time for validation, checks every 2 batches,
    epochs of 4: the first after the epoch (step 4: 0 s of 4 validating), then at 6 (3 of 9),
    8 (6 of 14), 10 (9 of 19), 12 (12 of 24); at 14 validation would exceed half (15 of 29),
    at 16 it fits (15 of 31)."""
    assert fit(None, share=0.5, every_batches=2) == [4, 6, 8, 10, 12, 16]


def test_a_cheap_validation_runs_every_every_batches_and_the_first_waits_for_an_epoch():
    assert fit(None, share=1.0, every_batches=3) == [4, 7, 10, 13, 16]  # first at the epoch's end
    assert fit(None, share=1.0, every_batches=5) == [5, 10, 15]  # every_batches later than it


def test_a_small_share_validates_rarely():
    # 4 (0 of 4), then 3 s of validation fits a tenth of the time only at 30 s: step 27
    assert fit(None, steps=40, share=0.1, every_batches=1) == [4, 27]


@pytest.mark.parametrize("kwargs", [dict(share=0.0), dict(share=1.5), dict(every_batches=0)])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError, match="ValidationTimeBudget"):
        ValidationTimeBudget(**kwargs)


@pytest.mark.distributed
def test_two_ranks_whose_clocks_differ_validate_after_the_same_batches(tmp_path):
    """Rank 1's validations cost ten times rank 0's: rank 0's clock decides for both."""
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "validation_budget_ranks.py"), str(tmp_path), "2"],
        capture_output=True,
        text=True,
        timeout=120,  # about 10 s; ranks that disagreed would wait for each other until then
        env=launcher_env(PYTHONPATH=f"{REPO}:{HELPERS}"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert steps[0] == steps[1] == [4, 6, 8, 10, 12, 16]
