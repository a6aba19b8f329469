"""Lightning's DDP integration tests ``test_ddp_wrapper`` and ``test_ddp_gradients_synced``
(``tests_pytorch/strategies/test_ddp_integration.py``), ported to 2 CPU ranks: GPU-only
there, run on gloo here. The strategy under test comes from ``PORT_STRATEGY``: ``ddp``
(Lightning's ``DDPStrategy``) or ``mqgnn:<staleness>`` (``MQGNNStrategy``). Run by
tests/strategy/test_lightning_ddp_ports.py as one pytest process holding every parametrisation,
as Lightning's standalone suite may: rank 0's process goes on from fit to fit while each fit's
launcher starts a new rank 1, and the environment and process group are reset between tests as
Lightning's own fixtures do."""

import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.utilities.distributed import _destroy_dist_connection
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from lightning_mqgnn.strategy import MQGNNStrategy


def strategy_under_test(**ddp_kwargs):
    name = os.environ.get("PORT_STRATEGY", "ddp")
    if name == "ddp":
        return DDPStrategy(**ddp_kwargs)
    staleness = int(name.split(":")[1])
    return MQGNNStrategy(
        staleness=staleness, step_timeout=float(os.environ.get("PORT_STEP_TIMEOUT", 30)), **ddp_kwargs
    )


def staleness() -> int:
    name = os.environ.get("PORT_STRATEGY", "ddp")
    return 0 if name == "ddp" else int(name.split(":")[1])


@pytest.fixture(autouse=True)
def restore_env_variables():
    """Lightning's fixture: the variables a test sets (the launcher's rank variables) go."""
    backup = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(backup)


@pytest.fixture(autouse=True)
def teardown_process_group():
    """Lightning's fixture: the process group is destroyed before the next test."""
    yield
    _destroy_dist_connection()


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_ddp_wrapper(tmp_path, precision):
    """Parameters to ignore are carried over to DDP (staleness 0: the wrapper is DDP's)."""

    class WeirdModule(torch.nn.Module):
        def _save_to_state_dict(self, destination, prefix, keep_vars):
            return {"something": "something"}

    class CustomModel(BoringModel):
        def __init__(self):
            super().__init__()
            self.weird_module = WeirdModule()
            self._ddp_params_and_buffers_to_ignore = ["something"]

    class CustomCallback(Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if staleness() > 0:  # no wrapper: the gradient queue exchanges the gradients
                assert trainer.strategy.model is pl_module
                return
            assert isinstance(trainer.strategy.model, DistributedDataParallel)
            assert trainer.strategy.model.parameters_to_ignore == {"something"}
            assert trainer.strategy.model.module._ddp_params_and_buffers_to_ignore == ["something"]

    trainer = Trainer(
        default_root_dir=tmp_path,
        fast_dev_run=True,
        precision=precision,
        strategy=strategy_under_test(),
        accelerator="cpu",
        devices=2,
        callbacks=CustomCallback(),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(CustomModel())
    assert trainer.state.finished


@pytest.mark.parametrize("automatic_optimization", [True, False])
@pytest.mark.parametrize("static_graph", [True, False])
def test_ddp_gradients_synced(tmp_path, automatic_optimization, static_graph):
    """Every rank sees the same gradient, under automatic and manual optimisation."""
    if staleness() > 0 and static_graph:  # a DDP wrapper's argument: refused at staleness > 0
        with pytest.raises(ValueError, match="static_graph"):
            strategy_under_test(static_graph=static_graph)
        return

    class TestModel(BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = automatic_optimization

        def training_step(self, batch, batch_idx):
            if self.automatic_optimization:
                return super().training_step(batch, batch_idx)
            opt = self.optimizers()
            opt.zero_grad()
            out = super().training_step(batch, batch_idx)
            self.manual_backward(out["loss"])
            opt.step()
            return out

        def on_train_batch_end(self, *args, **kwargs):
            grad_sum = self.layer.bias.grad.detach().sum()
            self.log("grad_sum_min", grad_sum, sync_dist=True, reduce_fx="min")
            self.log("grad_sum_max", grad_sum, sync_dist=True, reduce_fx="max")

    kwargs = {"static_graph": static_graph} if staleness() == 0 else {}
    trainer = Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        devices=2,
        strategy=strategy_under_test(**kwargs),
        max_steps=2,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TestModel(), datamodule=BoringDataModule())
    assert torch.allclose(trainer.callback_metrics["grad_sum_min"], trainer.callback_metrics["grad_sum_max"])
