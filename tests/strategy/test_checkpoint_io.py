"""AtomicCheckpointIO: a checkpoint is written whole or not at all (a full disk, simulated with
RLIMIT_FSIZE, keeps the earlier file), and an unreadable one is refused in one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers.paths import REPO
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_mqgnn.callbacks import LastCheckpoint
from lightning_mqgnn.strategy import AtomicCheckpointIO, CheckpointError, MQGNNStrategy

# in a child process: the file-size limit is per process, and the test runner must not inherit it
FILL_DISK = """
import json, resource, sys, torch
from lightning_mqgnn.strategy import AtomicCheckpointIO, CheckpointError
path, limit = sys.argv[1], int(sys.argv[2])
io = AtomicCheckpointIO()
io.save_checkpoint({"w": torch.arange(1000.0)}, path)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
errors = []
for target in (path, path + ".new"):  # over the earlier checkpoint, and where none was
    try:
        io.save_checkpoint({"w": torch.arange(200_000.0)}, target)
        errors.append(None)
    except CheckpointError as err:
        errors.append(str(err))
print(json.dumps(errors))
"""


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_round_trip_leaves_only_the_checkpoint(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "sub" / "a.ckpt"
    io.save_checkpoint({"w": torch.arange(5.0), "step": 3}, path)
    io.save_checkpoint({"w": torch.arange(6.0), "step": 4}, path)  # over an existing file
    loaded = io.load_checkpoint(path)
    assert loaded["step"] == 4 and torch.equal(loaded["w"], torch.arange(6.0))
    assert _files(path.parent) == ["a.ckpt"]  # no partial file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open would have made it


def test_a_full_disk_keeps_the_earlier_checkpoint_and_says_so(tmp_path):
    path = tmp_path / "last.ckpt"
    proc = subprocess.run(
        [sys.executable, "-c", FILL_DISK, str(path), str(64 * 1024)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    over, fresh = json.loads(proc.stdout.strip().splitlines()[-1])
    assert over is not None and "\n" not in over
    assert f"checkpoint {path}: writing it failed (" in over and over.endswith(
        "the earlier last.ckpt is intact"
    )
    assert fresh is not None and fresh.endswith("no earlier checkpoint is there")
    assert torch.equal(AtomicCheckpointIO().load_checkpoint(path)["w"], torch.arange(1000.0))
    assert _files(tmp_path) == ["last.ckpt"]  # neither partial file left behind


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_an_unreadable_checkpoint_is_refused_in_one_line(tmp_path, damage):
    io = AtomicCheckpointIO()
    path = tmp_path / "a.ckpt"
    io.save_checkpoint({"w": torch.arange(10_000.0)}, path)
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    with pytest.raises(CheckpointError) as info:
        io.load_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"checkpoint {path}: truncated or corrupt (") and "\n" not in message
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")


class _Foreign:
    pass


def test_a_whole_checkpoint_that_weights_only_refuses_is_called_unreadable(tmp_path):
    path = tmp_path / "a.ckpt"
    torch.save({"obj": _Foreign()}, path)  # a whole archive holding an object weights_only refuses
    with pytest.raises(
        CheckpointError, match=r"a\.ckpt: unreadable \(UnpicklingError: Weights only load failed"
    ):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=True)


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_writes_through_it_and_refuses_a_damaged_resume(tmp_path):
    assert isinstance(MQGNNStrategy().checkpoint_io, AtomicCheckpointIO)  # the strategy's default
    data = TensorDataset(torch.randn(32, 4), torch.randn(32))

    def trainer():
        return pl.Trainer(
            accelerator="cpu",
            max_epochs=2,
            plugins=[AtomicCheckpointIO()],
            callbacks=[LastCheckpoint(tmp_path, every_s=0)],  # through the IO, no rename of its own
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    trainer().fit(_Tiny(), DataLoader(data, batch_size=8))
    path = tmp_path / "last.ckpt"
    assert _files(tmp_path) == ["last.ckpt"]
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"checkpoint {path}: truncated or corrupt"):
        trainer().fit(_Tiny(), DataLoader(data, batch_size=8), ckpt_path=path)
