"""The published files of the named datasets, converted to the project's npz layout (``graph.npz``).

Three source formats:

- **Planetoid** (Yang et al. 2016; cora, citeseer, pubmed): eight Python 2 pickles per dataset,
  ``ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}``. The split is the published one: the
  ``y`` rows train, the next 500 validate, ``test.index`` tests. citeseer's test index skips 15 ids
  (nodes without a published row); they keep an empty feature row and class 0, as PyG and DGL do.
- **GraphData npz** (amazon_*, coauthor_*, dblp; the arrays of Shchur et al. 2018 and Bojchevski &
  Günnemann 2018): pickled scipy matrices ``adj_matrix`` and ``node_attr``, and ``node_label``;
  no split is published, so a seeded random 60/20/20 one is drawn (``random_split``).
- **Heterophilous-graphs npz** (Platonov et al. 2023; tolokers): dense ``node_features``, an
  ``edges`` list and ten published split masks, of which the first is used.

Pickles are read with an unpickler that builds only numpy arrays, scipy sparse matrices and
Python containers, so a tampered file fails with an error instead of running code (the registry
also checks every file's sha256 before it gets here).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import scipy.sparse as sp

from lightning_mqgnn.graph.npy import read_npy_header

# the globals besides numpy's and scipy.sparse's classes that the published pickles reference
_PICKLE_GLOBALS = {
    ("collections", "defaultdict"),
    ("builtins", "list"),
    ("__builtin__", "list"),
    ("builtins", "object"),
    ("__builtin__", "object"),
    ("copyreg", "_reconstructor"),
    ("copy_reg", "_reconstructor"),
    ("_codecs", "encode"),  # how Python 3 writes bytes into a protocol 2 pickle
}
_NUMPY_FUNCTIONS = ("_reconstruct", "scalar", "_frombuffer")


class _DataUnpickler(pickle.Unpickler):
    """Finds only numpy arrays, dtypes and scalars, scipy sparse matrices and a few builtins;
    anything else (a function that opens files or runs commands) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PICKLE_GLOBALS:
            return super().find_class(module, name)
        if module.split(".")[0] == "numpy":
            found = super().find_class(module, name)
            data_type = isinstance(found, type) and issubclass(found, (np.ndarray, np.dtype, np.generic))
            if (data_type and found is not np.memmap) or name in _NUMPY_FUNCTIONS:
                return found
        if module.startswith("scipy.sparse"):
            found = super().find_class(module, name)
            if isinstance(found, type) and issubclass(found, (sp.spmatrix, sp.sparray)):
                return found
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _unpickle(f: BinaryIO, who: str) -> Any:
    try:
        return _DataUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as err:
        raise ValueError(f"{who}: not a readable data pickle ({err})") from err


def _npz_member(path: Path, key: str) -> Any:
    """One array of an ``.npz``; object arrays (pickled scipy matrices) through ``_DataUnpickler``."""
    who = f"{path.name}['{key}']"
    try:
        with zipfile.ZipFile(path) as z, z.open(f"{key}.npy") as f:
            shape, fortran, dtype = read_npy_header(f)
            if dtype.hasobject:
                value = _unpickle(f, who)
                return value.item() if isinstance(value, np.ndarray) and value.shape == () else value
            data = np.frombuffer(f.read(), dtype=dtype)
            return data.reshape(shape, order="F" if fortran else "C")
    except KeyError as err:
        raise ValueError(f"{path}: missing array '{key}'") from err
    except (OSError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a readable .npz file ({err})") from err


def _clean_adjacency(adj: sp.spmatrix) -> sp.csr_matrix:
    """Symmetric, simple (no self loops, no duplicates), sorted CSR: the npz layout's adjacency."""
    adj = sp.csr_matrix(adj)
    adj = ((adj + adj.T) != 0).astype(np.int64).tocsr()
    adj.setdiag(0)
    adj.eliminate_zeros()
    adj.sort_indices()
    return adj


def _layout(
    adj: sp.spmatrix, features: sp.spmatrix, labels: np.ndarray, splits: tuple[np.ndarray, ...], metric: str
) -> dict[str, np.ndarray]:
    adj = _clean_adjacency(adj)
    x = sp.csr_matrix(features, dtype=np.float32)
    x.eliminate_zeros()
    x.sort_indices()
    train, val, test = (np.sort(np.asarray(s, dtype=np.int64)) for s in splits)
    return {
        "indptr": adj.indptr.astype(np.int64),
        "indices": adj.indices.astype(np.int64),
        "x_indptr": x.indptr.astype(np.int64),
        "x_indices": x.indices.astype(np.int64),
        "x_data": x.data.astype(np.float32),
        "x_shape": np.array(x.shape, dtype=np.int64),
        "y": np.asarray(labels, dtype=np.int64).reshape(-1),
        "train_idx": train,
        "val_idx": val,
        "test_idx": test,
        "metric": np.array(metric),
    }


def random_split(num_nodes: int, seed: int = 0, train: float = 0.6) -> tuple[np.ndarray, ...]:
    """A seeded random split: ``int(train * N)`` training nodes, the rest halved into validation
    and test (validation rounded down)."""
    perm = np.random.default_rng(seed).permutation(num_nodes)
    n_train = int(train * num_nodes)
    n_val = (num_nodes - n_train) // 2
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


def planetoid(files: dict[str, Path], name: str) -> dict[str, np.ndarray]:
    """``ind.<name>.*`` (Planetoid's published pickles) to the npz layout, with the public split."""
    parts = {}
    for part in ("x", "tx", "allx", "y", "ty", "ally", "graph"):
        path = files[f"ind.{name}.{part}"]
        with open(path, "rb") as f:
            parts[part] = _unpickle(f, str(path))
    test_path = files[f"ind.{name}.test.index"]
    try:
        test_index = np.loadtxt(test_path, dtype=np.int64, ndmin=1)
    except ValueError as err:
        raise ValueError(f"{test_path}: expected one integer node id per line ({err})") from err
    ordered = np.sort(test_index)
    tx, ty = sp.csr_matrix(parts["tx"]), np.asarray(parts["ty"])
    span = int(ordered[-1] - ordered[0]) + 1
    if span != len(test_index):  # citeseer: ids without a published row get an empty one
        rows = ordered - ordered[0]
        padded = sp.lil_matrix((span, tx.shape[1]), dtype=tx.dtype)
        padded[rows] = tx
        tx = padded.tocsr()
        ty_padded = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        ty_padded[rows] = ty
        ty = ty_padded
    features = sp.vstack([sp.csr_matrix(parts["allx"]), tx]).tolil()
    features[test_index] = features[ordered]  # rows were published in test.index order
    onehot = np.vstack([np.asarray(parts["ally"]), ty])
    onehot[test_index] = onehot[ordered]
    num_nodes = features.shape[0]
    src = [u for u, vs in parts["graph"].items() for _ in vs]
    dst = [v for vs in parts["graph"].values() for v in vs]
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if src.size and max(src.max(), dst.max()) >= num_nodes:
        bad = int(max(src.max(), dst.max()))
        raise ValueError(f"ind.{name}.graph: node id {bad} outside [0, {num_nodes}) (rows of allx + tx)")
    adj = sp.coo_matrix((np.ones(src.size), (src, dst)), shape=(num_nodes, num_nodes))
    n_train = np.asarray(parts["y"]).shape[0]
    splits = (np.arange(n_train), np.arange(n_train, n_train + 500), ordered)
    return _layout(adj, features, onehot.argmax(1), splits, "accuracy")


def graph_data_npz(files: dict[str, Path], name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A GraphData ``<name>.npz`` (``adj_matrix``, ``node_attr``, ``node_label``) to the npz
    layout, with ``random_split(N, seed)``."""
    (path,) = files.values()
    adj, attr = _npz_member(path, "adj_matrix"), _npz_member(path, "node_attr")
    labels = np.asarray(_npz_member(path, "node_label"))
    for key, value in (("adj_matrix", adj), ("node_attr", attr)):
        if not sp.issparse(value):
            raise ValueError(f"{path}: '{key}' is a {type(value).__name__}, expected a scipy sparse matrix")
    return _layout(adj, attr, labels, random_split(labels.shape[0], seed), "accuracy")


def heterophilous_npz(files: dict[str, Path], name: str, split: int = 0) -> dict[str, np.ndarray]:
    """A heterophilous-graphs ``<name>.npz`` to the npz layout, with published split ``split``;
    binary tasks (tolokers, questions, minesweeper) are scored by ROC-AUC, as their paper does."""
    (path,) = files.values()
    features = np.asarray(_npz_member(path, "node_features"))
    labels = np.asarray(_npz_member(path, "node_labels"))
    edges = np.asarray(_npz_member(path, "edges"), dtype=np.int64).reshape(-1, 2)
    n = labels.shape[0]
    adj = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    splits = tuple(np.nonzero(_npz_member(path, f"{s}_masks")[split])[0] for s in ("train", "val", "test"))
    metric = "rocauc" if int(labels.max()) == 1 else "accuracy"
    return _layout(adj, features, labels, splits, metric)


def write_npz(arrays: dict[str, np.ndarray], path: Path) -> None:
    """Write ``arrays`` to ``path`` so that a reader never sees a half-written file: a temporary
    file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    tmp.replace(path)
