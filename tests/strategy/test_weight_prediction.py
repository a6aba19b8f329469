"""Weight prediction: each stale gradient computed at the weights it will be applied to."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
from helpers.pipeline import make_trainer
from torch import nn

from lightning_mqgnn.strategy import MQGNNStrategy
from lightning_mqgnn.strategy.weight_prediction import WeightPrediction

pytestmark = pytest.mark.usefixtures("one_rank_group_destroyed")


def _params() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(3, 2)), nn.Parameter(torch.randn(2))]


def test_the_body_runs_steps_last_updates_ahead_and_the_weights_come_back_exactly():
    params = _params()
    prediction = WeightPrediction(params)
    before = [p.detach().clone() for p in params]
    for update in prediction.last_update:
        update.copy_(torch.randn_like(update) * 1e-3)
    with prediction.predicted(2):
        for p, b, u in zip(params, before, prediction.last_update):
            assert torch.equal(p.detach(), b + 2 * u)
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))  # a copy back, no rounding
    with pytest.raises(RuntimeError, match="in the body"), prediction.predicted(1):
        raise RuntimeError("in the body")
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))


def test_the_last_update_is_the_mean_of_the_optimiser_steps_taken_and_zero_without_one():
    params = _params()
    prediction = WeightPrediction(params)
    with prediction.predicted(1):
        pass
    start = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(0.3)  # three optimiser steps of 0.1 each (a queue draining)
    prediction.record(3)
    for update, p, s in zip(prediction.last_update, params, start):
        assert torch.allclose(update, (p.detach() - s) / 3)
        assert torch.allclose(update, torch.full_like(update, 0.1))
    with prediction.predicted(1):
        pass
    prediction.record(0)  # a queue filling: no update
    assert all(not update.any() for update in prediction.last_update)
    with pytest.raises(RuntimeError, match="no predicted step"):
        prediction.record(1)


def test_the_last_update_round_trips_through_a_checkpoint_and_a_wrong_shape_is_refused():
    params = _params()
    prediction = WeightPrediction(params)
    for update in prediction.last_update:
        update.normal_()
    restored = WeightPrediction(_params())
    restored.load_state_dict(prediction.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(restored.last_update, prediction.last_update))
    other = WeightPrediction([nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match="'last_update' has shapes"):
        other.load_state_dict(prediction.state_dict())


class _Recorder(pl.LightningModule):
    """Plain SGD on a linear map; records the weights at each batch's start and in its forward."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 1)
        self.automatic_optimization = not manual
        self.at_start: list[torch.Tensor] = []
        self.in_forward: list[torch.Tensor] = []

    def on_train_batch_start(self, batch, batch_idx):
        self.at_start.append(self.layer.weight.detach().clone())

    def training_step(self, batch, batch_idx):
        self.in_forward.append(self.layer.weight.detach().clone())
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x).squeeze(-1), y)
        if not self.automatic_optimization:
            self.manual_backward(loss)
            self.optimizers().step()
            self.optimizers().zero_grad()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(16, 3, generator=generator)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1)), batch_size=2)


def _fit(module: pl.LightningModule, strategy: MQGNNStrategy, **kwargs) -> None:
    make_trainer(strategy=strategy, **kwargs).fit(module)


@pytest.mark.parametrize("staleness", [1, 2])
def test_a_fit_computes_each_gradient_at_the_weights_it_is_applied_to(staleness):
    """Staleness s: the forward of step t runs at w_t + s (w_t - w_{t-1}), the optimiser updates w_t
    itself (the next batch starts from the update of w_t), and without prediction the forward runs at w_t."""
    predicted = _Recorder()
    _fit(predicted, MQGNNStrategy(staleness=staleness, predict_weights=True))
    starts, forwards = predicted.at_start, predicted.in_forward
    assert len(starts) == len(forwards) == 8
    assert torch.equal(forwards[0], starts[0])  # no update yet: nothing to predict from
    for t in range(1, 8):
        expected = starts[t] + staleness * (starts[t] - starts[t - 1])
        assert torch.equal(forwards[t], expected), t
    moved = [t for t in range(1, 8) if not torch.equal(starts[t], starts[t - 1])]
    assert moved == list(range(staleness + 1, 8))  # the queue filled for `staleness` steps, then updated

    plain = _Recorder()
    _fit(plain, MQGNNStrategy(staleness=staleness))
    assert all(torch.equal(f, s) for f, s in zip(plain.in_forward, plain.at_start))
    assert not torch.equal(plain.layer.weight, predicted.layer.weight)


def test_at_staleness_zero_there_is_nothing_to_predict():
    """A gradient is applied to the weights it was computed at: the fit equals one without prediction,
    manual optimisation included."""
    fitted = []
    for predict in (False, True):
        for manual in (False, True):
            module = _Recorder(manual=manual)
            _fit(module, MQGNNStrategy(staleness=0, predict_weights=predict))
            fitted.append(module.layer.weight.detach().clone())
    assert torch.equal(fitted[0], fitted[2]) and torch.equal(fitted[1], fitted[3])


def test_prediction_is_refused_where_it_cannot_apply():
    """Refused with one error naming the setting, before the process group starts."""
    with pytest.raises(ValueError, match="manual optimisation"):
        _fit(_Recorder(manual=True), MQGNNStrategy(staleness=1, predict_weights=True))
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="accumulate_grad_batches=2"):
        _fit(_Recorder(), MQGNNStrategy(staleness=1, predict_weights=True), accumulate_grad_batches=2)
    assert not dist.is_initialized()
