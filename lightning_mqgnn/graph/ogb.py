"""ogbn-arxiv, ogbn-products and ogbn-proteins through OGB's ``NodePropPredDataset``.

Works around three OGB 1.3.6 gotchas:

1. OGB caches the parsed graph with ``torch.save`` (a numpy pickle) and reads it back with a bare
   ``torch.load``, which torch >= 2.6 refuses (``weights_only=True``). We swap the ``torch`` name
   inside OGB's dataset module for a proxy whose ``load`` passes ``weights_only=False``, only for
   the duration of the call: no global ``torch.load`` patch, no environment variable. Full
   unpickling runs only on the cache OGB wrote under ``root``.
2. A dataset folder without ``RELEASE_v1.txt`` makes OGB ask on stdin. We create the marker, but
   only once the raw files (or OGB's cache) are known to be there.
3. Missing files make OGB download, but it asks on stdin before any zip over 1 GB (products) and
   hangs or fails obscurely without a network. We decide first (``download.check_download``:
   allowed by ``download=True`` and the host reachable, else a one-line ``FileNotFoundError``
   saying where the files are expected), then fetch and unpack with OGB's own ``download_url``
   and ``extract_zip`` into the folder OGB reads.

ogbn-proteins has no node features: a node's feature vector is the mean of the 8-dimensional
features of its incident edges (mean, not sum, so the scale does not grow with the degree, which
ranges over three orders of magnitude there); labels are float32 ``[N, 112]``, metric rocauc.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.download import check_download
from lightning_mqgnn.graph.validate import validate_dataset


@dataclass(frozen=True)
class OgbSpec:
    name: str
    download: str  # folder inside OGB's zip, e.g. "arxiv"
    split: str  # folder under split/
    metric: str
    url: str  # as in OGB's nodeproppred/master.csv


_OGB_SERVER = "http://snap.stanford.edu/ogb/data/nodeproppred"
OGB_DATASETS = {
    "ogbn-arxiv": OgbSpec("ogbn-arxiv", "arxiv", "time", "accuracy", f"{_OGB_SERVER}/arxiv.zip"),
    "ogbn-products": OgbSpec(
        "ogbn-products", "products", "sales_ranking", "accuracy", f"{_OGB_SERVER}/products.zip"
    ),
    "ogbn-proteins": OgbSpec("ogbn-proteins", "proteins", "species", "rocauc", f"{_OGB_SERVER}/proteins.zip"),
}


class _TorchWithFullLoad:
    """Stands in for ``torch`` inside OGB's module: ``load`` unpickles OGB's own numpy cache."""

    load = functools.partial(torch.load, weights_only=False)

    def __getattr__(self, attr: str) -> Any:
        return getattr(torch, attr)


@contextmanager
def _ogb_full_torch_load(module: str = "ogb.nodeproppred.dataset") -> Iterator[None]:
    """Inside ``module`` (OGB's dataset module), ``torch.load`` unpickles fully while it runs."""
    import importlib

    ogb_dataset = importlib.import_module(module)
    original = ogb_dataset.torch
    ogb_dataset.torch = _TorchWithFullLoad()
    try:
        yield
    finally:
        ogb_dataset.torch = original


def _prepare_folder(spec: OgbSpec, root: Path, download: bool, split_file: str = "train.csv.gz") -> Path:
    """Make sure the files are there (downloading them when allowed and possible), then add what
    OGB needs to not prompt or crash. ``split_file``: the file of the training split under
    ``split/<split>/`` (``train.pt`` for a link dataset)."""
    folder = root / spec.name.replace("-", "_")
    manual = (
        f"extract {spec.download}.zip ({spec.url}) so that "
        f"{folder}/raw/edge.csv.gz and {folder}/split/{spec.split}/ exist"
    )
    cached = (folder / "processed" / "data_processed").is_file()
    if not cached and not (folder / "raw" / "edge.csv.gz").is_file():
        check_download(spec.name, spec.url, folder, download, manual)
        _download(spec, root, folder)
    split_dir = folder / "split" / spec.split
    if not (split_dir / split_file).is_file() and not (split_dir / "split_dict.pt").is_file():
        raise FileNotFoundError(f"{spec.name}: split files not found in {split_dir}; {manual}")
    marker = folder / "RELEASE_v1.txt"
    if not marker.exists():
        marker.write_text("created by lightning_mqgnn so that OGB does not prompt\n")
    (folder / "processed").mkdir(exist_ok=True)
    return folder


def _download(spec: OgbSpec, root: Path, folder: Path) -> None:
    """Fetch and unpack the dataset's zip with OGB's downloader, as ``NodePropPredDataset`` would
    without its size prompt: ``root/<download>/`` from the zip becomes ``folder``."""
    from ogb.utils.url import download_url, extract_zip

    root.mkdir(parents=True, exist_ok=True)
    archive = download_url(spec.url, str(root))
    try:
        extract_zip(archive, str(root))
    finally:
        Path(archive).unlink(missing_ok=True)
    unpacked = root / spec.download
    if not unpacked.is_dir():
        raise FileNotFoundError(f"{spec.name}: {spec.url} did not unpack to {unpacked}")
    if folder.exists():
        shutil.rmtree(folder)
    unpacked.rename(folder)


def load_ogb(
    name: str, root: str | Path, make_undirected: bool = True, download: bool = True
) -> GraphDataset:
    """Load ``ogbn-arxiv``/``ogbn-products``/``ogbn-proteins`` (the ``ogbn-`` prefix is optional)
    from ``root`` (OGB's layout: ``root/ogbn_arxiv/raw/...``), validated.

    Missing files are downloaded from OGB's server unless ``download`` is False or the server
    cannot be reached; both of those end in a ``FileNotFoundError`` that says where the files go.

    ``make_undirected`` adds reverse edges (arxiv's citations are directed; products and
    proteins already come with both directions from OGB). The first call parses the gzip CSVs
    and writes OGB's cache; later calls read the cache.
    """
    full = name if name.startswith("ogbn-") else f"ogbn-{name}"
    if full not in OGB_DATASETS:
        raise ValueError(f"unknown OGB dataset {name!r}; expected one of {sorted(OGB_DATASETS)}")
    spec = OGB_DATASETS[full]
    root = Path(root)
    folder = _prepare_folder(spec, root, download)

    from ogb.nodeproppred import NodePropPredDataset

    with _ogb_full_torch_load():
        dataset = NodePropPredDataset(name=full, root=str(root))
        split = dataset.get_idx_split()
    graph_dict, labels_np = dataset[0]

    num_nodes = int(graph_dict["num_nodes"])
    edge_index = _tensor(graph_dict["edge_index"], np.int64)
    graph = CSRGraph.from_edges(edge_index[0], edge_index[1], num_nodes, symmetrize=make_undirected)
    if spec.name == "ogbn-proteins":
        features = mean_incident_edge_features(edge_index, graph_dict["edge_feat"], num_nodes)
        labels = _tensor(labels_np, np.float32)
        num_classes = int(dataset.num_tasks)
    else:
        features = _tensor(graph_dict["node_feat"], np.float32)
        labels = _tensor(labels_np, np.int64).reshape(-1)
        num_classes = int(dataset.num_classes)
    ds = GraphDataset(
        name=spec.name,
        graph=graph,
        features=features,
        labels=labels,
        train_idx=_tensor(split["train"], np.int64),
        val_idx=_tensor(split["valid"], np.int64),
        test_idx=_tensor(split["test"], np.int64),
        num_classes=num_classes,
        metric=spec.metric,
    )
    return validate_dataset(ds, source=str(folder))


def _tensor(a: Any, dtype: type) -> torch.Tensor:
    """numpy (possibly read-only, as pandas hands it out) -> writable contiguous tensor, copying only if needed."""
    return torch.from_numpy(np.require(np.asarray(a), dtype=dtype, requirements=["C", "W"]))


def mean_incident_edge_features(
    edge_index: torch.Tensor, edge_feat: np.ndarray, num_nodes: int
) -> torch.Tensor:
    """Node features of ogbn-proteins: mean feature of the edges ending at each node (OGB stores
    both directions, so these are all incident edges); isolated nodes get zeros."""
    feat = _tensor(edge_feat, np.float32)
    dst = edge_index[1]
    total = torch.zeros(num_nodes, feat.shape[1]).index_add_(0, dst, feat)
    count = torch.bincount(dst, minlength=num_nodes).clamp(min=1).to(torch.float32)
    return total / count[:, None]
