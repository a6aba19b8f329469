"""Standalone multi-process run for the MQGNNStrategy tests (launched by tests/test_strategy_distributed.py).

A plain (non-GNN) LightningModule on synthetic regression data. Each rank writes ``<out>/rank<r>.pt``
with its final flattened parameters, losses, the strategy's counters and per-step cross-rank differences.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_mqgnn.strategy  # noqa: F401  (registers "mqgnn" / "mqgnn_spawn")
from lightning_mqgnn.strategy import CommStatsMonitor, MQGNNStrategy


class Regressor(pl.LightningModule):
    """Two-layer MLP (optionally with batch norm, whose running stats are rank-local) on MSE."""

    def __init__(
        self, batch_norm: bool = False, optimizer: str = "adam", lr: float = 0.01, manual: bool = False
    ):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(8, 32)]
        if batch_norm:
            layers.append(nn.BatchNorm1d(32))
        layers += [nn.Tanh(), nn.Linear(32, 1)]
        self.net = nn.Sequential(*layers)
        self.optimizer_name = optimizer
        self.lr = lr
        self.automatic_optimization = not manual
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def synthetic_data(n: int = 128, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def flat_state(module: nn.Module) -> torch.Tensor:
    """Parameters and float buffers as one vector (what must agree across ranks)."""
    tensors = [p.detach().reshape(-1) for p in module.parameters()]
    tensors += [b.detach().reshape(-1).float() for b in module.buffers() if b.is_floating_point()]
    return torch.cat(tensors)


def full_data_loss(model: Regressor, data: TensorDataset) -> float:
    x, y = data.tensors
    model.eval()
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(model.net(x).squeeze(-1), y))
    model.train()
    return loss


class CrossRankRecorder(pl.Callback):
    """After every step: max |rank_i - rank_0| over parameters and float buffers, and the sync count."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        gathered = trainer.strategy.all_gather(flat_state(pl_module))
        if gathered.dim() == 1:
            gathered = gathered.unsqueeze(0)
        diff = float((gathered - gathered[0]).abs().max())
        stats = getattr(trainer.strategy, "comm_stats", None)
        syncs = 0 if stats is None else stats.syncs
        self.records.append((trainer.global_step, syncs, diff))


SCENARIOS = {
    # name: (strategy spec, fit options)
    "ddp_sgd": ("ddp", dict(optimizer="sgd", epochs=4)),
    "s0_sgd": (dict(staleness=0), dict(optimizer="sgd", epochs=4)),
    "ddp_bn": ("ddp", dict(optimizer="sgd", epochs=2, batch_norm=True)),
    "s0_bn": (dict(staleness=0), dict(optimizer="sgd", epochs=2, batch_norm=True)),
    "s1_string": ("mqgnn", dict(optimizer="adam", epochs=10)),
    "sync_bn": (dict(staleness=1, sync_period=3), dict(optimizer="adam", epochs=3, batch_norm=True)),
    "accumulate": (dict(staleness=1, sync_period=4), dict(optimizer="adam", epochs=3, accumulate=2)),
    "resume_full": (dict(staleness=1, sync_period=3), dict(optimizer="adam", epochs=4, checkpoint=True)),
    "resume_half": (dict(staleness=1, sync_period=3), dict(optimizer="adam", epochs=4, resume="epoch=1")),
}


def run_scenario(name: str, strategy_spec, opts: dict, out_root: Path, devices: int, num_nodes: int) -> None:
    """One ``Trainer.fit`` in the already-running processes; writes ``out_root/name/rank<r>.pt``."""
    pl.seed_everything(0, workers=True)
    model = Regressor(
        opts.get("batch_norm", False), opts["optimizer"], opts.get("lr", 0.01), opts.get("manual", False)
    )
    strategy = MQGNNStrategy(**strategy_spec) if isinstance(strategy_spec, dict) else strategy_spec
    recorder = CrossRankRecorder()
    callbacks: list[pl.Callback] = [recorder, CommStatsMonitor()]
    ckpt_dir = out_root / "checkpoints"
    if opts.get("checkpoint"):
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_epochs=1, save_top_k=-1))
    resume = None
    if opts.get("resume"):
        resume = str(next(ckpt_dir.glob(f"{opts['resume']}-step=*.ckpt")))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        max_epochs=opts["epochs"],
        accumulate_grad_batches=opts.get("accumulate", 1),
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(opts.get("checkpoint")),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    data = synthetic_data()
    loader = DataLoader(data, batch_size=16, shuffle=False)
    init_loss = full_data_loss(model, data)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    stats = getattr(trainer.strategy, "comm_stats", None)
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "params": flat_state(model),
            "losses": model.losses,
            "init_loss": init_loss,
            "final_loss": full_data_loss(model, data),
            "records": recorder.records,
            "stats": None if stats is None else stats.as_dict(),
            "logged": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("comm/")},
            "sync_period": getattr(trainer.strategy, "sync_period", None),
            "strategy": type(trainer.strategy).__name__,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
        },
        out / f"rank{trainer.global_rank}.pt",
    )
    if trainer.world_size > 1:
        trainer.strategy.barrier()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated names, run in order"
    )
    parser.add_argument(
        "--strategy", default=None, help="override the strategy of every scenario (e.g. mqgnn_spawn)"
    )
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.scenarios.split(","):
        spec, opts = SCENARIOS[name]
        run_scenario(name, args.strategy or spec, opts, Path(args.out), args.devices, args.num_nodes)
        if os.environ.get("MQGNN_SCRIPT_VERBOSE"):
            print(f"scenario {name} done")


if __name__ == "__main__":
    main()
