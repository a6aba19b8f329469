"""``staleness="auto"``: what the gradient queue records of each step (the smallest staleness that
would have hidden its reduction), the strategy's decision from it, and a change of staleness that
neither loses nor doubles a gradient."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import pytest
import torch
from helpers.pipeline import make_trainer
from torch import nn

from lightning_mqgnn.strategy import MQGNNStrategy
from lightning_mqgnn.strategy.gradient_queue import GradientQueue


class _After:
    """A reduction that completes ``after`` polls, or ``sleep_s`` into its wait."""

    def __init__(self, after: int, sleep_s: float = 0.0) -> None:
        self.left, self.sleep_s = after, sleep_s

    def is_completed(self) -> bool:
        self.left -= 1
        return self.left < 0

    def wait(self) -> None:
        if self.left >= 0:
            time.sleep(self.sleep_s)


class _Scripted:
    """One rank; each launch completes as the next figure of ``script`` says."""

    world_size = 1

    def __init__(self, script: list[tuple[int, float]]) -> None:
        self.script = list(script)

    def launch(self, tensors):
        after, sleep_s = self.script.pop(0)
        return _After(after, sleep_s)


def _run(queue: GradientQueue, param: nn.Parameter, steps: int, step_s: float = 0.01) -> None:
    for _ in range(steps):
        param.grad = torch.ones_like(param)
        queue.push()
        if queue.ready():
            queue.apply_oldest()
        time.sleep(step_s)


def test_the_queue_records_when_each_reduction_was_seen_complete():
    param = nn.Parameter(torch.zeros(3))
    # at staleness 3: complete by the 1st, 2nd and 1st push after their own
    queue = GradientQueue([param], 3, _Scripted([(0, 0.0), (1, 0.0), (0, 0.0)] + [(0, 0.0)] * 3))
    _run(queue, param, 6)
    assert queue.needed_staleness() == [1, 2, 1]
    assert queue.needed_staleness() == []  # taken
    # at staleness 1: one reduction waited for (a second), one done just in time
    queue = GradientQueue([param], 1, _Scripted([(5, 1.0), (5, 0.0), (0, 0.0)]))
    _run(queue, param, 3)
    assert queue.needed_staleness() == [2, 1]


class _OneHot(pl.LightningModule):
    """Step t's gradient is the t-th unit vector, so the weights say which steps were applied."""

    def __init__(self, steps: int, schedule: dict[int, int]) -> None:
        super().__init__()
        self.layer = nn.Linear(steps, 1, bias=False)
        nn.init.zeros_(self.layer.weight)
        self.steps, self.schedule = steps, schedule
        self.order: list[int] = []  # which unit vector each step drew (the sampler shuffles)

    def training_step(self, batch, batch_idx):
        self.order.append(int(batch[0].argmax()))
        return self.layer(batch[0]).sum()

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx in self.schedule:
            self.trainer.strategy.set_staleness(self.schedule[batch_idx])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)

    def train_dataloader(self):
        data = torch.eye(self.steps)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=1)


@pytest.mark.usefixtures("one_rank_group_destroyed")
def test_a_change_of_staleness_neither_loses_nor_doubles_a_gradient():
    steps = 14
    model = _OneHot(steps, schedule={4: 3, 8: 1, 11: 2})  # up by two, down by two, up by one
    strategy = MQGNNStrategy(staleness="auto", max_staleness=3, sync_period=1000)
    make_trainer(strategy=strategy).fit(model)
    applied = -model.layer.weight.detach().reshape(-1)  # times each unit vector's gradient was applied
    stats = strategy.comm_stats
    in_step_order = applied[model.order].tolist()
    # every step's gradient once, but those still queued at the end (staleness 2 then): none twice
    assert in_step_order == [1.0] * (steps - 2) + [0.0, 0.0]
    assert stats.applied_steps == steps - 2 and stats.staleness == 2
    # the queue filled when the staleness rose (2 + 1 steps) and at the start (1)
    assert stats.skipped_steps == 1 + 2 + 1


def test_the_decision_takes_the_90th_percentile_within_the_bounds(monkeypatch):
    strategy = MQGNNStrategy(staleness="auto", max_staleness=3)
    assert strategy.staleness == 1 and strategy.adaptive

    class Figures:
        def __init__(self, needed):
            self.needed, self.staleness = needed, 1

        def needed_staleness(self):
            return self.needed

    monkeypatch.setattr(MQGNNStrategy, "root_device", torch.device("cpu"))
    monkeypatch.setattr(MQGNNStrategy, "reduce", lambda self, tensor, reduce_op="mean": tensor)
    for needed, chosen in [([1] * 9 + [5], 1), ([2] * 5 + [1] * 5, 2), ([7] * 10, 3), ([], 3), ([1, 1], 1)]:
        strategy._queues = {0: Figures(needed)}
        strategy.adapt_staleness()
        assert strategy.staleness == chosen, needed
    assert strategy.comm_stats.staleness_changes == 3


def test_checkpoints_carry_the_staleness_in_force():
    strategy = MQGNNStrategy(staleness="auto", max_staleness=4)
    strategy.set_staleness(3)
    state = strategy.state_dict()
    assert state["staleness"] == 3
    resumed = MQGNNStrategy(staleness="auto", max_staleness=4)
    resumed._load_state(state)
    assert resumed.staleness == 3 and resumed.comm_stats.staleness == 3
    fixed = MQGNNStrategy(staleness=1)
    fixed._load_state(state)
    assert fixed.staleness == 1  # a fixed staleness stays as given
    with pytest.raises(ValueError, match="max_staleness"):
        MQGNNStrategy(staleness="auto", max_staleness=0)
    with pytest.raises(ValueError, match="or 'auto'"):
        MQGNNStrategy(staleness="fast")
