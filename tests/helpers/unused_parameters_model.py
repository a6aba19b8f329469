"""Lightning's ``UnusedParametersModel`` (``tests_pytorch/strategies/test_ddp_integration.py``) in our
words: a layer applied under ``no_grad`` before the loss, so its parameters never get a gradient.
Importable, so that a spawned rank can unpickle it."""

import torch
from lightning.pytorch.demos.boring_classes import BoringModel


class NoGradLayerModel(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.before = torch.nn.Linear(32, 32)

    def training_step(self, batch, batch_idx):
        with torch.no_grad():
            batch = self.before(batch)
        return super().training_step(batch, batch_idx)
