"""Validation budgets: validations every few batches while validating stays within a share of
the work (``ValidationWorkBudget``) or of the time (``ValidationTimeBudget``), the final weights
validated, and the same batches on every rank."""

import json
import subprocess
import sys

import pytest
from helpers.paths import HELPERS, REPO
from helpers.processes import launcher_env

from lightning_mqgnn.callbacks import ValidationTimeBudget, ValidationWorkBudget

sys.path.insert(0, str(HELPERS))
from validation_budget_ranks import fit  # noqa: E402


def test_a_validation_is_skipped_while_validation_exceeds_its_share_of_the_time():
    """Batches cost 1 s, validations 3 s, half the time for validation, checks every 2 batches,
    epochs of 4: the first after the epoch (step 4: 0 s of 4 validating), then at 6 (3 of 9),
    8 (6 of 14), 10 (9 of 19), 12 (12 of 24); at 14 validation would exceed half (15 of 29),
    at 16 it fits (15 of 31)."""
    assert fit(None, share=0.5, every_batches=2) == [4, 6, 8, 10, 12, 16]


def test_a_cheap_validation_runs_every_every_batches_and_the_first_waits_for_an_epoch():
    assert fit(None, share=1.0, every_batches=3) == [4, 7, 10, 13, 16]  # first at the epoch's end
    # every_batches later than it; the last batch's weights are validated too
    assert fit(None, share=1.0, every_batches=5) == [5, 10, 15, 16]


def test_a_small_share_validates_rarely_and_the_final_weights_still():
    # 4 (0 of 4), then 3 s of validation fits a tenth of the time only at 30 s: step 27; 40 ends
    assert fit(None, steps=40, share=0.1, every_batches=1) == [4, 27, 40]


def test_a_validation_runs_where_with_it_validating_is_within_its_share_of_the_work():
    """Batches weigh 1, validations 3, half for validation, checks every 2 batches: the k-th
    validation fits once 3k <= b, at 4, 6, 10 (9 <= 10), 12, 16 (15 <= 16, the last batch too);
    no wait for an epoch, the cost being known before training."""
    assert fit(None, measure="work", share=0.5, every_batches=2) == [4, 6, 10, 12, 16]
    assert fit(None, measure="work", steps=40, share=0.1, every_batches=1) == [27, 40]


def test_the_work_budget_resumes_where_it_stopped():
    budget = ValidationWorkBudget(share=0.5, every_batches=2)
    budget.validations, budget._batches_since, budget.training_work = 3, 1, 123.0
    again = ValidationWorkBudget(share=0.5, every_batches=2)
    again.load_state_dict(budget.state_dict())
    assert (again.validations, again._batches_since, again.training_work) == (3, 1, 123.0)


def test_a_module_that_cannot_weigh_its_validation_is_told_to_use_the_time_budget():
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = pl.Trainer(
        max_steps=2,
        callbacks=[ValidationWorkBudget()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with pytest.raises(
        ValueError,
        match=r"BoringModel has no validation_work\(\) or training_work\(\) .*ValidationTimeBudget",
    ):
        trainer.fit(BoringModel())


@pytest.mark.parametrize("budget", [ValidationTimeBudget, ValidationWorkBudget])
@pytest.mark.parametrize("kwargs", [dict(share=0.0), dict(share=1.5), dict(every_batches=0)])
def test_bad_arguments_are_refused(budget, kwargs):
    with pytest.raises(ValueError, match=budget.__name__):
        budget(**kwargs)


@pytest.mark.distributed
@pytest.mark.parametrize("measure", ["time", "work"])
def test_two_ranks_whose_costs_differ_validate_after_the_same_batches(tmp_path, measure):
    """Rank 1's validations cost ten times rank 0's: rank 0's figures decide for both."""
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "validation_budget_ranks.py"), str(tmp_path), "2", measure],
        capture_output=True,
        text=True,
        timeout=120,  # about 10 s; ranks that disagreed would wait for each other until then
        env=launcher_env(PYTHONPATH=f"{REPO}:{HELPERS}"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert steps[0] == steps[1] == {"time": [4, 6, 8, 10, 12, 16], "work": [4, 6, 10, 12, 16]}[measure]
