"""Your own graph as files: ``load_arrays`` reads ``.npy``, ``.npz``, ``.pt`` or a CSV edge list
and hands the arrays to ``GraphDataset.from_arrays``, which ends in ``validate_dataset`` as every
loader does: a bad input gets the same one-line ``ValueError`` naming the file, field and value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.fields import SPLITS


def load_arrays(
    edges: str | Path,
    features: str | Path,
    labels: str | Path,
    splits: str | Path | Mapping[str, str | Path] | None = None,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    metric: str = "accuracy",
    name: str = "arrays",
    make_undirected: bool = True,
    num_classes: int | None = None,
) -> GraphDataset:
    """``GraphDataset.from_arrays`` on files. Each of ``edges``, ``features`` and ``labels`` is a ``.npy``, a
    ``.pt`` (a tensor), or a ``.npz``/``.pt`` dict holding one array (or one under the field's
    name); ``edges`` may also be a ``.csv``/``.txt`` edge list, two integer columns a line (a header
    line and ``#`` comments are skipped). ``splits``: one ``.npz``/``.pt`` holding ``train``,
    ``val`` and ``test`` (ids or boolean masks), or a mapping of the three to files."""
    paths = {"edges": Path(edges), "features": Path(features), "labels": Path(labels)}
    arrays = {field: read_array(path, field) for field, path in paths.items()}
    split_arrays = None
    if isinstance(splits, Mapping):
        split_arrays = {s: read_array(Path(p), s) for s, p in splits.items()}
    elif splits is not None:
        split_arrays = _read_splits(Path(splits))
    source = ", ".join(f"{field}={path}" for field, path in paths.items())
    return GraphDataset.from_arrays(
        arrays["edges"],
        arrays["features"],
        arrays["labels"],
        splits=split_arrays,
        split_fractions=split_fractions,
        seed=seed,
        metric=metric,
        name=name,
        make_undirected=make_undirected,
        num_classes=num_classes,
        source=source,
    )


_FIELD_KEYS = {
    "edges": ("edges", "edge_index"),
    "features": ("features", "x"),
    "labels": ("labels", "y"),
}


def read_array(path: Path, field: str) -> Any:
    """One array from ``path`` for ``field`` (see ``load_arrays`` for the formats)."""
    if not path.is_file():
        raise FileNotFoundError(f"{field} file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".txt", ".tsv"):
        if field != "edges":
            raise ValueError(
                f"{path}: a {suffix} file is read as an edge list; give {field} as .npy, .npz or .pt"
            )
        return read_edge_list(path)
    if suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a readable pickle-free .npy file ({err})") from err
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                return _pick(path, field, {k: f[k] for k in f.files})
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a readable pickle-free .npz file ({err})") from err
    if suffix == ".pt":
        try:
            value = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a foreign or truncated file: whatever the unpickler raises
            raise ValueError(
                f"{path}: not a readable .pt file of tensors ({str(err).splitlines()[0]})"
            ) from err
        return _pick(path, field, value) if isinstance(value, Mapping) else value
    raise ValueError(
        f"{path}: unknown file type {suffix!r} for {field}; expected .npy, .npz, .pt (or .csv for edges)"
    )


def _pick(path: Path, field: str, arrays: Mapping[str, Any]) -> Any:
    """The array of a multi-array file meant for ``field``: the only one, or the one under its name."""
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    for key in _FIELD_KEYS.get(field, (field,)):
        if key in arrays:
            return arrays[key]
    raise ValueError(
        f"{path}: holds {sorted(arrays)}; expected one array or one named {' or '.join(_FIELD_KEYS.get(field, (field,)))}"
    )


def _read_splits(path: Path) -> dict[str, Any]:
    if path.suffix.lower() not in (".npz", ".pt"):
        raise ValueError(f"{path}: splits are read from an .npz or .pt file holding train, val and test")
    held = (
        read_array(path, "splits")
        if path.suffix.lower() == ".pt"
        else dict(np.load(path, allow_pickle=False))
    )
    if not isinstance(held, Mapping):
        raise ValueError(f"{path}: expected a dict of train, val and test, got {type(held).__name__}")
    out = {}
    for s in SPLITS:
        key = next((k for k in (s, f"{s}_idx", f"{s}_mask") if k in held), None)
        if key is None:
            raise ValueError(f"{path}: no '{s}' (or '{s}_idx', '{s}_mask') in {sorted(held)}")
        out[s] = held[key]
    return out


def read_edge_list(path: Path) -> np.ndarray:
    """A text edge list, ``src,dst`` (comma, tab or spaces) a line, as int64 ``[E, 2]``; a bad line
    is named by its number."""
    delimiter = "," if path.suffix.lower() == ".csv" else None
    try:
        return np.loadtxt(path, dtype=np.int64, delimiter=delimiter, comments="#", ndmin=2)
    except ValueError:
        pass  # a header line, or a malformed one: find which
    edges = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            cells = [c.strip() for c in (text.split(delimiter) if delimiter else text.split())]
            try:
                if len(cells) != 2:
                    raise ValueError
                edges.append((int(cells[0]), int(cells[1])))
            except ValueError:
                if not edges and not any(c.lstrip("-").isdigit() for c in cells):
                    continue  # a header
                raise ValueError(
                    f"{path}: line {number} is {text!r}; expected two integer node ids (source, target)"
                ) from None
    if not edges:
        raise ValueError(f"{path}: no edges found (expected lines of two integer node ids)")
    return np.asarray(edges, dtype=np.int64)
