"""ogbl-collab, ogbl-ppa, ogbl-citation2 and ogbl-ddi through OGB's ``LinkPropPredDataset``, as
``LinkDataset``s: the training graph, OGB's own edge split with its fixed negatives, and the
metric OGB ranks the dataset by.

OGB's layout (``<root>/ogbl_collab/``): ``raw/`` holds the training graph (``edge.csv.gz``, the
training edges; ``node-feat.csv.gz`` where the nodes have features), ``split/<type>/`` the split as
``train.pt``, ``valid.pt`` and ``test.pt``, dicts of ``edge`` ``[E, 2]`` with ``edge_neg``
``[M, 2]`` (collab, ppa, ddi: Hits@K over one shared pool of negatives), or of
``source_node``/``target_node`` ``[E]`` with ``target_node_neg`` ``[E, k]`` (citation2: MRR over
each positive's own corrupted targets). Downloads, OGB's stdin prompts and its cache are handled
as for the node datasets (``graph.ogb``); the split files are read with ``weights_only`` torch
loading, numpy arrays allowed and nothing else.

collab, ppa and ddi are undirected (OGB adds the reverse edges): the split keeps each ``{u, v}``
once and the training graph holds both directions; citation2 is directed. The published splits
are checked for shapes and ids, and scored as published (``check_link_split(strict=False)``).
ogbl-ddi has no node features: the model learns an input per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.link_dataset import LinkDataset, link_only_dataset
from lightning_mqgnn.graph.link_split import link_split_of, training_graph
from lightning_mqgnn.graph.ogb import OgbSpec, _ogb_full_torch_load, _prepare_folder, _tensor


@dataclass(frozen=True)
class OgbLinkSpec:
    """An ogbl dataset: where OGB publishes it and how it is scored (OGB's ``master.csv``)."""

    spec: OgbSpec
    undirected: bool
    hits_k: int | None
    metric: str  # "hits" or "mrr"


_OGB_LINK_SERVER = "http://snap.stanford.edu/ogb/data/linkproppred"


def _link(
    name: str, download: str, split: str, undirected: bool, hits_k: int | None, metric: str
) -> OgbLinkSpec:
    url = f"{_OGB_LINK_SERVER}/{download}.zip"
    eval_metric = f"hits@{hits_k}" if metric == "hits" else metric
    return OgbLinkSpec(OgbSpec(name, download, split, eval_metric, url), undirected, hits_k, metric)


OGB_LINK_DATASETS = {
    s.spec.name: s
    for s in (
        _link("ogbl-collab", "collab", "time", True, 50, "hits"),
        _link("ogbl-ppa", "ppassoc", "throughput", True, 100, "hits"),
        _link("ogbl-citation2", "citation-v2", "time", False, None, "mrr"),
        _link("ogbl-ddi", "ddi", "target", True, 20, "hits"),
    )
}

# what an OGB split file may hold besides tensors: numpy arrays of numbers, by the names pickles
# give their reconstructor, type and dtypes (an object array would need more, and is refused)
_NUMPY_ARRAY_GLOBALS = {
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
}
_NUMBER_TYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
_NUMBER_TYPES += (np.float16, np.float32, np.float64)


def _numpy_global(name: str) -> Any:
    """The numpy object a pickle names ``name``, for the weights-only loader's allow-list."""
    if name.endswith("._reconstruct"):
        return np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own array reconstructor
    return {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}[name]


def read_split_part(path: Path) -> dict[str, Any]:
    """One of OGB's split files (``train.pt``...): a dict of tensors or numpy arrays of numbers,
    loaded with ``weights_only=True``, numpy's array types the only globals allowed."""
    names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    allowed: list[Any] = [(_numpy_global(n), n) for n in names if n in _NUMPY_ARRAY_GLOBALS]
    if allowed:  # a dtype is rebuilt from its class, which the list of globals does not name
        allowed += [type(np.dtype(t)) for t in _NUMBER_TYPES]
    try:
        with torch.serialization.safe_globals(allowed):
            part = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a foreign or damaged file: whatever the unpickler raises
        raise ValueError(f"{path}: not an OGB split file of arrays ({str(err).splitlines()[0]})") from err
    if not isinstance(part, dict):
        raise ValueError(f"{path}: expected a dict of arrays, got {type(part).__name__}")
    return part


def _ids(path: Path, part: dict[str, Any], key: str) -> Tensor:
    if key not in part:
        raise ValueError(f"{path}: no {key!r} (holds {sorted(part)})")
    value = part[key]
    if isinstance(value, np.ndarray) and value.dtype != object:
        value = torch.from_numpy(value)
    if not isinstance(value, Tensor):
        raise ValueError(f"{path}: {key!r} must be an array of node ids, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise ValueError(f"{path}: {key!r} must hold integer node ids, got dtype {value.dtype}")
    return value.to(torch.int64)


def _pairs(path: Path, part: dict[str, Any], key: str) -> Tensor:
    """``[E, 2]`` rows (or ``[2, E]``) as ``[2, E]``."""
    value = _ids(path, part, key)
    if value.dim() == 2 and value.shape[1] == 2:
        return value.T.contiguous()
    if value.dim() == 2 and value.shape[0] == 2:
        return value
    raise ValueError(f"{path}: {key!r} has shape {tuple(value.shape)}, expected [E, 2]")


def read_ogb_link_split(split_dir: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """OGB's split under ``split_dir`` as ``LinkSplit`` fields (``link_split_of``'s arrays) and
    the file each came from."""
    arrays: dict[str, Tensor] = {}
    files: dict[str, str] = {}
    for part_name, prefix in (("train", "train"), ("valid", "val"), ("test", "test")):
        path = split_dir / f"{part_name}.pt"
        part = read_split_part(path)
        pos_field = "train" if prefix == "train" else f"{prefix}_pos"
        if "edge" in part:
            arrays[pos_field] = _pairs(path, part, "edge")
        else:
            arrays[pos_field] = torch.stack(
                [_ids(path, part, "source_node"), _ids(path, part, "target_node")]
            )
        files[pos_field] = str(path)
        if prefix == "train":
            continue
        if "edge_neg" in part:
            arrays[f"{prefix}_neg"] = _pairs(path, part, "edge_neg")
        else:  # per-source negatives only (citation2): the shared pool is each positive's first
            per_source = _ids(path, part, "target_node_neg")
            if per_source.dim() != 2:
                raise ValueError(
                    f"{path}: 'target_node_neg' has shape {tuple(per_source.shape)}, expected [E, k]"
                )
            arrays[f"{prefix}_neg_per_source"] = per_source
            arrays[f"{prefix}_neg"] = torch.stack([arrays[pos_field][0], per_source[:, 0]])
            files[f"{prefix}_neg_per_source"] = str(path)
        files[f"{prefix}_neg"] = str(path)
    return arrays, files


def load_ogb_link(name: str, root: str | Path, download: bool = True) -> LinkDataset:
    """Load ``ogbl-collab``/``ogbl-ppa``/``ogbl-citation2``/``ogbl-ddi`` (the ``ogbl-`` prefix is
    optional) from ``root`` (``root/ogbl_collab/...``), downloading as ``load_ogb`` does."""
    full = name if name.startswith("ogbl-") else f"ogbl-{name}"
    if full not in OGB_LINK_DATASETS:
        raise ValueError(f"unknown OGB link dataset {name!r}; expected one of {sorted(OGB_LINK_DATASETS)}")
    entry = OGB_LINK_DATASETS[full]
    root = Path(root)
    folder = _prepare_folder(entry.spec, root, download, split_file="train.pt")

    from ogb.linkproppred import LinkPropPredDataset

    with _ogb_full_torch_load("ogb.linkproppred.dataset"):
        graph_dict = LinkPropPredDataset(name=full, root=str(root))[0]
    num_nodes = int(graph_dict["num_nodes"])
    features = graph_dict.get("node_feat")
    features = None if features is None else _tensor(features, np.float32)
    arrays, files = read_ogb_link_split(folder / "split" / entry.spec.split)
    split = link_split_of(arrays, num_nodes, entry.undirected, files, strict=False)
    dataset = link_only_dataset(full, training_graph(split), features, source=str(folder))
    return LinkDataset(dataset, split, hits_k=entry.hits_k, metric=entry.metric)
