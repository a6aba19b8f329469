"""A 2-rank CPU fit under ``Trainer(strategy="mqgnn")`` of a small linear regression, run by
.ci/wheel_smoke.sh with the installed wheel: the strategy is registered by ``import
lightning_mqgnn``, both ranks train, the loss falls and the ranks end with the same weights.

Lightning's subprocess launcher starts rank 1 by running this file again; rank 0 prints one
``WHEEL FIT`` line and exits non-zero if a check fails.
"""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

import lightning_mqgnn


class LinearFit(pl.LightningModule):
    """y = x @ w + noise, fitted by one linear layer under Adam."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.layer = nn.Linear(features, 1)

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def regression_data(n: int = 256, features: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    w = torch.randn(features, generator=generator)
    return TensorDataset(x, x @ w + 0.01 * torch.randn(n, generator=generator))


def loss_on(model: LinearFit, data: TensorDataset) -> float:
    x, y = data.tensors
    with torch.no_grad():
        return float(nn.functional.mse_loss(model.layer(x).squeeze(-1), y))


def main() -> int:
    pl.seed_everything(0, workers=True)
    data = regression_data()
    model = LinearFit(features=data.tensors[0].shape[1])
    before = loss_on(model, data)
    trainer = pl.Trainer(
        strategy="mqgnn",
        accelerator="cpu",
        devices=2,
        max_epochs=10,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=16, shuffle=False))
    after = loss_on(model, data)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = trainer.strategy.all_gather(weights)
    same = bool(all(torch.equal(gathered[0], w) for w in gathered))
    strategy = type(trainer.strategy).__name__
    ok = strategy == "MQGNNStrategy" and trainer.world_size == 2 and same and after < 0.1 * before
    if trainer.global_rank == 0:
        print(
            f"WHEEL FIT lightning_mqgnn={lightning_mqgnn.__version__} strategy={strategy} "
            f"world_size={trainer.world_size} steps={trainer.global_step} loss={before:.4f}->{after:.4f} "
            f"ranks_agree={same} {'ok' if ok else 'FAILED'}",
            flush=True,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
