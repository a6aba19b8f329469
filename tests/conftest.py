"""Shared test set-up."""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.paths import SHARED_DATA
from helpers.processes import RANK_VARIABLES

# Test graphs are tiny: one intra-op thread avoids OpenMP spin-waits that make small ops 10x
# slower when the 2 cores are shared with worker or rank processes.
torch.set_num_threads(1)

# Named datasets come from the offline copy, never the network; recipes run as subprocesses
# inherit this. Tests of the registry's downloads unset it.
if SHARED_DATA.is_dir():
    os.environ.setdefault("MQGNN_DATA_MIRROR", str(SHARED_DATA))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def rank_variables_restored():
    """Put back the rank variables a test leaves in this process's environment: Lightning's
    launcher writes LOCAL_RANK, NODE_RANK, MASTER_PORT, ... into the environment of the process
    that launches ranks, and a later launch from that environment would take itself for a rank."""
    before = {name: os.environ.get(name) for name in RANK_VARIABLES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def one_rank_group_destroyed():
    """Destroy the process group a one-rank fit in this process leaves behind (Lightning keeps a
    gloo group until exit), so that the tests after it start without one."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
