"""Shared test set-up."""

import dataclasses
import functools
import http.server
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.paths import MIRROR, PLANETOID_FILES
from helpers.processes import RANK_VARIABLES

# Test graphs are tiny: one intra-op thread avoids OpenMP spin-waits that make small ops 10x
# slower when the 2 cores are shared with worker or rank processes.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``mirror`` read the real datasets of ``MQGNN_DATA_MIRROR``: where it is not set
    (a fresh clone) they are deselected, not skipped; ``-m mirror`` runs them where it is."""
    if MIRROR is not None:
        return
    mirror = [item for item in items if item.get_closest_marker("mirror")]
    if mirror:
        config.hook.pytest_deselected(items=mirror)
        items[:] = [item for item in items if not item.get_closest_marker("mirror")]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def served_data_root(tmp_path_factory) -> Path:
    """A data root in which the registry has made cora as on a fresh machine: its published
    Planetoid files (tests/fixtures/planetoid) served by a local HTTP server, downloaded by the
    registry, checked against their sha256 and converted to ``cora.npz``, no mirror read."""
    from lightning_mqgnn.graph import registry

    root = tmp_path_factory.mktemp("data_root")
    handler = functools.partial(_QuietHandler, directory=str(PLANETOID_FILES))
    with (
        http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server,
        pytest.MonkeyPatch.context() as mp,
    ):
        threading.Thread(target=server.serve_forever, daemon=True).start()
        local = dataclasses.replace(
            registry.DATASETS["cora"], base_url=f"http://127.0.0.1:{server.server_port}"
        )
        mp.setitem(registry.DATASETS, "cora", local)
        mp.setenv(registry.DATA_ROOT_ENV, str(root))
        mp.delenv(registry.MIRROR_ENV, raising=False)
        try:
            registry.dataset_file("cora")
        finally:
            server.shutdown()
    return root


@pytest.fixture
def served_data(served_data_root, monkeypatch) -> Path:
    """``served_data_root`` as the data root of this test and of the recipes it starts, no mirror:
    ``data=cora`` loads without a network."""
    from lightning_mqgnn.graph import registry

    monkeypatch.setenv(registry.DATA_ROOT_ENV, str(served_data_root))
    monkeypatch.delenv(registry.MIRROR_ENV, raising=False)
    return served_data_root


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
