"""conf/data/*.yaml instantiate to GraphDatasets (the recipe calls hydra.utils.instantiate(cfg.data))."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.graphs import SHARED_DATA
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


def _data_cfg(name: str, **paths):
    cfg = OmegaConf.create({"paths": paths, "data": OmegaConf.load(CONF / f"{name}.yaml")})
    return cfg.data


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


@pytest.mark.parametrize("name", NPZ)
def test_npz_configs_point_at_shared_files(name):
    cfg = _data_cfg(name, shared_data=str(SHARED_DATA))
    assert cfg._target_ == "lightning_mqgnn.graph.npz.load_npz"
    assert Path(cfg.path) == SHARED_DATA / f"{name}.npz"


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared datasets not found at {SHARED_DATA}")
def test_npz_config_instantiates():
    ds = instantiate(_data_cfg("citeseer", shared_data=str(SHARED_DATA)))
    assert ds.name == "citeseer" and ds.num_features == 1024


@pytest.mark.parametrize("name", ["arxiv", "products", "proteins"])
def test_ogb_configs_fail_clearly_without_files(name, tmp_path):
    cfg = _data_cfg(name, ogb_root=str(tmp_path))
    assert cfg._target_ == "lightning_mqgnn.graph.ogb.load_ogb" and cfg.name == f"ogbn-{name}"
    assert cfg.download is True  # a user with a network gets the data
    cfg.download = False
    with pytest.raises(Exception, match=r"not found under .* downloads are off \(download=false\)"):
        instantiate(cfg)
