"""The OGB link datasets on tiny datasets in OGB's exact layout (no network): downloaded from a
local server by OGB's downloader through the registry, OGB's split and negatives kept as
published, the training graph, and the metric OGB ranks each by."""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import pytest
import torch
from helpers.ogb_link import served_ogb_link, write_tiny_ogb_link

from lightning_mqgnn.graph import registry
from lightning_mqgnn.graph.link_dataset import LinkDataset
from lightning_mqgnn.graph.ogb_link import load_ogb_link

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")


def undirected(pairs: np.ndarray) -> set[tuple[int, int]]:
    return {(min(u, v), max(u, v)) for u, v in pairs.tolist()}


def as_set(t: torch.Tensor) -> set[tuple[int, int]]:
    return set(zip(t[0].tolist(), t[1].tolist()))


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.DATA_ROOT_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(registry.MIRROR_ENV, raising=False)
    return tmp_path / "cache"


def test_collab_is_downloaded_and_keeps_ogbs_split(tmp_path, monkeypatch, data_root):
    with served_ogb_link(tmp_path, "ogbl-collab", monkeypatch) as tiny:
        data = registry.load_dataset("ogbl_collab")
    assert isinstance(data, LinkDataset) and (data.hits_k, data.metric) == (50, "hits")
    s, ds = data.split, data.dataset
    assert s.undirected and (s.train[0] < s.train[1]).all()
    assert as_set(s.train) == undirected(tiny.train)
    assert torch.equal(s.val_pos, torch.from_numpy(tiny.valid.T)) and torch.equal(
        s.test_neg, torch.from_numpy(tiny.test_neg.T)
    )
    assert s.val_neg_per_source is None
    # the message graph: the training edges in both directions, none held out
    rows = ds.graph.row_ids()
    assert set(zip(ds.graph.indices.tolist(), rows.tolist())) == as_set(s.train) | {
        (v, u) for u, v in as_set(s.train)
    }
    assert torch.allclose(ds.features, torch.from_numpy(tiny.features), atol=1e-5)
    assert ds.num_classes == 0 and ds.name == "ogbl-collab"
    assert (data_root / "ogb" / "ogbl_collab" / "split" / "time" / "valid.pt").is_file()
    again = registry.load_dataset("ogbl_collab", download=False)  # now local: OGB's cache
    assert torch.equal(again.split.train, s.train)


def test_citation2_is_directed_with_each_positives_own_negatives(tmp_path):
    tiny = write_tiny_ogb_link(tmp_path, "ogbl-citation2")  # its split files hold numpy arrays
    data = load_ogb_link("citation2", tmp_path, download=False)
    s = data.split
    assert (data.hits_k, data.metric) == (None, "mrr") and not s.undirected
    assert torch.equal(s.train, torch.from_numpy(tiny.train.T))
    k = s.val_neg_per_source.shape[1]
    assert torch.equal(s.val_neg_per_source.reshape(-1), torch.from_numpy(tiny.valid_neg[:, 1]))
    assert torch.equal(s.test_neg_per_source.reshape(-1), torch.from_numpy(tiny.test_neg[:, 1]))
    assert s.val_neg_per_source.shape == (tiny.valid.shape[0], k)
    assert not data.dataset.graph.is_symmetric()


def test_ddi_has_no_features(tmp_path):
    write_tiny_ogb_link(tmp_path, "ogbl-ddi")
    data = load_ogb_link("ogbl-ddi", tmp_path, download=False)
    assert (data.hits_k, data.metric) == (20, "hits")
    assert data.dataset.num_features == 0 and "no features" in data.dataset.summary()


def test_missing_files_and_foreign_split_files_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ogbl-collab: .*collab\.zip"):
        load_ogb_link("collab", tmp_path, download=False)
    write_tiny_ogb_link(tmp_path, "ogbl-ddi")
    valid = tmp_path / "ogbl_ddi" / "split" / "target" / "valid.pt"
    torch.save({"edge": pathlib.PurePosixPath("x")}, valid)  # a global no array needs
    with pytest.raises(ValueError, match=rf"{valid}: not an OGB split file of arrays") as err:
        load_ogb_link("ddi", tmp_path, download=False)
    assert "\n" not in str(err.value)
    torch.save({"edge": collections.Counter(), "edge_neg": torch.zeros(2, 2)}, valid)
    with pytest.raises(ValueError, match=rf"{valid}: 'edge' must be an array of node ids, got Counter"):
        load_ogb_link("ddi", tmp_path, download=False)
    with pytest.raises(ValueError, match=r"unknown OGB link dataset 'wikikg2'; expected one of \["):
        load_ogb_link("wikikg2", tmp_path)
