"""Generated graphs shaped like the paper's datasets (Table 1): the project's default data, no download.

A generated graph is learnable in the way real citation or co-purchase graphs are: labels are
homophilous (most edges join nodes of the same class) and features are a class centroid plus
noise, so averaging over neighbours (eq. 1, 17) denoises a node's features and a GNN beats an
MLP. Degrees follow a power law (Chung-Lu with Pareto weights, see ``chung_lu``), which is what
makes sampling and caching (eq. 14-16) matter.

Presets (``scale`` = 1.0 is the real node count; ``scale`` multiplies it and keeps the mean degree
unless the graph is too small to hold it, see ``max_density``):

============  =========  ==========  ========  =======  ===========  ========
preset        nodes      mean deg.   features  classes  split %      metric
============  =========  ==========  ========  =======  ===========  ========
arxiv         169,343    13.7        128       40       54/18/28     accuracy
products      2,449,029  50.5        100       47       8/2/90       accuracy
reddit        232,965    490         602       41       66/10/24     micro_f1
proteins      132,534    597         8         112 *    65/16/19     rocauc
papers100m    111.06M    29.1        128       172      1.1/.1/.2 †  accuracy
============  =========  ==========  ========  =======  ===========  ========

Splits are the paper's ratios (Table 1), drawn uniformly at random from ``seed``. Mean degree
counts both directions of each undirected edge (arxiv: 2 * 1,166,243 / 169,343 = 13.8). Reddit's
490 is DGL's Reddit graph (114.6M directed edges); the paper's Table 1 lists 11.6M edges.
† papers100m labels only 1.4% of its nodes (ogbn-papers100M: 1.2M train, 125k val, 214k test
of 111M); its 1.6B edges are undirected, so the mean degree is 2 * 1.6B / 111M.
* proteins is multi-label: 112 binary tasks over 16 latent communities; each community has its
own positive rate per task, and features/edges follow the community.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.chung_lu import (
    homophilous_chung_lu,
    homophilous_chung_lu_on_disk,
    pareto_weights,
)
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.splits import random_split
from lightning_mqgnn.graph.validate import validate_dataset


@dataclass(frozen=True)
class GraphPreset:
    """Shape of a generated dataset. ``num_classes`` is the number of tasks when ``multilabel``."""

    num_nodes: int
    mean_degree: float
    num_features: int
    num_classes: int
    split: tuple[float, float, float]
    metric: str = "accuracy"
    multilabel: bool = False
    num_communities: int = 0  # multilabel only: latent classes that drive edges, features and labels


PRESETS: dict[str, GraphPreset] = {
    "arxiv": GraphPreset(169_343, 13.7, 128, 40, (0.54, 0.18, 0.28)),
    "products": GraphPreset(2_449_029, 50.5, 100, 47, (0.08, 0.02, 0.90)),
    "reddit": GraphPreset(232_965, 490.0, 602, 41, (0.66, 0.10, 0.24), metric="micro_f1"),
    "papers100m": GraphPreset(111_059_956, 29.1, 128, 172, (0.0109, 0.0011, 0.0019)),
    "proteins": GraphPreset(
        132_534, 597.0, 8, 112, (0.65, 0.16, 0.19), metric="rocauc", multilabel=True, num_communities=16
    ),
}


TOPOLOGIES = ("pairing", "chunked")


@dataclass(frozen=True)
class _Skeleton:
    """What a generated dataset has before its features: the shape, the nodes' classes, the
    topology (``indptr`` and its column array in chunks), and the random stream the features,
    labels and split are drawn from next."""

    preset: GraphPreset
    name: str
    groups: int
    classes: Tensor
    indptr: Tensor
    columns: Iterable[np.ndarray]
    num_edges: int
    gen: torch.Generator


def generate_graph(
    preset: str = "arxiv",
    scale: float = 1.0,
    seed: int = 0,
    *,
    num_nodes: int | None = None,
    mean_degree: float | None = None,
    num_features: int | None = None,
    num_classes: int | None = None,
    homophily: float = 0.6,
    feature_snr: float = 1.5,
    power_law_alpha: float = 1.5,
    class_skew: float = 0.5,
    max_density: float = 0.05,
    topology: str = "pairing",
) -> GraphDataset:
    """Generate a dataset shaped like ``preset`` (see the module table); deterministic per ``seed``.

    ``num_nodes``/``mean_degree``/``num_features``/``num_classes`` override the preset (``num_nodes``
    wins over ``scale``). ``homophily``: fraction of edges drawn inside their class (realised edge
    homophily is within a few points: random draws may land in-class, merged duplicates are
    more often in-class; arxiv x0.05: 0.575 for 0.6).
    ``feature_snr``: half the distance between two class centroids over the noise std along it;
    the default 1.5 with homophily 0.6 leaves raw features ambiguous: on arxiv x0.1 an MLP
    reaches ~0.40 test accuracy, a 2-layer SAGE with fan-out 5,5 ~0.87. ``power_law_alpha``:
    Pareto tail of the degree weights (degree exponent alpha + 1). ``class_skew``: class sizes
    follow rank^-skew. ``max_density``: the mean degree is capped at ``max_density * (N - 1)``.
    ``topology``: ``"pairing"`` pairs every stub at once in memory and redraws the shortfall of
    merged duplicates (``homophilous_chung_lu``); ``"chunked"`` pairs them in rounds of
    ``STUBS_PER_CHUNK`` merged on disk (``chung_lu_edge_chunks``, ``EdgeBuckets``), so memory
    holds a round, not the edge list (``homophilous_chung_lu_on_disk``). The two are different
    graphs of the same shape.
    """
    arguments = _arguments(locals())
    with tempfile.TemporaryDirectory(prefix="mqgnn-edges-") as scratch:
        k = _skeleton(**arguments, scratch=Path(scratch))
        columns = [torch.from_numpy(c) for c in k.columns]
    graph = CSRGraph(k.indptr, columns[0] if len(columns) == 1 else torch.cat(columns), k.preset.num_nodes)
    p = k.preset
    chunks = list(class_feature_chunks(k.classes, k.groups, p.num_features, feature_snr, k.gen))
    features = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    labels, (train, val, test) = _labels_and_split(k)
    ds = GraphDataset(k.name, graph, features, labels, train, val, test, p.num_classes, p.metric)
    return validate_dataset(ds)


def write_generated_graph(
    folder: str | os.PathLike,
    preset: str = "arxiv",
    scale: float = 1.0,
    seed: int = 0,
    *,
    overwrite: bool = False,
    features_dtype: str = "float32",
    num_nodes: int | None = None,
    mean_degree: float | None = None,
    num_features: int | None = None,
    num_classes: int | None = None,
    homophily: float = 0.6,
    feature_snr: float = 1.5,
    power_law_alpha: float = 1.5,
    class_skew: float = 0.5,
    max_density: float = 0.05,
    topology: str = "pairing",
) -> Path:
    """``generate_graph``'s dataset, the same bit for bit, written straight to ``folder`` in the
    on-disk layout (``graph.ondisk``) with its features drawn and written a chunk at a time: the
    feature matrix is never in memory, so a graph whose features exceed the memory can be made on
    the machine that trains it, stored as ``features_dtype`` (``graph.feature_dtypes``). With ``topology="chunked"`` the edge list is never in memory
    either: its rounds are merged in a scratch folder inside the dataset's hidden folder."""
    arguments = _arguments(locals())
    from lightning_mqgnn.graph.ondisk import DatasetWriter

    with DatasetWriter(folder, overwrite=overwrite) as writer:
        scratch = writer.partial / "edges"
        k = _skeleton(**arguments, scratch=scratch)
        p = k.preset
        writer.tensor("indptr", k.indptr)
        writer.array("indices", k.columns, "int64", (k.num_edges,))
        shutil.rmtree(scratch, ignore_errors=True)
        chunks = class_feature_chunks(k.classes, k.groups, p.num_features, feature_snr, k.gen)
        writer.features((c.numpy() for c in chunks), (p.num_nodes, p.num_features), features_dtype)
        labels, splits = _labels_and_split(k)
        writer.tensor("labels", labels)
        for split_name, idx in zip(("train_idx", "val_idx", "test_idx"), splits):
            writer.tensor(split_name, idx)
        return writer.finish(name=k.name, num_classes=p.num_classes, metric=p.metric)


def _arguments(arguments: dict) -> dict:
    """The generation arguments of ``generate_graph`` or ``write_generated_graph`` (their locals)."""
    return {k: v for k, v in arguments.items() if k not in ("folder", "overwrite", "features_dtype")}


def _skeleton(
    preset: str,
    scale: float,
    seed: int,
    num_nodes: int | None,
    mean_degree: float | None,
    num_features: int | None,
    num_classes: int | None,
    homophily: float,
    feature_snr: float,
    power_law_alpha: float,
    class_skew: float,
    max_density: float,
    topology: str,
    scratch: Path,
) -> _Skeleton:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; expected one of {TOPOLOGIES}")
    p = PRESETS[preset]
    explicit_nodes = num_nodes is not None
    if num_nodes is None:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        num_nodes = max(int(round(p.num_nodes * scale)), 16)
    p = replace(
        p,
        num_nodes=int(num_nodes),
        mean_degree=float(mean_degree if mean_degree is not None else p.mean_degree),
        num_features=int(num_features if num_features is not None else p.num_features),
        num_classes=int(num_classes if num_classes is not None else p.num_classes),
    )
    if p.num_nodes < 16 or p.mean_degree <= 0 or p.num_features < 1 or p.num_classes < 2:
        raise ValueError(f"generated graph needs >= 16 nodes, degree > 0, >= 1 feature, >= 2 classes: {p}")
    gen = torch.Generator().manual_seed(int(seed))
    degree = min(p.mean_degree, max_density * (p.num_nodes - 1))
    groups = p.num_communities if p.multilabel else p.num_classes
    classes = _class_assignment(p.num_nodes, groups, class_skew, gen)
    weights = pareto_weights(p.num_nodes, power_law_alpha, degree, gen)
    if topology == "pairing":
        graph = homophilous_chung_lu(weights, classes, groups, homophily, gen)
        indptr, columns, num_edges = graph.indptr, [graph.indices.numpy()], graph.num_edges
    else:
        buckets = homophilous_chung_lu_on_disk(weights, classes, groups, homophily, gen, scratch)
        indptr, columns, num_edges = buckets.indptr, buckets.column_chunks(), buckets.num_edges
    name = f"generated-{preset}" + (
        f"-n{num_nodes}" if explicit_nodes else "" if scale == 1.0 else f"-x{scale:g}"
    )
    name += "-chunked" if topology == "chunked" else ""
    return _Skeleton(p, name, groups, classes, indptr, columns, num_edges, gen)


def _labels_and_split(k: _Skeleton) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """Drawn after the features, from the same stream."""
    p = k.preset
    labels = _multilabel_targets(k.classes, k.groups, p.num_classes, k.gen) if p.multilabel else k.classes
    return labels, random_split(p.num_nodes, p.split, k.gen)


def _class_assignment(num_nodes: int, num_classes: int, skew: float, gen: torch.Generator) -> Tensor:
    """Class of every node; class sizes proportional to rank^-skew (real label sets are unbalanced)."""
    probs = torch.arange(1, num_classes + 1, dtype=torch.float64).pow(-skew)
    return torch.multinomial(probs / probs.sum(), num_nodes, replacement=True, generator=gen)


FEATURE_CHUNK_ELEMENTS = 1 << 29  # 2 GiB of float32: every preset up to products at scale 1 is one chunk


def class_feature_chunks(
    classes: Tensor, num_classes: int, num_features: int, snr: float, gen: torch.Generator
) -> Iterator[Tensor]:
    """``centroid[class] + noise``, in row chunks of at most
    ``FEATURE_CHUNK_ELEMENTS`` values: centroids N(0, 1) per column, noise N(0, s^2) with
    s = sqrt(2F) / (2 snr), i.e. nearest-centroid margins of ``snr`` noise stds whatever F is.
    The chunks are drawn in order from ``gen``, so the rows do not depend on who consumes them."""
    centroids = torch.randn(num_classes, num_features, generator=gen)
    noise_std = math.sqrt(2.0 * num_features) / (2.0 * snr)
    rows = max(FEATURE_CHUNK_ELEMENTS // num_features, 1)
    for start in range(0, classes.numel(), rows):
        part = classes[start : start + rows]
        x = torch.randn(part.numel(), num_features, generator=gen)
        yield x.mul_(noise_std).add_(centroids[part])


def _multilabel_targets(
    communities: Tensor, num_communities: int, num_tasks: int, gen: torch.Generator
) -> Tensor:
    """0/1 ``[N, T]``: task t is positive with a rate that depends on the node's community, so
    labels follow the graph. Rates are 0.01 + 0.8 U^3 (mean 0.21, most tasks rare, as in
    ogbn-proteins), drawn from ``gen`` to stay deterministic per seed."""
    rates = 0.01 + 0.8 * torch.rand(num_communities, num_tasks, generator=gen).pow(3.0)
    u = torch.rand(communities.numel(), num_tasks, generator=gen)
    return (u < rates[communities]).to(torch.float32)
