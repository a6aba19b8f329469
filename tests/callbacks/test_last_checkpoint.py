"""The epoch-end checkpoint a fit resumes from: when it is written, that it is written whole, and
that resuming from it restores the random generators and the batch timer, for fits only."""

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_mqgnn.callbacks import BatchTimer, LastCheckpoint

BATCHES_PER_EPOCH = 4


class DropoutRegressor(pl.LightningModule):
    """A step that draws from torch's global generator (dropout), so a resumed fit trains like an
    uninterrupted one only if the generator's state comes back with the weights."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.5), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES_PER_EPOCH * 8, 3, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def fit(root, epochs, callbacks, ckpt_path=None, model=None, max_steps=-1):
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        max_steps=max_steps,
        callbacks=callbacks,
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = model or DropoutRegressor()
    trainer.fit(model, train_dataloaders=loader(), ckpt_path=ckpt_path)
    return trainer, model


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_a_fit_resumed_from_it_trains_as_one_that_ran_through(tmp_path):
    torch.manual_seed(0)
    _, through = fit(tmp_path / "a", 4, [LastCheckpoint(tmp_path / "a", every_s=0)])
    torch.manual_seed(0)
    fit(tmp_path / "b", 2, [LastCheckpoint(tmp_path / "b", every_s=0)])
    torch.manual_seed(123)  # whatever the process drew since: the checkpoint's state wins
    _, resumed = fit(
        tmp_path / "b", 4, [LastCheckpoint(tmp_path / "b", every_s=0)], tmp_path / "b" / "last.ckpt"
    )
    for a, b in zip(params(through), params(resumed)):
        assert torch.equal(a, b)


def test_without_the_generators_state_a_resumed_fit_differs(tmp_path):
    """The check above can fail: resuming from weights and optimiser alone draws other masks."""
    torch.manual_seed(0)
    _, through = fit(tmp_path / "a", 4, [LastCheckpoint(tmp_path / "a", every_s=0)])
    torch.manual_seed(0)
    fit(tmp_path / "b", 2, [LastCheckpoint(tmp_path / "b", every_s=0)])
    checkpoint = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    del checkpoint["callbacks"]["LastCheckpoint"]
    torch.save(checkpoint, tmp_path / "b" / "weights_only.ckpt")
    torch.manual_seed(123)
    _, resumed = fit(tmp_path / "c", 4, [], tmp_path / "b" / "weights_only.ckpt")
    assert not all(torch.equal(a, b) for a, b in zip(params(through), params(resumed)))


def test_written_at_epoch_ends_once_every_s_has_passed(tmp_path, monkeypatch):
    steps = []
    monkeypatch.setattr(LastCheckpoint, "save", lambda self, trainer: steps.append(trainer.global_step))
    fit(tmp_path, 3, [LastCheckpoint(tmp_path, every_s=0)])
    assert steps == [BATCHES_PER_EPOCH * e for e in (1, 2, 3)]
    steps.clear()
    fit(tmp_path, 3, [LastCheckpoint(tmp_path, every_s=3600)])
    assert steps == []


def test_rank_zeros_decision_is_every_ranks(tmp_path, monkeypatch):
    """Saving is collective: a rank whose own clock says "due" still follows rank 0's "not yet"."""
    written = []
    monkeypatch.setattr(LastCheckpoint, "save", lambda self, trainer: written.append(trainer.global_step))
    monkeypatch.setattr(pl.strategies.SingleDeviceStrategy, "broadcast", lambda self, obj, src=0: False)
    fit(tmp_path, 2, [LastCheckpoint(tmp_path, every_s=0)])
    assert written == []


def test_an_interrupted_write_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    fit(tmp_path, 1, [LastCheckpoint(tmp_path, every_s=0)])
    before = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert before["global_step"] == BATCHES_PER_EPOCH

    def dies_while_writing(trainer, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"half a checkpo")
        raise OSError("No space left on device")

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", dies_while_writing)
    with pytest.raises(OSError, match="No space"):
        fit(tmp_path, 3, [LastCheckpoint(tmp_path, every_s=0)], tmp_path / "last.ckpt")
    after = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert after["global_step"] == BATCHES_PER_EPOCH


def test_only_a_fit_restores_the_generators_and_the_batch_timer(tmp_path):
    timer = BatchTimer(trim=0)
    fit(tmp_path / "a", 2, [timer, LastCheckpoint(tmp_path / "a", every_s=0)])
    assert timer.summary()["batches"] == 2 * BATCHES_PER_EPOCH

    resumed_timer = BatchTimer(trim=0)
    trainer, model = fit(
        tmp_path / "a",
        3,
        [resumed_timer, LastCheckpoint(tmp_path / "a", every_s=0)],
        tmp_path / "a" / "last.ckpt",
    )
    whole_run = resumed_timer.summary()
    assert whole_run["batches"] == 3 * BATCHES_PER_EPOCH  # the two epochs before the checkpoint count
    assert whole_run["train_time_s"] > 0

    # test(ckpt_path=...) restores callbacks too, from a checkpoint older than the fit: neither the
    # timer nor the generators may go back to it
    older = tmp_path / "older.ckpt"
    fit(tmp_path / "b", 1, [LastCheckpoint(tmp_path / "b", every_s=0)])
    (tmp_path / "b" / "last.ckpt").rename(older)
    drawn = []
    for ckpt_path in (None, older):
        torch.manual_seed(7)
        trainer.test(model, dataloaders=loader(), ckpt_path=ckpt_path, verbose=False)
        drawn.append(torch.rand(3))  # the same draws after both: no state was restored
    assert torch.equal(*drawn)
    assert resumed_timer.summary()["batches"] == 3 * BATCHES_PER_EPOCH


def test_negative_interval_is_refused(tmp_path):
    with pytest.raises(ValueError, match="every_s"):
        LastCheckpoint(tmp_path, every_s=-1)


def test_a_step_bounded_fit_writes_nothing(tmp_path):
    """Lightning resumes a step-bounded fit's epoch-end checkpoint one batch off: none is written."""
    with pytest.warns(UserWarning, match="writes nothing in a fit bounded by max_steps=100"):
        fit(tmp_path, 3, [LastCheckpoint(tmp_path, every_s=0)], max_steps=100)
    assert not (tmp_path / "last.ckpt").exists()
