"""Train/validation/test splits of a graph's edges for link prediction, with fixed negatives.

The protocol is PyG's ``RandomLinkSplit`` with OGB's evaluation sets: a seeded share of the
edges (5% validation, 10% test by default) is held out as positives and removed from the graph
the model passes messages over, so a held-out edge is never visible to the model it scores;
the negatives of each held-out split are drawn once, from the pairs that are edges nowhere in
the full graph, so every run is scored on the same pairs, as OGB ships them.

Negatives come in one or two forms (``LinkSplit``):

* ``val_neg`` / ``test_neg``: ``[2, M]`` pairs, one shared pool each positive is ranked
  against (Hits@K as ogbl-collab and ogbl-ddi, ROC-AUC);
* ``val_neg_per_source`` / ``test_neg_per_source`` (optional): ``[E, k]`` destination ids, row
  ``i`` being ``k`` corrupted destinations for the source of positive ``i`` (MRR as
  ogbl-citation2).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_mqgnn.graph.arrays import read_array
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.edge_keys import contains, graph_keys, pair_keys, undirected_keys
from lightning_mqgnn.graph.fields import as_tensor, edge_pairs

POSITIVES = ("train", "val_pos", "test_pos")
NEGATIVES = ("val_neg", "test_neg")
PER_SOURCE = {"val_neg_per_source": "val_pos", "test_neg_per_source": "test_pos"}
DRAW_ROUNDS = 64  # rounds of rejection sampling before a graph counts as too dense for its negatives


@dataclass
class LinkSplit:
    """The edges of a link-prediction run, every array int64 node ids in ``[0, num_nodes)``.

    ``train``: ``[2, E_train]`` positives the model both passes messages over and is trained to
    score; on an ``undirected`` split each edge ``{u, v}`` appears once (``u < v``) and the
    message graph holds both directions. ``val_pos``/``test_pos``: ``[2, E]`` held-out positives.
    ``val_neg``/``test_neg``: ``[2, M]`` fixed negative pairs (Hits@K, ROC-AUC).
    ``val_neg_per_source``/``test_neg_per_source``: ``None``, or ``[E, k]`` fixed destinations,
    row ``i`` corrupting positive ``i`` of the same split with its source kept (MRR).
    """

    train: Tensor
    val_pos: Tensor
    test_pos: Tensor
    val_neg: Tensor
    test_neg: Tensor
    num_nodes: int
    undirected: bool = True
    val_neg_per_source: Tensor | None = None
    test_neg_per_source: Tensor | None = None


def random_link_split(
    graph: CSRGraph,
    val: float = 0.05,
    test: float = 0.10,
    seed: int = 0,
    undirected: bool = True,
    num_val_neg: int | None = None,
    num_test_neg: int | None = None,
    neg_per_source: int | None = None,
) -> tuple[CSRGraph, LinkSplit]:
    """A seeded split of ``graph``'s edges (PyG's ``RandomLinkSplit``, 85/5/10 by default) and the
    training graph without the held-out edges.

    ``undirected``: ``{u, v}`` is one candidate whichever directions the graph stores, and a
    held-out edge leaves the training graph in both directions; otherwise each directed edge is a
    candidate of its own. Self loops are never candidates. ``val`` and ``test`` hold
    ``floor(fraction * E)`` edges each, at least one. Negatives: ``num_val_neg``/``num_test_neg``
    distinct pairs (default: as many as the split's positives), drawn uniformly from the
    non-edges of the full graph (no self loops), so none is a positive of any split; with
    ``neg_per_source=k`` also ``k`` destinations per held-out positive, each pair with its source
    a non-edge (repeats within a row allowed, as in uniform corruption).
    """
    who = "random_link_split"
    if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
        raise ValueError(
            f"{who}: val and test must be fractions in (0, 1) summing below 1, got {val}, {test}"
        )
    n = graph.num_nodes
    table = candidate_keys(graph, undirected)
    num = table.numel()
    n_val, n_test = max(1, int(val * num)), max(1, int(test * num))
    if n_val + n_test >= num:
        raise ValueError(
            f"{who}: the graph has {num} candidate edges; val={val} and test={test} leave none to train on"
        )
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(num, generator=gen)
    val_keys, test_keys = table[perm[:n_val]], table[perm[n_val : n_val + n_test]]
    train_keys = table[perm[n_val + n_test :]].sort().values
    train, val_pos, test_pos = (_key_pairs(k, n) for k in (train_keys, val_keys, test_keys))
    counts = {"num_val_neg": num_val_neg, "num_test_neg": num_test_neg}
    for name, count in counts.items():
        if count is not None and count < 1:
            raise ValueError(
                f"{who}: {name} must be a positive count (or None: one per positive), got {count}"
            )
    val_neg = _non_edges(who, table, n_val if num_val_neg is None else num_val_neg, n, undirected, gen)
    test_neg = _non_edges(who, table, n_test if num_test_neg is None else num_test_neg, n, undirected, gen)
    per_source = [None, None]
    if neg_per_source is not None:
        if neg_per_source < 1:
            raise ValueError(f"{who}: neg_per_source must be a positive count, got {neg_per_source}")
        per_source = [
            _per_source_non_edges(who, table, pos[0], neg_per_source, n, undirected, gen)
            for pos in (val_pos, test_pos)
        ]
    split = LinkSplit(train, val_pos, test_pos, val_neg, test_neg, n, undirected, *per_source)
    return training_graph(split), split


def training_graph(split: LinkSplit) -> CSRGraph:
    """The message graph of ``split``: its ``train`` edges, both directions when undirected."""
    src, dst = split.train
    return CSRGraph.from_edges(src, dst, split.num_nodes, symmetrize=split.undirected)


def candidate_keys(graph: CSRGraph, undirected: bool) -> Tensor:
    """Sorted keys of the edges of ``graph`` that a split may hold out: no self loops, and on an
    undirected split each ``{u, v}`` once (the key of ``min -> max``)."""
    keys = graph_keys(graph)
    src, dst = keys % graph.num_nodes, keys // graph.num_nodes
    keep = src != dst
    if not undirected:
        return keys[keep]
    return torch.unique(undirected_keys(src[keep], dst[keep], graph.num_nodes))


def _key_pairs(keys: Tensor, num_nodes: int) -> Tensor:
    return torch.stack([keys % num_nodes, keys // num_nodes])


def _keys(src: Tensor, dst: Tensor, num_nodes: int, undirected: bool) -> Tensor:
    return undirected_keys(src, dst, num_nodes) if undirected else pair_keys(src, dst, num_nodes)


def _other_node(src: Tensor, num_nodes: int, gen: torch.Generator) -> Tensor:
    """A uniform node other than ``src``, for each entry."""
    v = torch.randint(0, num_nodes - 1, src.shape, generator=gen)
    return v + (v >= src).to(torch.int64)


def _non_edges(
    who: str, table: Tensor, count: int, num_nodes: int, undirected: bool, gen: torch.Generator
) -> Tensor:
    """``count`` distinct pairs that are not in ``table``, uniform over them: rejection sampling in
    rounds, then a random ``count`` of the distinct survivors."""
    pairs = num_nodes * (num_nodes - 1) // (2 if undirected else 1)
    if count > pairs - table.numel():
        raise ValueError(
            f"{who}: cannot draw {count} negatives: the graph has {max(pairs - table.numel(), 0)} non-edges"
        )
    found = torch.empty(0, dtype=torch.int64)
    for _ in range(DRAW_ROUNDS):
        draws = 2 * (count - found.numel()) + 16
        u = torch.randint(0, num_nodes, (draws,), generator=gen)
        keys = _keys(u, _other_node(u, num_nodes, gen), num_nodes, undirected)
        found = torch.unique(torch.cat([found, keys[~contains(table, keys)]]))
        if found.numel() >= count:
            picked = found[torch.randperm(found.numel(), generator=gen)[:count]]
            return _key_pairs(picked, num_nodes)
    raise ValueError(
        f"{who}: found {found.numel()} of {count} negatives in {DRAW_ROUNDS} rounds; the graph is too dense"
    )


def _per_source_non_edges(
    who: str, table: Tensor, sources: Tensor, k: int, num_nodes: int, undirected: bool, gen: torch.Generator
) -> Tensor:
    """``[E, k]`` uniform destinations ``v != s`` with ``s -> v`` not in ``table``, per source ``s``;
    a rejected draw is redrawn (``DRAW_ROUNDS`` rounds at most)."""
    src = sources.repeat_interleave(k)
    dst = _other_node(src, num_nodes, gen)
    bad = torch.nonzero(contains(table, _keys(src, dst, num_nodes, undirected))).reshape(-1)
    for _ in range(DRAW_ROUNDS):
        if bad.numel() == 0:
            return dst.reshape(-1, k)
        dst[bad] = _other_node(src[bad], num_nodes, gen)
        bad = bad[contains(table, _keys(src[bad], dst[bad], num_nodes, undirected))]
    if bad.numel() == 0:
        return dst.reshape(-1, k)
    raise ValueError(
        f"{who}: source {int(src[bad[0]])} has too few non-neighbours for {k} negatives per source"
    )


def check_link_split(
    split: LinkSplit,
    num_nodes: int,
    graph: CSRGraph | None = None,
    source: str | Mapping[str, str] = "",
    strict: bool = True,
) -> LinkSplit:
    """Check ``split``; return it unchanged. Each failure is a one-line ``ValueError`` naming the
    field (and its file: ``source`` is one name for the whole split or a file per field):
    a node id outside ``[0, num_nodes)``, a split without edges, a positive in two splits, or a
    negative that is a true edge (of ``graph``, the full graph when given, or a positive of
    ``split``). An ``undirected`` split compares ``{u, v}`` in either direction. ``strict=False``
    checks the shapes and ids only: a published benchmark's split, scored as published even where
    its splits share an edge (ogbl-collab's collaborations repeat across years)."""
    files = dict(source) if isinstance(source, Mapping) else {}
    who = "link split" + (f" ({source})" if isinstance(source, str) and source else "")

    def name(field: str) -> str:
        return f"'{field}'" + (f" ({files[field]})" if field in files else "")

    if graph is not None and graph.num_nodes != num_nodes:
        raise ValueError(f"{who}: the graph has {graph.num_nodes} nodes, the split {num_nodes}")
    for field in POSITIVES + NEGATIVES:
        _check_pairs(who, name(field), getattr(split, field), num_nodes)
    for field, pos_field in PER_SOURCE.items():
        value = getattr(split, field)
        if value is not None:
            _check_per_source(who, name(field), value, getattr(split, pos_field).shape[1], num_nodes)
    if not strict:
        return split

    def keys(pairs: Tensor) -> Tensor:
        return _keys(pairs[0], pairs[1], num_nodes, split.undirected)

    positive = {field: torch.unique(keys(getattr(split, field))) for field in POSITIVES}
    for i, a in enumerate(POSITIVES):
        for b in POSITIVES[i + 1 :]:
            shared = positive[b][contains(positive[a], positive[b])]
            if shared.numel():
                raise ValueError(
                    f"{who}: fields {name(a)} and {name(b)} share {shared.numel()} edges "
                    f"(e.g. {_pair(shared[0], num_nodes)}); a positive belongs to one split"
                )
    true = list(positive.values())
    if graph is not None:
        true.append(keys(_key_pairs(graph_keys(graph), num_nodes)))
    table = torch.unique(torch.cat(true))
    for field in NEGATIVES:
        pairs = getattr(split, field)
        _no_true_edges(who, name(field), table, keys(pairs), num_nodes)
    for field, pos_field in PER_SOURCE.items():
        dst = getattr(split, field)
        if dst is not None:
            src = getattr(split, pos_field)[0].unsqueeze(1).expand_as(dst)
            _no_true_edges(who, name(field), table, keys(torch.stack([src, dst])), num_nodes)
    return split


def _pair(key: Tensor, num_nodes: int) -> str:
    return f"{int(key) % num_nodes} -> {int(key) // num_nodes}"


def _check_ids(who: str, name: str, t: Tensor, num_nodes: int) -> None:
    out = torch.nonzero((t < 0) | (t >= num_nodes))
    if out.numel():
        where = tuple(int(i) for i in out[0])
        raise ValueError(
            f"{who}: field {name} has node id {int(t[where])} outside [0, {num_nodes}) (at index {list(where)})"
        )


def _check_pairs(who: str, name: str, t: Tensor, num_nodes: int) -> None:
    if not isinstance(t, Tensor) or t.dtype != torch.int64:
        what = t.dtype if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{who}: field {name} must be an int64 tensor, got {what}")
    if t.dim() != 2 or t.shape[0] != 2:
        raise ValueError(f"{who}: field {name} has shape {tuple(t.shape)}, expected [2, E]")
    if t.shape[1] == 0:
        raise ValueError(f"{who}: field {name} has no edges")
    _check_ids(who, name, t, num_nodes)


def _check_per_source(who: str, name: str, t: Tensor, num_positives: int, num_nodes: int) -> None:
    if not isinstance(t, Tensor) or t.dtype != torch.int64:
        what = t.dtype if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{who}: field {name} must be an int64 tensor, got {what}")
    if t.dim() != 2 or t.shape[0] != num_positives or t.shape[1] == 0:
        raise ValueError(
            f"{who}: field {name} has shape {tuple(t.shape)}, expected [{num_positives}, k]: "
            "k destinations per positive of its split"
        )
    _check_ids(who, name, t, num_nodes)


def _no_true_edges(who: str, name: str, table: Tensor, keys: Tensor, num_nodes: int) -> None:
    hit = keys[contains(table, keys)]
    if hit.numel():
        raise ValueError(
            f"{who}: field {name} holds {hit.numel()} true edges (e.g. {_pair(hit[0], num_nodes)}); "
            "negatives must be non-edges of the full graph"
        )


def load_link_split_files(
    train: str | os.PathLike,
    val_pos: str | os.PathLike,
    test_pos: str | os.PathLike,
    val_neg: str | os.PathLike,
    test_neg: str | os.PathLike,
    *,
    num_nodes: int | None = None,
    undirected: bool = True,
    val_neg_per_source: str | os.PathLike | None = None,
    test_neg_per_source: str | os.PathLike | None = None,
    graph: CSRGraph | None = None,
) -> tuple[CSRGraph, LinkSplit]:
    """A split given as files, checked (``check_link_split``, against the full ``graph`` when
    given), and its training graph.

    Each pair file is read as ``load_arrays`` reads an edge list (``arrays.read_array``): a
    ``.npy``/``.npz``/``.pt`` array ``[2, E]`` or ``[E, 2]``, or a text file of two columns
    (optional header, comma or whitespace separated). A per-source file is an ``[E, k]`` array
    (``.npy``/``.npz``/``.pt``). ``num_nodes`` defaults to the largest id in any file plus one.
    On an ``undirected`` split, ``train`` keeps each ``{u, v}`` once; self loops are dropped from it.
    """
    paths = {"train": train, "val_pos": val_pos, "test_pos": test_pos, "val_neg": val_neg}
    paths.update(test_neg=test_neg, val_neg_per_source=val_neg_per_source)
    paths["test_neg_per_source"] = test_neg_per_source
    arrays, files = read_link_split_files({k: v for k, v in paths.items() if v is not None})
    if num_nodes is None:
        num_nodes = largest_id(arrays.values()) + 1
    split = link_split_of(arrays, num_nodes, undirected, files, graph=graph)
    return training_graph(split), split


def read_link_split_files(
    paths: Mapping[str, str | os.PathLike],
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The arrays of a split's files (field -> file, as ``load_link_split_files`` takes them),
    int64, pairs as ``[2, E]``; and each field's file name, for the messages."""
    arrays: dict[str, Tensor] = {}
    files: dict[str, str] = {}
    for field, given in paths.items():
        path = Path(given)
        files[field] = str(path)
        where = f"link split ({field}={path})"
        if field in PER_SOURCE:
            value = as_tensor(where, field, read_array(path, field))
            if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
                raise ValueError(
                    f"{where}: field '{field}' must hold integer node ids, got dtype {value.dtype}"
                )
            arrays[field] = value.to(torch.int64)
        elif field in POSITIVES + NEGATIVES:
            arrays[field] = torch.stack(edge_pairs(where, _pair_array(path, field), 1 << 62))
        else:
            raise ValueError(
                f"link split: unknown field {field!r} ({path}); expected {', '.join(POSITIVES + NEGATIVES)} "
                f"or {', '.join(PER_SOURCE)}"
            )
    return arrays, files


def largest_id(arrays: Iterable[Tensor]) -> int:
    """The largest node id in ``arrays`` (-1 when they hold none)."""
    return max((int(a.max()) for a in arrays if a.numel()), default=-1)


def link_split_of(
    arrays: Mapping[str, Tensor],
    num_nodes: int,
    undirected: bool,
    files: Mapping[str, str] | str = "",
    graph: CSRGraph | None = None,
    strict: bool = True,
) -> LinkSplit:
    """The ``LinkSplit`` of int64 arrays by field (pairs ``[2, E]``), checked
    (``check_link_split``; ``files`` names their sources in the messages). On an ``undirected``
    split ``train`` keeps each ``{u, v}`` once; self loops are dropped from it."""
    missing = [f for f in POSITIVES + NEGATIVES if f not in arrays]
    if missing:
        raise ValueError(
            f"link split: no {', '.join(repr(f) for f in missing)} given; a split needs all of "
            f"{', '.join(POSITIVES + NEGATIVES)}"
        )
    names = dict(files) if isinstance(files, Mapping) else {}
    who = "link split" + (f" ({files})" if isinstance(files, str) and files else "")
    for field, value in arrays.items():  # ids outside the graph, before any key is formed
        _check_ids(who, f"'{field}'" + (f" ({names[field]})" if field in names else ""), value, num_nodes)
    pairs = arrays["train"]
    pairs = pairs[:, pairs[0] != pairs[1]]
    if undirected:
        pairs = _key_pairs(torch.unique(undirected_keys(pairs[0], pairs[1], num_nodes)), num_nodes)
    split = LinkSplit(
        train=pairs,
        val_pos=arrays["val_pos"],
        test_pos=arrays["test_pos"],
        val_neg=arrays["val_neg"],
        test_neg=arrays["test_neg"],
        num_nodes=num_nodes,
        undirected=undirected,
        val_neg_per_source=arrays.get("val_neg_per_source"),
        test_neg_per_source=arrays.get("test_neg_per_source"),
    )
    return check_link_split(split, num_nodes, graph=graph, source=files, strict=strict)


def _pair_array(path: Path, field: str) -> Any:
    """A pair file's array: in a multi-array ``.npz``/``.pt`` the one named ``field`` (a whole
    split in one file, ``save_link_split``), otherwise the file read as an edge list."""
    if path.suffix.lower() in (".npz", ".pt"):
        try:
            return read_array(path, field)
        except ValueError:  # no array of that name: read as edges, which names what it found
            pass
    return read_array(path, "edges")


def save_link_split(split: LinkSplit, path: str | os.PathLike) -> Path:
    """``split`` as one ``.npz``, an array per field and its ``num_nodes`` and ``undirected``: the
    one file every system of a benchmark reads (``load_link_split``), so all score the same pairs."""
    fields = {f: getattr(split, f) for f in (*POSITIVES, *NEGATIVES, *PER_SOURCE)}
    arrays = {f: v.numpy() for f, v in fields.items() if v is not None}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:  # a file object: np.savez would append .npz to another suffix
        np.savez(f, **arrays, num_nodes=np.int64(split.num_nodes), undirected=np.bool_(split.undirected))
    return path


def load_link_split(path: str | os.PathLike, num_nodes: int | None = None) -> tuple[CSRGraph, LinkSplit]:
    """The split ``save_link_split`` wrote, read and checked by ``load_link_split_files`` (one file
    for every field), and its training graph. ``num_nodes``: the graph's, which must be the file's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"link split file not found: {path}")
    with np.load(path, allow_pickle=False) as f:
        held = set(f.files)
        meta = {k: f[k].item() for k in ("num_nodes", "undirected") if k in held}
    missing = sorted({*POSITIVES, *NEGATIVES, "num_nodes", "undirected"} - held)
    if missing:
        raise ValueError(
            f"link split ({path}): no {', '.join(missing)}; a split file is what save_link_split writes"
        )
    if num_nodes is not None and num_nodes != meta["num_nodes"]:
        raise ValueError(
            f"link split ({path}): a split of {meta['num_nodes']} nodes, the graph has {num_nodes}"
        )
    per_source = {f: path for f in PER_SOURCE if f in held}
    return load_link_split_files(
        *(path for _ in (*POSITIVES, *NEGATIVES)),
        num_nodes=int(meta["num_nodes"]),
        undirected=bool(meta["undirected"]),
        **per_source,
    )
