"""The devices a sampler test runs on: the CPU always, CUDA under the ``gpu`` marker."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.sampling.residency import to_device

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def require_cuda() -> None:
    """Fail, not skip: a test under the ``gpu`` marker was asked for, so a missing device is an error."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu marker needs a CUDA device")


def on_device(sampler, device: str):
    """``sampler`` with its state on ``device`` (what the device-resident loader samples with)."""
    if device == "cuda":
        require_cuda()
    return to_device(sampler, device)
