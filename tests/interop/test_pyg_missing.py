"""Without PyTorch Geometric the library loads, the PyG modules load, the tensor-only parts work,
and the parts that need PyG fail naming the `pyg` extra."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lightning_mqgnn.graph.pyg import from_pyg, load_pyg_dataset, to_pyg_data
from lightning_mqgnn.models.pyg import gat_stack, gcn_stack, sage_stack
from lightning_mqgnn.sampling.batch import Block, MiniBatch
from lightning_mqgnn.sampling.pyg_blocks import to_pyg as batch_to_pyg


@pytest.fixture
def no_pyg(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric", None)  # `import torch_geometric` now raises


def test_the_library_never_imports_pyg_unasked():
    code = (
        "import sys; sys.modules['torch_geometric'] = None\n"
        "import lightning_mqgnn, lightning_mqgnn.data, lightning_mqgnn.models, lightning_mqgnn.graph\n"
        "import lightning_mqgnn.graph.pyg, lightning_mqgnn.models.pyg, lightning_mqgnn.sampling.pyg_blocks\n"
        "print('loaded')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-2000:]


def test_tensor_only_parts_work_without_pyg(no_pyg):
    block = Block(1, 2, torch.tensor([0, 1]), torch.tensor([1]), torch.ones(1))
    batch = MiniBatch(input_nodes=torch.tensor([3, 4]), output_nodes=torch.tensor([3]), blocks=[block])
    exported = batch_to_pyg(batch)
    assert exported.blocks[0].edge_index.tolist() == [[1], [0]] and exported.blocks[0].size == (2, 1)
    data = SimpleNamespace(
        x=torch.ones(3, 2),
        edge_index=torch.tensor([[0, 1], [1, 2]]),
        y=torch.tensor([0, 1, 0]),
        train_idx=torch.tensor([0]),
        val_idx=torch.tensor([1]),
        test_idx=torch.tensor([2]),
    )
    assert from_pyg(data).graph.num_edges == 2


def test_entry_points_name_the_pyg_extra(no_pyg, tmp_path):
    for call in (
        lambda: load_pyg_dataset("torch_geometric.datasets.Planetoid", tmp_path),
        lambda: gat_stack(4, 2),
        lambda: sage_stack(4, 2),
        lambda: gcn_stack(4, 2),
    ):
        with pytest.raises(ImportError, match=r"install the `pyg` extra: pip install lightning_mqgnn\[pyg\]"):
            call()
    with pytest.raises(ImportError, match=r"`pyg` extra"):
        to_pyg_data(object())
