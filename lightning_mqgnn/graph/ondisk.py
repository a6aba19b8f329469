"""Datasets on disk: a folder of ``.npy`` arrays and a manifest, memory-mapped when opened.

A dataset whose features do not fit in memory is read where it lies: ``open_dataset`` maps each
array (copy-on-write, ``mapped_pages.map_array``), so a batch reads only its own rows from the
page cache and the kernel keeps what is hot; sampler workers and the ranks of one machine map the
same files and share those pages. Nothing is read at open beyond the manifest and the ``.npy``
headers. ``resident_gb`` bounds the mapped pages each process holds (``bound_resident_pages``),
so the RSS of a run over a graph larger than the memory stays under it.

Layout (format ``lightning_mqgnn-ondisk``, version 1), every array a standard ``.npy`` file
(C order) that numpy opens without this package:

- ``indptr.npy`` int64 ``[N + 1]``, ``indices.npy`` int64 ``[E]``: the CSR topology (``CSRGraph``)
- ``features.npy`` float32 ``[N, F]``, or float16 or bfloat16 (``graph.feature_dtypes``: the
  model reads them widened to float32; a bfloat16 file holds the values' uint16 words)
- ``labels.npy`` int64 ``[N]`` (or float32 ``[N, T]`` for a multi-label task)
- ``train_idx.npy``, ``val_idx.npy``, ``test_idx.npy`` int64
- ``manifest.json``: name, sizes, classes, metric, and each array's dtype, shape and byte size

``write_dataset`` (the converter, ``recipes/convert.py``) writes a dataset in row chunks into a
hidden folder beside the target and renames it into place after the manifest, so a folder that
``open_dataset`` accepts is always complete: a failed or interrupted write (a full disk included)
leaves at most the hidden folder, which the next write of that target removes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from lightning_mqgnn.durable import fsync_folder
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.feature_dtypes import (
    FEATURE_DTYPES,
    check_feature_dtype,
    narrowed,
    storage_dtype,
    torch_dtype,
)
from lightning_mqgnn.graph.mapped_pages import bound_resident_pages, map_array
from lightning_mqgnn.graph.npy import read_npy_header

__all__ = [
    "FORMAT",
    "ArrayFile",
    "DatasetWriter",
    "Manifest",
    "MappedDataset",
    "OnDiskError",
    "open_dataset",
    "write_dataset",
]

FORMAT = "lightning_mqgnn-ondisk"
VERSION = 1
MANIFEST = "manifest.json"
CHUNK_BYTES = 64 << 20  # what one write holds beyond the source: a chunk of rows, converted
ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")


@dataclass
class MappedDataset(GraphDataset):
    """A ``GraphDataset`` whose arrays are memory-mapped from ``folder`` (``open_dataset``).

    It goes to another process (a spawned sampler worker or rank) as its folder, which that
    process maps again, so the page cache, not a copy, is what they share; ``share_memory_``
    leaves it as it is, and its pages are not collapsed into huge pages (which would read the
    whole file). Its arrays are the files': a dataset derived from it with other arrays is a
    plain ``GraphDataset``.
    """

    folder: Path | None = None
    resident_gb: float | None = None

    @override
    def __post_init__(self) -> None:
        pass

    @override
    def share_memory_(self) -> MappedDataset:
        return self

    @override
    def __reduce_ex__(self, protocol):
        return open_dataset, (self.folder, self.resident_gb)


class OnDiskError(RuntimeError):
    """An on-disk dataset that cannot be written or opened; the message is one line naming the
    folder, the file and what is wrong with it."""


@dataclass(frozen=True)
class ArrayFile:
    """One array of the layout: ``<name>.npy`` with this dtype (torch's name) and shape."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * storage_dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` records: enough to check every file before mapping it."""

    name: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    metric: str
    arrays: dict[str, ArrayFile]
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        if not folder.is_dir():
            raise OnDiskError(f"{folder}: no such folder (write one with recipes/convert.py)")
        if not path.is_file():
            raise OnDiskError(f"{folder}: not an on-disk dataset: {MANIFEST} is missing")
        try:
            raw = json.loads(path.read_text())
            if raw.get("format") != FORMAT:
                raise OnDiskError(f"{path}: field 'format' is {raw.get('format')!r}, expected {FORMAT!r}")
            if raw.get("version") != VERSION:
                raise OnDiskError(
                    f"{path}: field 'version' is {raw.get('version')!r}; this version reads {VERSION}"
                )
            arrays = {
                k: ArrayFile(v["dtype"], tuple(int(s) for s in v["shape"]))
                for k, v in raw.pop("arrays").items()
            }
            manifest = cls(**raw, arrays=arrays)
        except OnDiskError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise OnDiskError(f"{path}: not a readable manifest ({type(err).__name__}: {err})") from err
        missing = [a for a in ARRAYS if a not in manifest.arrays]
        if missing:
            raise OnDiskError(f"{path}: field 'arrays' lacks {missing}")
        manifest.check_shapes(path)
        return manifest

    def check_shapes(self, where: Path) -> None:
        """The arrays' shapes agree with the sizes (a manifest edited by hand, or another dataset's)."""
        a = self.arrays
        expected = {
            "indptr": (self.num_nodes + 1,),
            "indices": (self.num_edges,),
            "features": (self.num_nodes, self.num_features),
        }
        for name, shape in expected.items():
            if a[name].shape != shape:
                raise OnDiskError(f"{where}: array '{name}' has shape {a[name].shape}, expected {shape}")
        if a["features"].dtype not in FEATURE_DTYPES:
            raise OnDiskError(
                f"{where}: array 'features' has dtype {a['features'].dtype!r}, expected one of {FEATURE_DTYPES}"
            )
        if a["labels"].shape[0] != self.num_nodes:
            raise OnDiskError(
                f"{where}: array 'labels' has {a['labels'].shape[0]} rows, expected {self.num_nodes}"
            )


class DatasetWriter:
    """Writes one on-disk dataset: ``array`` per array of the layout, each from an iterable of
    row chunks, then ``finish`` with the sizes. The files go into a hidden folder beside
    ``folder``, renamed into place by ``finish``; a write that fails (a full disk: one
    ``OnDiskError`` line) or is abandoned leaves nothing that ``open_dataset`` would open.

        with DatasetWriter(folder) as w:
            w.features(chunks, (n, f), "float16")
            w.array("labels", chunks, "int64", (n,))
            ...
            w.finish(name=..., num_classes=..., metric=...)
    """

    def __init__(self, folder: str | os.PathLike, *, overwrite: bool = False):
        self.folder = Path(folder)
        if self.folder.exists() and not overwrite:
            raise OnDiskError(
                f"{self.folder}: already exists; pass overwrite=True "
                "(recipes/convert.py overwrite=true) to replace it"
            )
        self.partial = self.folder.with_name(f".{self.folder.name}.partial-{os.getpid()}")
        self.arrays: dict[str, ArrayFile] = {}
        self.writing: Path | None = None  # the file being written, named if a write fails

    def __enter__(self) -> DatasetWriter:
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(self.folder)
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir()
        return self

    def __exit__(self, kind, err, tb) -> bool:
        if err is None:
            return False
        shutil.rmtree(self.partial, ignore_errors=True)
        if isinstance(err, OSError):
            where = err.filename or self.writing
            what = Path(where).name if where else "the folder"
            raise OnDiskError(
                f"{self.folder}: writing {what} failed ({err.strerror or err}); nothing was left behind"
            ) from err
        return False

    def array(self, name: str, chunks: Iterable[np.ndarray], dtype: str, shape: tuple[int, ...]) -> None:
        """``<name>.npy`` of ``dtype`` (torch's name) and ``shape`` from ``chunks``: C-ordered row
        blocks of ``storage_dtype(dtype)`` whose rows add up to ``shape[0]``."""
        dtype_ = storage_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        path = self.writing = self.partial / f"{name}.npy"
        header = {"descr": np.lib.format.dtype_to_descr(dtype_), "fortran_order": False, "shape": shape}
        rows = 0
        with open(path, "wb") as f:
            np.lib.format.write_array_header_2_0(f, header)
            for chunk in chunks:
                chunk = np.ascontiguousarray(chunk, dtype=dtype_)
                if chunk.shape[1:] != shape[1:]:
                    raise ValueError(f"{path}: a chunk of shape {chunk.shape} in an array of shape {shape}")
                f.write(chunk.data)
                rows += chunk.shape[0] if chunk.ndim else 1
            if rows != (shape[0] if shape else 1):
                raise ValueError(f"{path}: chunks of {rows} rows in total, expected {shape[0]}")
            f.flush()
            os.fsync(f.fileno())
        self.arrays[name] = ArrayFile(dtype, shape)

    def features(self, chunks: Iterable[np.ndarray], shape: tuple[int, ...], dtype: str = "float32") -> None:
        """``features.npy`` from float32 row ``chunks``, stored as ``dtype`` (one of
        ``FEATURE_DTYPES``; a value out of its range is a ``ValueError`` naming node and column)."""
        check_feature_dtype(dtype)  # before the file is begun

        def stored() -> Iterator[np.ndarray]:
            first = 0
            for chunk in chunks:
                try:
                    yield narrowed(chunk, dtype, first)
                except ValueError as err:
                    raise ValueError(f"{self.folder}: {err}") from None
                first += len(chunk)

        self.array("features", stored(), dtype, shape)

    def tensor(self, name: str, t: Tensor) -> None:
        """``<name>.npy`` from the tensor ``t``, in ``tensor_chunks``, with its dtype and shape."""
        self.array(name, tensor_chunks(t), str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def finish(self, *, name: str, num_classes: int, metric: str) -> Path:
        """Write the manifest and rename the folder into place (replacing an older one)."""
        missing = [a for a in ARRAYS if a not in self.arrays]
        if missing:
            raise ValueError(f"{self.folder}: arrays {missing} were not written")
        features = self.arrays["features"].shape
        manifest = Manifest(
            name=name,
            num_nodes=features[0],
            num_edges=self.arrays["indices"].shape[0],
            num_features=features[1],
            num_classes=int(num_classes),
            metric=metric,
            arrays=dict(self.arrays),
        )
        manifest.check_shapes(self.partial / MANIFEST)
        _write_durably(self.partial / MANIFEST, manifest.to_json().encode())
        fsync_folder(self.partial)
        if self.folder.exists():
            old = self.folder.with_name(f".{self.folder.name}.old-{os.getpid()}")
            self.folder.rename(old)
            self.partial.rename(self.folder)
            shutil.rmtree(old)
        else:
            self.partial.rename(self.folder)
        fsync_folder(self.folder.parent)
        return self.folder


def tensor_chunks(t: Tensor, dtype: torch.dtype | None = None) -> Iterator[np.ndarray]:
    """Row chunks of ``t`` of about ``CHUNK_BYTES`` each, as numpy views (no copy), or each
    converted to ``dtype``."""
    t = t.detach().cpu().contiguous()
    row_bytes = (t[0].numel() if t.dim() > 1 and t.shape[0] else 1) * t.element_size()
    step = max(CHUNK_BYTES // max(row_bytes, 1), 1)
    for start in range(0, t.shape[0], step):
        yield t[start : start + step].to(dtype or t.dtype).numpy()


def write_dataset(
    dataset: GraphDataset,
    folder: str | os.PathLike,
    *,
    overwrite: bool = False,
    features_dtype: str = "float32",
) -> Path:
    """Write ``dataset`` to ``folder`` in the on-disk layout (module docstring); returns the folder.

    Arrays are written in chunks of rows (``CHUNK_BYTES``) straight from the dataset's tensors,
    the features as ``features_dtype`` (``graph.feature_dtypes``).
    An existing ``folder`` is an error unless ``overwrite``; it is replaced only once the new one
    is complete.
    """
    g = dataset.graph
    tensors = {
        "indptr": g.indptr,
        "indices": g.indices,
        "labels": dataset.labels,
        "train_idx": dataset.train_idx,
        "val_idx": dataset.val_idx,
        "test_idx": dataset.test_idx,
    }
    with DatasetWriter(folder, overwrite=overwrite) as writer:
        features = dataset.features
        writer.features(tensor_chunks(features, torch.float32), tuple(features.shape), features_dtype)
        for name, t in tensors.items():
            writer.tensor(name, t)
        return writer.finish(name=dataset.name, num_classes=dataset.num_classes, metric=dataset.metric)


def open_dataset(path: str | os.PathLike, resident_gb: float | None = None) -> MappedDataset:
    """The dataset in ``path`` (written by ``write_dataset``) with its arrays memory-mapped.

    ``resident_gb``: the file-backed resident memory each process that maps the dataset keeps
    (``bound_resident_pages``; None: as the kernel leaves it, which under a graph larger than
    the memory is most of the memory).

    Checks, before mapping anything: the manifest (format, version, fields, shapes that agree),
    each file's ``.npy`` header against the manifest and its size against the header (a truncated
    copy), and the topology's ends (``indptr[0] == 0``, ``indptr[-1] == E``). Every failure is
    one ``OnDiskError`` line naming the file. The values themselves were checked when the dataset
    was loaded for writing; they are not scanned again here.
    """
    folder = Path(path).expanduser()
    if resident_gb is not None and not resident_gb > 0:
        raise ValueError(f"resident_gb must be positive or null, got {resident_gb}")
    manifest = Manifest.read(folder)
    arrays = {name: _map_array(folder / f"{name}.npy", manifest.arrays[name]) for name in ARRAYS}
    indptr = arrays["indptr"]
    if int(indptr[0]) != 0 or int(indptr[-1]) != manifest.num_edges:
        raise OnDiskError(
            f"{folder / 'indptr.npy'}: runs from {int(indptr[0])} to {int(indptr[-1])}, "
            f"expected 0 to {manifest.num_edges} (the edges of indices.npy)"
        )
    graph = CSRGraph(indptr=indptr, indices=arrays["indices"], num_nodes=manifest.num_nodes)
    dataset = MappedDataset(
        name=manifest.name,
        graph=graph,
        features=arrays["features"],
        labels=arrays["labels"],
        train_idx=arrays["train_idx"],
        val_idx=arrays["val_idx"],
        test_idx=arrays["test_idx"],
        num_classes=manifest.num_classes,
        metric=manifest.metric,
        folder=folder.resolve(),
        resident_gb=resident_gb,
    )
    if resident_gb is not None:
        bound_resident_pages(int(resident_gb * 2**30))
    return dataset


def _map_array(path: Path, expected: ArrayFile) -> Tensor:
    if not path.is_file():
        raise OnDiskError(f"{path}: missing (the manifest lists it)")
    with open(path, "rb") as f:
        try:
            shape, fortran, dtype = read_npy_header(f)
        except ValueError as err:
            raise OnDiskError(f"{path}: not a .npy file ({err})") from err
        offset = f.tell()
    if (dtype, shape) != (storage_dtype(expected.dtype), expected.shape) or fortran:
        raise OnDiskError(
            f"{path}: holds {dtype.name} {shape}, the manifest says {expected.dtype} {expected.shape}"
        )
    size, whole = path.stat().st_size, offset + expected.nbytes
    if size != whole:
        what = "truncated" if size < whole else "trailing bytes"
        raise OnDiskError(f"{path}: {size:,} bytes, expected {whole:,} ({what})")
    if expected.nbytes == 0:  # an empty mapping is not allowed
        return torch.empty(expected.shape, dtype=torch_dtype(expected.dtype))
    # readahead stays on unless the page cache cannot hold the file (mapped_pages): on a graph that
    # fits the memory, MADV_RANDOM made a cold epoch 5x slower (BENCHMARKS.md)
    return map_array(path, offset, expected.dtype, expected.shape)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove_stale_partials(folder: Path) -> None:
    """Hidden folders of earlier writes of ``folder`` whose process has ended."""
    for leftover in folder.parent.glob(f".{folder.name}.partial-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
