"""Your own graph as files: ``load_arrays`` reads ``.npy``, ``.npz``, ``.pt`` or a text edge list
and hands the arrays to ``GraphDataset.from_arrays``, which ends in ``validate_dataset`` as every
loader does: a bad input gets the same one-line ``ValueError`` naming the file, field and value.
"""

from __future__ import annotations

import codecs
import gzip
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

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
    name); ``edges`` may also be a text edge list of any other name, comma- or whitespace-separated
    (``read_edge_list``). ``splits``: one ``.npz``/``.pt`` holding ``train``,
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
    if suffix in _BINARY:
        _check_binary(path, suffix, field)
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
    if field == "edges":
        if _text_head(path) is None:
            raise ValueError(
                f"{path}: neither a .npy, .npz or .pt file nor a text edge list (binary, or not UTF-8)"
            )
        return read_edge_list(path).T  # [2, E]: two edges as [E, 2] would read as [2, E]
    if suffix in (".csv", ".txt", ".tsv"):
        raise ValueError(
            f"{path}: a {suffix} file is read as an edge list; give {field} as .npy, .npz or .pt"
        )
    raise ValueError(
        f"{path}: unknown file type {suffix!r} for {field}; expected .npy, .npz, .pt (or a text edge list for "
        "edges)"
    )


# What each binary format holds, and the bytes it starts with (a .pt is a zip or a legacy pickle).
_BINARY = {
    ".npy": ("an array written by numpy.save", (b"\x93NUMPY",)),
    ".npz": ("arrays written by numpy.savez", (b"PK\x03\x04", b"PK\x05\x06")),
    ".pt": ("tensors written by torch.save", ()),
}


def _check_binary(path: Path, suffix: str, field: str) -> None:
    """Name an empty, text or foreign file under a binary suffix before numpy or torch reads it:
    numpy takes any file that is not .npy or .npz for pickled data and suggests unsafe loading."""
    holds, magic = _BINARY[suffix]
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    if not head:
        raise ValueError(f"{path}: the file is empty; expected {holds}")
    if magic and head.startswith(magic):
        return
    text = _as_text(head)
    if text is not None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        if field == "edges":
            name = path.with_suffix(".csv" if "," in first.split("#", 1)[0] else ".txt").name
            hint = f"an edge list in text is read from a text file: name it {name}"
        else:
            hint = f"give {field} as {holds}"
        raise ValueError(f"{path}: not a {suffix} file: it holds text (first line {first[:60]!r}); {hint}")
    if magic:
        raise ValueError(f"{path}: not a {suffix} file (it lacks the {suffix} header); expected {holds}")


_HEAD_BYTES = 4096


def _as_text(head: bytes) -> str | None:
    """``head`` decoded when it reads as UTF-8 text (no NUL bytes), else None."""
    if b"\0" in head:
        return None
    try:
        return codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=False)
    except UnicodeDecodeError:
        return None


def _text_head(path: Path) -> str | None:
    """The start of ``path`` (decompressed when it ends in .gz) if it is text, else None."""
    try:
        with _open(path) as f:
            return _as_text(f.read(_HEAD_BYTES))
    except OSError:  # a .gz that is not gzip
        return None


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path) if path.suffix.lower() == ".gz" else open(path, "rb")


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


_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)


def read_edge_list(path: Path) -> np.ndarray:
    """A text edge list as int64 ``[E, 2]``, each line's first two columns being source and target
    (further ones, such as a weight or networkx's ``{}``, are ignored). Columns are split at commas
    when the first line's first column holds one (CSV: every line then has the first line's number
    of cells), else at whitespace (SNAP files, networkx's ``write_edgelist``). ``#`` starts a comment,
    a first line without ids is a header, a ``.gz`` file is decompressed; a bad line is named by its
    number."""
    first = _first_data_line(path)
    if first is None:
        what = "empty" if _is_blank(path) else "only comments and blank lines"
        raise ValueError(f"{path}: no edges: the file is {what}; expected lines of two integer node ids")
    number, text = first
    delimiter = "," if "," in text.split()[0] else None
    cells = _cells(text, delimiter)
    header = not any(_INT.fullmatch(c) for c in cells[:2])
    width = len(cells)
    if delimiter is None or width == 2:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            try:
                edges = np.loadtxt(
                    path,
                    dtype=np.int64,
                    delimiter=delimiter,
                    comments="#",
                    skiprows=number if header else 0,
                    usecols=None if delimiter else (0, 1),
                    ndmin=2,
                    encoding="utf-8-sig",
                )
            except ValueError:
                edges = None  # a malformed line: the reading below names it
    else:
        edges = None
    if edges is None:
        edges = _parse_edge_lines(path, delimiter, width, skip=number if header else 0)
    if not len(edges):
        raise ValueError(f"{path}: no edges: only the header line {text!r}")
    return edges


def _parse_edge_lines(path: Path, delimiter: str | None, width: int, skip: int) -> np.ndarray:
    edges = []
    for number, line in _lines(path):
        text = line.split("#", 1)[0].strip()
        if number <= skip or not text:
            continue
        cells = _cells(text, delimiter)
        if delimiter and len(cells) != width:
            raise ValueError(
                f"{path}: line {number} is {text!r}; expected {width} comma-separated cells, as the "
                "first line has"
            )
        if len(cells) < 2 or not (_INT.fullmatch(cells[0]) and _INT.fullmatch(cells[1])):
            raise ValueError(
                f"{path}: line {number} is {text!r}; expected two integer node ids (source, target)"
            )
        edges.append((int(cells[0]), int(cells[1])))
    return np.asarray(edges, dtype=np.int64).reshape(-1, 2)


def _cells(text: str, delimiter: str | None) -> list[str]:
    return [c.strip() for c in text.split(delimiter)] if delimiter else text.split()


def _first_data_line(path: Path) -> tuple[int, str] | None:
    """The number and text (comment cut) of the first line holding anything, or None."""
    for number, line in _lines(path):
        text = line.split("#", 1)[0].strip()
        if text:
            return number, text
    return None


def _is_blank(path: Path) -> bool:
    return not any(line.strip() for _, line in _lines(path))


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``path``'s lines, numbered from 1; one that is not UTF-8 is an error naming its number."""
    with _open(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: line {number} is not UTF-8 text ({err.reason})") from None
