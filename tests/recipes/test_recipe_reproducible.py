"""Same command, same seed, same result: the recipe run twice, once beside a CPU-bound process,
prints the same RESULT metrics, epochs and batches, bit for bit. The default validation schedule
weighs validations in work, not in seconds, so the load moves no validation, no best checkpoint
and no early stop."""

import multiprocessing
import time

import pytest
from helpers.recipe import result_fields, run_recipe

# a few epochs of the generated graph at a fiftieth of its size: 4 training batches an epoch
SMALL = ("data.scale=0.02", "trainer.max_epochs=6", "step_cap.min_steps=0")
# the default graph until early stopping, about ten epochs: where the validations fall decides
# the best checkpoint and the stop (with val_budget=time two quiet runs already differ here)
EARLY_STOPPED = ("trainer.max_epochs=20", "step_cap.min_steps=0", "early_stopping.patience_batches=40")
SAME = ("val", "test", "epochs", "batches")


def spin(until: float) -> None:
    while time.monotonic() < until:
        pass


def twice(tmp_path, *overrides: str) -> tuple[dict, dict]:
    """The recipe's RESULT fields of a run on a quiet machine and of one beside a busy process."""
    quiet = run_recipe(tmp_path / "quiet", *overrides)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    busy = multiprocessing.get_context("spawn").Process(target=spin, args=(time.monotonic() + 300,))
    busy.start()
    try:
        loaded = run_recipe(tmp_path / "loaded", *overrides)
    finally:
        busy.kill()
        busy.join()
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    return result_fields(quiet.stdout), result_fields(loaded.stdout)


def test_the_default_command_gives_the_same_result_under_load(tmp_path):
    """The defaults: SAGE, the sequential loader, validations within a quarter of the work."""
    quiet, loaded = twice(tmp_path, *EARLY_STOPPED)
    assert {k: quiet[k] for k in SAME} == {k: loaded[k] for k in SAME}


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(("loader=pipeline",), marks=pytest.mark.slow),  # the GNS case runs the pipeline too
        ("model=sage_gns", "loader=pipeline"),
        pytest.param(("model=labor_sage",), marks=pytest.mark.slow),
        pytest.param(("model=ladies_fd",), marks=pytest.mark.slow),
        pytest.param(("trainer.deterministic=true",), marks=pytest.mark.slow),
    ],
    ids=["pipeline", "gns", "labor", "ladies_fd", "deterministic"],
)
def test_the_same_command_gives_the_same_result_under_load(tmp_path, overrides):
    quiet, loaded = twice(tmp_path, *SMALL, *overrides)
    assert {k: quiet[k] for k in SAME} == {k: loaded[k] for k in SAME}


@pytest.mark.distributed
@pytest.mark.slow  # two 2-rank runs
def test_two_ranks_of_the_gradient_queue_give_the_same_result_under_load(tmp_path):
    quiet, loaded = twice(tmp_path, *SMALL, "strategy=mqgnn", "trainer.accelerator=cpu", "trainer.devices=2")
    assert {k: quiet[k] for k in SAME} == {k: loaded[k] for k in SAME}
