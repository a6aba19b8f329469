"""Shared test set-up."""

from pathlib import Path

import pytest
import torch
from helpers.paths import SHARED_DATA

# Test graphs are tiny: one intra-op thread avoids OpenMP spin-waits that make small ops 10x
# slower when the 2 cores are shared with worker or rank processes.
torch.set_num_threads(1)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATA}")
    return SHARED_DATA
