"""Without DGL (the default environment) the DGL entry points fail with an actionable message."""

from __future__ import annotations

import sys

import pytest
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.dgl_graph import from_dgl, load_dgl_builtin, to_dgl
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.dgl_blocks import to_dgl_blocks


@pytest.fixture
def no_dgl(monkeypatch):
    monkeypatch.setitem(sys.modules, "dgl", None)  # `import dgl` now raises ImportError


def test_entry_points_name_the_dgl_extra_when_dgl_is_missing(no_dgl):
    block = Block(1, 2, torch.tensor([0, 1]), torch.tensor([1]), torch.ones(1))
    batch = MiniBatch(input_nodes=torch.tensor([3, 4]), output_nodes=torch.tensor([3]), blocks=[block])
    for call in (
        lambda: to_dgl_blocks(batch),
        lambda: from_dgl(object()),
        lambda: load_dgl_builtin("reddit"),
    ):
        with pytest.raises(ImportError, match=r"Install the `dgl` extra .*\.ci/dgl_env\.sh"):
            call()
    graph = CSRGraph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    ds = GraphDataset(
        "tiny", graph, torch.ones(3, 2), torch.tensor([0, 1, 0]), *torch.arange(3).split(1), num_classes=2
    )
    with pytest.raises(ImportError, match=r"`dgl` extra"):
        to_dgl(ds)


def test_unknown_builtin_name_is_rejected_before_importing_dgl(no_dgl):
    with pytest.raises(ValueError, match=r"unknown DGL dataset name 'redit'; expected one of \['citeseer'"):
        load_dgl_builtin("redit")
