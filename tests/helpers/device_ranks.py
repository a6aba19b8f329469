"""Trains with the device-resident loader (device=cpu) on 2 CPU ranks and saves what each rank
saw: run by tests/pipeline/test_device_distributed.py as ``python device_ranks.py OUT_DIR
[thread|process]`` (where the device-resident loader samples: ``device_sampler``)."""

import multiprocessing
import os
import sys
import threading

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers.pipeline import make_trainer, seeded_module, small_dataset  # noqa: E402
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule  # noqa: E402
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader  # noqa: E402
from lightning_mqgnn.pipeline.plan import EpochPlan  # noqa: E402
from lightning_mqgnn.pipeline.sequential import SequentialLoader  # noqa: E402
from lightning_mqgnn.sampling.neighbor import NeighborSampler  # noqa: E402


class CompareWithSequential(pl.Callback):
    """Each batch against the one SequentialLoader makes for this rank's plan."""

    def __init__(self):
        self.seen: dict[int, list] = {}
        self.same: list[bool] = []
        self.expected: dict[int, list] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        epoch, dm = trainer.current_epoch, trainer.datamodule
        if epoch not in self.expected:
            plan = EpochPlan(epoch=epoch, rank=trainer.global_rank, world_size=trainer.world_size)
            self.expected[epoch] = list(SequentialLoader(dm.source, plan))
        ref = self.expected[epoch][batch_idx]
        self.same.append(
            isinstance(trainer.train_dataloader, DeviceResidentLoader)
            and torch.equal(ref.input_nodes, batch.input_nodes)
            and torch.equal(ref.aggregated, batch.aggregated)
            and all(torch.equal(a.weights, b.weights) for a, b in zip(ref.blocks, batch.blocks))
        )
        self.seen.setdefault(epoch, []).append(batch.output_nodes.clone())


def main(out_dir: str, device_sampler: str) -> None:
    torch.set_num_threads(1)
    ds = small_dataset(1200)
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, [5, 5]),
        LoaderSettings(
            batch_size=100, mode="device", seed=2, aggregate_inputs=True, device_sampler=device_sampler
        ),
    )
    check = CompareWithSequential()
    trainer = make_trainer([check], max_epochs=2, devices=2, strategy="ddp")
    trainer.fit(seeded_module(ds), dm)
    threads = [t.name for t in threading.enumerate() if t.name == "mqgnn-device-sampler" and t.is_alive()]
    torch.save(
        {
            "seen": check.seen,
            "same": check.same,
            "threads": threads,
            "processes": [p.name for p in multiprocessing.active_children()],
        },
        os.path.join(out_dir, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "thread")
