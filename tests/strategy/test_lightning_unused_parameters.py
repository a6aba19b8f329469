"""Lightning's unused-parameter tests (``test_find_unused_parameters_ddp_exception`` and
``test_find_unused_parameters_ddp_spawn_raises`` in ``tests_pytorch/strategies/test_ddp_integration.py``)
at staleness 1: one rank, two steps, a parameter the loss never reaches is Lightning's DDP error with
its wording, raised in the process and through a spawned rank."""

import lightning.pytorch as pl
import pytest
from helpers.pipeline import make_trainer
from helpers.unused_parameters_model import NoGradLayerModel
from torch.multiprocessing import ProcessRaisedException

from lightning_mqgnn.strategy import MQGNNStrategy

pytestmark = pytest.mark.usefixtures("one_rank_group_destroyed")
LIGHTNINGS_WORDS = "It looks like your LightningModule has parameters that were not used in"


def _trainer(start_method: str) -> pl.Trainer:
    return make_trainer(strategy=MQGNNStrategy(staleness=1, start_method=start_method), max_steps=2)


def test_an_unused_parameter_raises_lightnings_error_at_staleness_one():
    with pytest.raises(RuntimeError, match=LIGHTNINGS_WORDS):
        _trainer("popen").fit(NoGradLayerModel())


@pytest.mark.distributed
def test_an_unused_parameter_raises_lightnings_error_through_a_spawned_rank_at_staleness_one():
    with pytest.raises(ProcessRaisedException, match=LIGHTNINGS_WORDS):
        _trainer("spawn").fit(NoGradLayerModel())
