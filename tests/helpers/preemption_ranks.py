"""A 2-rank CPU fit for the preemption tests: ``python preemption_ranks.py OUT_DIR CASE PHASE``.
``through``: the fit that is never stopped; ``stop``: rank 1 alone receives SIGTERM at step
``SIGNAL_STEP``; ``resume``: the fit resumed from the ``last.ckpt`` that ``stop`` wrote. Each rank
saves its state (``{phase}_rank{r}.pt``) where its fit ends."""

import os
import signal
import sys

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers.pipeline import make_trainer, seeded_module, small_dataset  # noqa: E402
from lightning_mqgnn.callbacks import LastCheckpoint, Preempted  # noqa: E402
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule  # noqa: E402
from lightning_mqgnn.sampling.neighbor import NeighborSampler  # noqa: E402
from lightning_mqgnn.strategy import MQGNNStrategy  # noqa: E402

EPOCHS = 3
SIGNAL_STEP = 7  # epoch 1 (5 batches an epoch on each rank), inside it
CASES = {  # strategy, loader mode
    "ddp-sequential": (lambda: "ddp", "sequential"),
    "mqgnn0-device": (lambda: MQGNNStrategy(staleness=0), "device"),
    "mqgnn1-pipeline": (lambda: MQGNNStrategy(staleness=1), "pipeline"),
    "mqgnn1sync3-sequential": (lambda: MQGNNStrategy(staleness=1, sync_period=3), "sequential"),
}


class SignalRankOne(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == SIGNAL_STEP:
            os.kill(os.getpid(), signal.SIGTERM)


class SaveState(pl.Callback):
    def __init__(self, path_of_rank):
        self.path_of_rank = path_of_rank

    def on_fit_end(self, trainer, pl_module):
        state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        torch.save({"state": state, "step": trainer.global_step}, self.path_of_rank(trainer.global_rank))


def main(out_dir: str, case: str, phase: str) -> None:
    torch.set_num_threads(1)
    strategy, mode = CASES[case]
    ds = small_dataset(1200)
    kw = {"num_workers": 1, "producer": "workers"} if mode == "pipeline" else {}
    dm = MQGNNDataModule(
        ds, NeighborSampler(ds.graph, [4, 4]), LoaderSettings(batch_size=64, mode=mode, seed=2, **kw)
    )
    root = os.path.join(out_dir, "through" if phase == "through" else "run")
    callbacks = [
        LastCheckpoint(root, every_s=0),
        SaveState(lambda r: os.path.join(out_dir, f"{phase}_rank{r}.pt")),
    ]
    if phase == "stop":
        callbacks.append(SignalRankOne())
    trainer = make_trainer(
        callbacks, max_epochs=EPOCHS, devices=2, strategy=strategy(), enable_checkpointing=True
    )
    ckpt = os.path.join(root, "last.ckpt") if phase == "resume" else None
    try:
        trainer.fit(seeded_module(ds), dm, ckpt_path=ckpt)
    except Preempted as stopped:
        with open(os.path.join(out_dir, f"stopped_rank{trainer.global_rank}.txt"), "w") as f:
            f.write(f"{trainer.global_step} {stopped}")
        raise


if __name__ == "__main__":
    main(*sys.argv[1:4])
