"""conf/data/*.yaml instantiate to GraphDatasets (the recipe calls hydra.utils.instantiate(cfg.data))."""

from __future__ import annotations

import shutil

import pytest
from helpers.paths import CONF
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_mqgnn.graph.dataset import GraphDataset

CONF = CONF / "data"
NPZ = [
    "cora",
    "citeseer",
    "amazon_photo",
    "amazon_computers",
    "coauthor_cs",
    "coauthor_physics",
    "dblp",
    "tolokers",
]


def _data_cfg(name: str):
    return OmegaConf.load(CONF / f"{name}.yaml")


@pytest.mark.parametrize("name", ["generated", "arxiv_like", "products_like", "reddit_like", "proteins_like"])
def test_generated_configs(name):
    cfg = _data_cfg(name)
    assert cfg._target_ == "lightning_mqgnn.graph.generated.generate_graph"
    ds = instantiate(cfg, scale=0.002 if name != "generated" else cfg.scale)
    assert isinstance(ds, GraphDataset) and ds.name.startswith(f"generated-{cfg.preset}")


def test_products_like_at_scale_one_is_ogbn_products_size():
    from lightning_mqgnn.graph.generated import PRESETS

    cfg = _data_cfg("products_like")
    assert cfg.preset == "products" and PRESETS["products"].num_nodes == 2_449_029


def test_papers100m_like_is_papers100m_shaped_and_builds_at_a_tiny_scale():
    from lightning_mqgnn.graph.generated import PRESETS

    cfg = _data_cfg("papers100m_like")
    p = PRESETS[cfg.preset]
    assert (p.num_nodes, p.num_features, p.num_classes) == (111_059_956, 128, 172)
    assert cfg.scale == 0.1 and abs(p.num_nodes * p.mean_degree / 2 - 1.6e9) < 0.05e9
    ds = instantiate(cfg, scale=1e-4)  # 11,106 nodes
    assert ds.num_nodes == 11_106 and ds.num_features == 128 and ds.num_classes == 172
    assert ds.train_idx.numel() == round(0.0109 * 11_106)


def test_default_generated_config_is_arxiv_tenth():
    cfg = _data_cfg("generated")
    assert (cfg.preset, cfg.scale) == ("arxiv", 0.1)


@pytest.mark.parametrize("name", [*NPZ, "pubmed", "arxiv", "products", "proteins"])
def test_named_dataset_configs_go_through_the_registry(name):
    from lightning_mqgnn.graph.registry import DATASETS

    cfg = _data_cfg(name)
    assert cfg._target_ == "lightning_mqgnn.graph.registry.load_dataset"
    assert cfg.name == name and name in DATASETS
    assert cfg.download is True  # a user with a network gets the data


def test_every_registered_dataset_has_a_config_and_no_config_points_outside_the_project():
    from lightning_mqgnn.graph.registry import DATASETS

    assert all((CONF / f"{name}.yaml").is_file() for name in DATASETS)
    for path in CONF.glob("*.yaml"):
        text = path.read_text()
        assert "shared" not in text and "paths." not in text, path


def test_npz_config_instantiates_from_the_mirror(monkeypatch, tmp_path, served_data_root):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copy(served_data_root / "cora.npz", mirror)  # cora, converted from its committed files
    monkeypatch.setenv("MQGNN_DATA_MIRROR", str(mirror))
    monkeypatch.setenv("MQGNN_DATA_ROOT", str(tmp_path / "empty"))
    ds = instantiate(_data_cfg("cora"))
    assert (ds.name, ds.num_nodes, ds.num_features) == ("cora", 2708, 1433)
    assert not (tmp_path / "empty").exists()  # read from the mirror, nothing cached


@pytest.mark.parametrize("name", ["arxiv", "products", "proteins"])
def test_ogb_configs_fail_clearly_without_files(name, tmp_path, monkeypatch):
    monkeypatch.setenv("MQGNN_DATA_ROOT", str(tmp_path))
    cfg = _data_cfg(name)
    cfg.download = False
    with pytest.raises(Exception, match=rf"not found under {tmp_path}/ogb/ogbn_{name} and downloads are off"):
        instantiate(cfg)


def test_arxiv_config_downloads_through_ogbs_downloader(tmp_path, monkeypatch):
    """data=arxiv up to the network: the config, the registry and OGB's downloader against a local
    server holding a zip in OGB's published layout."""
    import dataclasses
    import functools
    import http.server
    import shutil
    import threading

    from test_graph_ogb import write_tiny_arxiv

    from lightning_mqgnn.graph.ogb import OGB_DATASETS

    served = tmp_path / "served"
    write_tiny_arxiv(served / "build")
    (served / "build" / "ogbn_arxiv").rename(served / "build" / "arxiv")
    shutil.make_archive(str(served / "arxiv"), "zip", served / "build", "arxiv")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    monkeypatch.setenv("MQGNN_DATA_ROOT", str(tmp_path / "root"))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}/arxiv.zip"
        monkeypatch.setitem(
            OGB_DATASETS, "ogbn-arxiv", dataclasses.replace(OGB_DATASETS["ogbn-arxiv"], url=url)
        )
        ds = instantiate(_data_cfg("arxiv"))
        server.shutdown()
    assert ds.name == "ogbn-arxiv" and ds.num_nodes == 50
    assert (tmp_path / "root" / "ogb" / "ogbn_arxiv" / "raw" / "edge.csv.gz").is_file()
