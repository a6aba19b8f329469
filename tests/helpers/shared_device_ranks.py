"""Two ranks on one device through Lightning (``num_nodes=2``, ``devices=1``, gloo), each with its
own device-resident loader, device queue and gradient queue: what ``trainer.devices=N`` does on N
GPUs, on one. Run by tests/pipeline/test_shared_device_ranks.py on two torchrun "nodes" as
``python shared_device_ranks.py OUT_DIR cpu|cuda STALENESS``; each rank saves what it saw."""

import os
import sys

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers.pipeline import make_trainer, seeded_module, small_dataset  # noqa: E402
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule  # noqa: E402
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader  # noqa: E402
from lightning_mqgnn.sampling.neighbor import NeighborSampler  # noqa: E402
from lightning_mqgnn.strategy import MQGNNStrategy  # noqa: E402

EPOCHS = 2


class Record(pl.Callback):
    def __init__(self):
        self.seen: dict[int, list] = {}
        self.devices: set[str] = set()
        self.queue_sizes: set[int] = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.setdefault(trainer.current_epoch, []).append(batch.output_nodes.cpu().clone())
        self.devices.add(str(batch.output_nodes.device))
        self.queue_sizes.add(int(batch.meta["queue_size"]))


def main(out_dir: str, device: str, staleness: str) -> None:
    torch.set_num_threads(1)
    ds = small_dataset(1200)
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, [5, 5]),
        LoaderSettings(batch_size=100, mode="device", seed=2, sample_on=device),
    )
    record = Record()
    # sync_period=1: the ranks hold the same weights after every step at staleness 1 too; weight
    # prediction as the recipe's strategy=mqgnn runs it (on the device's parameters)
    strategy = MQGNNStrategy(
        staleness=int(staleness), sync_period=1, process_group_backend="gloo", predict_weights=True
    )
    trainer = make_trainer(
        [record], max_epochs=EPOCHS, accelerator=device, devices=1, num_nodes=2, strategy=strategy
    )
    module = seeded_module(ds)
    trainer.fit(module, dm)
    torch.save(
        {
            "seen": record.seen,
            "devices": sorted(record.devices),
            "queue_sizes": sorted(record.queue_sizes),
            "loader": type(trainer.train_dataloader).__name__,
            "device_loader": isinstance(trainer.train_dataloader, DeviceResidentLoader),
            "stats": strategy.comm_stats.as_dict(),
            "params": torch.cat([p.detach().cpu().reshape(-1) for p in module.parameters()]),
            "world_size": trainer.world_size,
        },
        os.path.join(out_dir, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
