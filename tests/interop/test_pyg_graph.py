"""PyG input: a torch_geometric Data becomes the same validated GraphDataset as our loaders build,
with the same errors for the same faults, and PyG datasets fail with one line when offline."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from helpers.graphs import write_npz
from hydra.utils import instantiate
from omegaconf import OmegaConf

pyg_data = pytest.importorskip("torch_geometric.data")

from helpers.paths import CONF  # noqa: E402

from lightning_mqgnn.graph.csr import CSRGraph  # noqa: E402
from lightning_mqgnn.graph.dataset import GraphDataset  # noqa: E402
from lightning_mqgnn.graph.npz import load_npz  # noqa: E402
from lightning_mqgnn.graph.pyg import from_pyg, import_pyg, load_pyg_dataset, to_pyg_data  # noqa: E402

Data = pyg_data.Data
CONF = CONF / "data"


def data_from_npz(path: Path, *, masks: bool = True, one_direction: bool = False) -> Data:
    """A PyG Data built from the raw npz arrays, independently of our loaders."""
    with np.load(path) as f:
        a = {k: f[k] for k in f.files}
    n = a["indptr"].size - 1
    adj = sp.csr_matrix((np.ones(a["indices"].size), a["indices"], a["indptr"]), shape=(n, n)).tocoo()
    dst, src = adj.row, adj.col  # row v lists the in-neighbours u of v: edge u -> v
    if one_direction:
        keep = src < dst
        src, dst = src[keep], dst[keep]
    x = sp.csr_matrix((a["x_data"], a["x_indices"], a["x_indptr"]), shape=tuple(a["x_shape"])).toarray()
    fields = {
        "x": torch.from_numpy(x.astype(np.float32)),
        "edge_index": torch.from_numpy(np.stack([src, dst]).astype(np.int64)),
        "y": torch.from_numpy(a["y"]),
    }
    for s in ("train", "val", "test"):
        idx = torch.from_numpy(a[f"{s}_idx"])
        if masks:
            mask = torch.zeros(n, dtype=torch.bool)
            mask[idx] = True
            fields[f"{s}_mask"] = mask
        else:
            fields[f"{s}_idx"] = idx
    return Data(**fields)


def assert_same_dataset(a: GraphDataset, b: GraphDataset) -> None:
    assert (a.num_nodes, a.num_classes, a.metric) == (b.num_nodes, b.num_classes, b.metric)
    assert torch.equal(a.graph.indptr, b.graph.indptr)
    assert torch.equal(a.graph.indices, b.graph.indices)
    assert torch.equal(a.features, b.features)
    assert torch.equal(a.labels, b.labels)
    for field in ("train_idx", "val_idx", "test_idx"):
        assert torch.equal(torch.sort(getattr(a, field)).values, torch.sort(getattr(b, field)).values), field


@pytest.fixture
def npz_files(tmp_path, served_data_root) -> list[Path]:
    """A small ring and cora (converted from its committed files)."""
    return [write_npz(tmp_path / "ring.npz"), served_data_root / "cora.npz"]


@pytest.mark.parametrize("masks", [True, False])
def test_data_from_an_npz_file_equals_our_npz_loader(npz_files, masks):
    for path in npz_files:
        ours = load_npz(path, normalize_features=False)
        theirs = from_pyg(data_from_npz(path, masks=masks), name=ours.name)
        assert_same_dataset(theirs, ours)


def test_directed_data_stays_directed_unless_asked(npz_files):
    for path in npz_files:
        data = data_from_npz(path, one_direction=True)
        directed = from_pyg(data)
        assert not directed.graph.is_symmetric()
        src, dst = data.edge_index
        expected = CSRGraph.from_edges(src, dst, data.num_nodes)
        assert torch.equal(directed.graph.indptr, expected.indptr)
        assert torch.equal(directed.graph.indices, expected.indices)
        # node v aggregates its in-neighbours: the row of dst lists src
        v, u = int(dst[0]), int(src[0])
        assert u in directed.graph.indices[directed.graph.indptr[v] : directed.graph.indptr[v + 1]]
        undirected = from_pyg(data, make_undirected=True)
        assert_same_dataset(undirected, load_npz(path, normalize_features=False))


def test_self_loops_and_duplicate_edges_are_dropped():
    x = torch.randn(4, 3)
    edge_index = torch.tensor([[0, 0, 1, 2, 3, 3], [1, 1, 2, 2, 0, 1]])
    data = Data(x=x, edge_index=edge_index, y=torch.tensor([0, 1, 0, 1]))
    ds = from_pyg(
        data, splits={"train": torch.tensor([0, 1]), "val": torch.tensor([2]), "test": torch.tensor([3])}
    )
    assert ds.graph.num_edges == 4  # 0->1 once, 1->2, 3->0, 3->1; 2->2 dropped
    assert ds.graph.indptr.tolist() == [0, 1, 3, 4, 4]
    assert ds.graph.indices.tolist() == [3, 0, 3, 1]


def test_splits_argument_multilabel_and_column_labels():
    n = 6
    data = Data(
        x=torch.ones(n, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.arange(n).reshape(n, 1) % 3
    )
    splits = {"train": torch.tensor([0, 1, 2]), "val": torch.tensor([3]), "test": torch.tensor([4, 5])}
    ds = from_pyg(data, splits=splits)
    assert ds.labels.dtype == torch.int64 and ds.labels.shape == (n,) and ds.num_classes == 3
    data.y = (torch.arange(2 * n).reshape(n, 2) % 2).to(torch.float32)
    multi = from_pyg(data, splits=splits, metric="rocauc")
    assert multi.multilabel and multi.num_classes == 2


def test_to_pyg_data_round_trip(tmp_path):
    ds = load_npz(write_npz(tmp_path / "ring.npz"))
    data = to_pyg_data(ds)
    assert data.edge_index.shape == (2, ds.graph.num_edges)
    assert_same_dataset(from_pyg(data, name=ds.name), ds)


def _valid() -> dict:
    n = 10
    return {
        "x": torch.ones(n, 3),
        "edge_index": torch.stack([torch.arange(n), (torch.arange(n) + 1) % n]),
        "y": torch.arange(n) % 3,
        "train_mask": torch.arange(n) < 5,
        "val_mask": (torch.arange(n) >= 5) & (torch.arange(n) < 7),
        "test_mask": torch.arange(n) >= 7,
    }


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            {"edge_index": torch.tensor([[0, 1], [1, 10]])},
            "field 'edge_index' has node id 10 outside [0, 10) (edge 1, row 1)",
        ),
        (
            {"edge_index": torch.tensor([[0, -1], [1, 2]])},
            "field 'edge_index' has node id -1 outside [0, 10)",
        ),
        ({"edge_index": torch.tensor([[0.0, 1.0], [1.0, 2.0]])}, "field 'edge_index' must hold integers"),
        (
            {"edge_index": torch.zeros(3, 4, dtype=torch.int64)},
            "field 'edge_index' has shape (3, 4), expected [2, E]",
        ),
        ({"y": None}, "field 'y' is missing"),
        ({"x": None}, "field 'x' is missing"),
        ({"x": torch.ones(10)}, "field 'x' has shape (10,), expected [N, F]"),
        ({"train_mask": None}, "field 'train_mask' (or 'train_idx') is missing"),
        (
            {"train_mask": torch.ones(10, 2, dtype=torch.bool)},
            "field 'train_mask' has shape (10, 2), expected 1-D",
        ),
        ({"val_mask": torch.ones(9, dtype=torch.bool)}, "field 'val_mask' has 9 entries, expected 10"),
        ({"test_mask": torch.full((10,), 2)}, "field 'test_mask' is not a 0/1 mask: has value 2"),
        ({"x": torch.ones(10, 3, dtype=torch.complex64)}, "field 'features' must be float32"),
        ({"y": torch.arange(10, dtype=torch.float32)}, "field 'labels' (single-label) must be int64"),
    ],
)
def test_bad_data_is_named(change, fragment):
    fields = _valid()
    fields.update(change)
    data = Data(**{k: v for k, v in fields.items() if v is not None})
    with pytest.raises(ValueError) as err:
        from_pyg(data, name="bad")
    assert str(err.value).startswith("bad (torch_geometric Data): ")
    assert fragment in str(err.value)


def _message(err: pytest.ExceptionInfo) -> str:
    """The message after the ``name (source): `` prefix."""
    return str(err.value).split("): ", 1)[1]


@pytest.mark.parametrize(
    ("npz_change", "data_change"),
    [
        ({"x_data": np.array([np.nan] + [1.0] * 19, dtype=np.float32)}, {"x": "nan"}),
        ({"y": np.array([-1] + [1] * 9, dtype=np.int64)}, {"y": torch.tensor([-1] + [1] * 9)}),
        ({"val_idx": np.array([4, 5], dtype=np.int64)}, {"val_idx": torch.tensor([4, 5])}),
        ({"test_idx": np.array([7, 7], dtype=np.int64)}, {"test_idx": torch.tensor([7, 7])}),
        ({"test_idx": np.array([7, 12], dtype=np.int64)}, {"test_idx": torch.tensor([7, 12])}),
        ({"test_idx": np.array([], dtype=np.int64)}, {"test_idx": torch.tensor([], dtype=torch.int64)}),
    ],
)
def test_same_fault_same_error_as_the_npz_loader(tmp_path, npz_change, data_change):
    path = write_npz(tmp_path / "bad.npz", **npz_change)
    with pytest.raises(ValueError) as npz_err:
        load_npz(path, normalize_features=False)
    data = data_from_npz(write_npz(tmp_path / "good.npz"), masks=False)
    for key, value in data_change.items():
        if value == "nan":
            data.x[0, 0] = float("nan")
        else:
            data[key] = value
    with pytest.raises(ValueError) as pyg_err:
        from_pyg(data, name="bad")
    # the npz loader names the raw key of non-finite features; the dataset checks do the rest
    if "x_data" in npz_change:
        assert "non-finite value nan at node 0" in _message(npz_err)
        assert _message(pyg_err) == "field 'features' has non-finite value nan at node 0, column 0"
    else:
        assert _message(pyg_err) == _message(npz_err)


class _UnreachableDataset(pyg_data.InMemoryDataset):
    """A PyG dataset whose files are never there and whose server does not exist."""

    @property
    def raw_file_names(self) -> list[str]:
        return ["graph.txt"]

    @property
    def processed_file_names(self) -> list[str]:
        return ["data.pt"]

    def download(self) -> None:
        pyg_data.download_url("https://example.invalid/graph.txt", self.raw_dir)

    def process(self) -> None:  # pragma: no cover - never reached
        raise AssertionError("process without files")


def _offline(monkeypatch) -> None:
    """No name resolution and no connections, as on a machine without network."""

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable (offline test)")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_download_failure_is_one_clear_line(tmp_path, monkeypatch):
    _offline(monkeypatch)
    with pytest.raises(FileNotFoundError) as err:
        load_pyg_dataset(_UnreachableDataset, tmp_path / "root")
    message = str(err.value)
    assert "\n" not in message
    assert "download failed" in message and str(tmp_path / "root") in message


def test_pyg_cora_config_fails_clearly_offline(tmp_path, monkeypatch):
    _offline(monkeypatch)
    monkeypatch.setenv("MQGNN_DATA_ROOT", str(tmp_path))
    cfg = OmegaConf.load(CONF / "pyg_cora.yaml")
    assert cfg._target_ == "lightning_mqgnn.graph.pyg.load_pyg_dataset"
    with pytest.raises(Exception) as err:  # Hydra wraps it; the recipe prints the cause's first line
        instantiate(cfg)
    cause = err.value.__cause__ or err.value
    assert isinstance(cause, FileNotFoundError)
    assert f"Planetoid(name='Cora'): files not found under {tmp_path / 'pyg'}" in str(cause)
    assert "download failed" in str(cause)


def test_unknown_dataset_class_is_named(tmp_path):
    with pytest.raises(ValueError, match="torch_geometric.datasets.NoSuchDataset"):
        load_pyg_dataset("torch_geometric.datasets.NoSuchDataset", tmp_path)


def test_missing_pyg_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric", None)
    with pytest.raises(ImportError, match=r"lightning_mqgnn\[pyg\]"):
        import_pyg()
