"""What the recipe prints besides its results: none of the warnings and notices that are not the
user's to act on (``helpers.recipe.NOT_THE_USERS``), on a first run and on its resumption, while
a warning of the user's own code still shows."""

import os
import re
import warnings

import pytest
from helpers.recipe import assert_quiet, result_fields, run_recipe

USER_WARNING = "a warning of the user's own"
# a model of the user's, which warns once it trains
USER_MODEL = f'''
import warnings

from lightning_mqgnn.models import NodeClassifier


class WarningClassifier(NodeClassifier):
    def on_train_start(self):
        warnings.warn("{USER_WARNING}")
'''

RUN = (
    "data.scale=0.02",  # 4 training batches an epoch
    "model.module._target_=user_model.WarningClassifier",
    "trainer.max_steps=-1",
    "last_checkpoint_every_s=0",
    "val_share=null",
    "val_every_batches=4",  # at each epoch's end: the test score is the best checkpoint's
)


@pytest.fixture(scope="module")
def first_and_resumed(tmp_path_factory):
    """Two epochs, then the same run resumed from their last checkpoint to three."""
    root = tmp_path_factory.mktemp("quiet")
    (root / "user_model.py").write_text(USER_MODEL)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    first = run_recipe(root / "first", *RUN, "trainer.max_epochs=2", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    last = root / "first" / "checkpoints" / "last.ckpt"
    resumed = run_recipe(root / "resumed", *RUN, "trainer.max_epochs=3", f"ckpt_path={last}", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return first, resumed


def test_a_first_run_prints_only_what_is_the_users(first_and_resumed):
    first, _ = first_and_resumed
    assert_quiet(first)
    assert result_fields(first.stdout)["epochs"] == "2"


def test_a_resumed_run_prints_only_what_is_the_users(first_and_resumed):
    _, resumed = first_and_resumed
    assert_quiet(resumed)
    assert "Restored all states from the checkpoint" in resumed.stderr
    assert result_fields(resumed.stdout)["batches"] == "12"


def test_a_warning_of_the_users_code_still_shows(first_and_resumed):
    shown = re.compile(rf"user_model\.py:\d+: UserWarning: {USER_WARNING}")
    for proc in first_and_resumed:
        assert shown.search(proc.stderr), proc.stderr[-3000:]


def test_the_recipes_filters_match_lightnings_lines_only():
    """The same message from another module, or another message from Lightning's, still shows."""
    from lightning_mqgnn.recipe import train as recipe

    leaf_spec = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)`"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recipe.quiet_lightning()
        for message, module in [
            (leaf_spec, "lightning.pytorch.utilities._pytree"),
            (leaf_spec, "user_code"),
            ("something else", "lightning.pytorch.utilities._pytree"),
        ]:
            warnings.warn_explicit(message, FutureWarning, "file.py", 1, module=module)
    assert [(str(w.message), w.filename) for w in caught] == [
        (leaf_spec, "file.py"),
        ("something else", "file.py"),
    ]
