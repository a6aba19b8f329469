"""Each layer-wise variant (and GNS) trains end to end on Cora through Lightning and learns: cora as
the registry converts its committed Planetoid files (conftest.served_data_root)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers.recipe import recipe_config

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler

VARIANTS = ["fastgcn", "fastgcn_f", "fastgcn_d", "fastgcn_fd", "ladies", "ladies_f", "ladies_d", "ladies_fd"]


def load_cora(path: Path) -> GraphDataset:
    """Cora from its converted npz, features row-normalised (bag of words)."""
    d = np.load(path)
    n = int(d["x_shape"][0])
    graph = CSRGraph(torch.from_numpy(d["indptr"]), torch.from_numpy(d["indices"]), n)
    x = torch.sparse_csr_tensor(
        torch.from_numpy(d["x_indptr"]),
        torch.from_numpy(d["x_indices"]),
        torch.from_numpy(d["x_data"]),
        size=tuple(int(s) for s in d["x_shape"]),
    ).to_dense()
    x = x / x.sum(1, keepdim=True).clamp(min=1.0)
    y = torch.from_numpy(d["y"])
    return GraphDataset(
        name="cora",
        graph=graph,
        features=x,
        labels=y,
        train_idx=torch.from_numpy(d["train_idx"]),
        val_idx=torch.from_numpy(d["val_idx"]),
        test_idx=torch.from_numpy(d["test_idx"]),
        num_classes=int(y.max()) + 1,
        metric="accuracy",
    )


@pytest.fixture(scope="module")
def cora(served_data_root) -> GraphDataset:
    return load_cora(served_data_root / "cora.npz")


def fit_and_validate(ds: GraphDataset, sampler, conv: str, lr: float = 1e-2) -> float:
    pl.seed_everything(0)
    module = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=64, dropout=0.2, lr=lr)
    dm = MQGNNDataModule(ds, sampler, LoaderSettings(batch_size=140, seed=0))  # the whole training split
    trainer = pl.Trainer(
        max_steps=20,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    return float(trainer.validate(module, datamodule=dm, verbose=False)[0]["val/metric"])


def model_config(name: str) -> dict:
    """The composed ``model=<name>`` group (variants derive from fastgcn.yaml/ladies.yaml)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(recipe_config(f"model={name}").model)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_config_trains_on_cora(cora, name):
    # the config's sampler, with its own sample sizes, drives 20 Adam steps of a GCN: validation
    # accuracy (exact full-graph inference) clears 0.6 where the majority class scores 0.316
    cfg = model_config(name)
    cls = {"FastGCNSampler": FastGCNSampler, "LADIESSampler": LADIESSampler}[
        cfg["sampler"]["_target_"].split(".")[-1]
    ]
    args = {k: v for k, v in cfg["sampler"].items() if not k.startswith("_")}
    sampler = cls(cora.graph, **args)
    assert cfg["module"]["conv"] == "gcn" and sampler.aggregation == "gcn"
    assert (cls is LADIESSampler) == name.startswith("ladies")
    assert sampler.flat == ("_f" in name) and sampler.debias == name.endswith("d")
    val = fit_and_validate(cora, sampler, "gcn")
    assert val > 0.6, f"{name}: val accuracy {val:.3f}"


def test_gns_sampler_trains_on_cora(cora):
    cache = GNSCache(cora.graph, cora.train_idx, fraction=0.2, fanouts=[10, 10])
    val = fit_and_validate(cora, GNSSampler(cora.graph, [10, 10], cache, aggregation="mean"), "sage")
    assert val > 0.6, f"gns: val accuracy {val:.3f}"
