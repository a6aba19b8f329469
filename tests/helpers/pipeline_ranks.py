"""Trains with the pipeline on 2 CPU ranks and saves each rank's seeds: run by
tests/test_pipeline_distributed.py as ``python pipeline_ranks.py OUT_DIR STRATEGY``."""

import os
import sys

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers.pipeline import make_trainer, seeded_module, small_dataset, worker_pipeline  # noqa: E402


class SaveSeeds(pl.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.seen: dict[int, list] = {}
        self.pids: set[int] = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.setdefault(trainer.current_epoch, []).append(batch.output_nodes.clone())
        self.pids.update(trainer.datamodule.pipeline_loader.worker_pids())

    def on_fit_end(self, trainer, pl_module):
        torch.save(
            {"seen": self.seen, "pids": sorted(self.pids), "rank_pid": os.getpid()},
            os.path.join(self.out_dir, f"rank{trainer.global_rank}.pt"),
        )


def main(out_dir: str, strategy: str) -> None:
    torch.set_num_threads(1)
    ds = small_dataset(1200)
    dm = worker_pipeline(
        ds,
        batch_size=100,
        num_workers=1,
        seed=2,
    )
    trainer = make_trainer([SaveSeeds(out_dir)], max_epochs=2, devices=2, strategy=strategy)
    trainer.fit(seeded_module(ds), dm)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
