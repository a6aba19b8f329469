"""Named datasets: the files their authors published, a sha256 for each, and the conversion to a
``GraphDataset``; ``load_dataset("cora")`` is all a run needs.

Where a dataset comes from, first match wins:

1. the **mirror** ``$MQGNN_DATA_MIRROR/<name>.npz``: converted files a cluster or CI keeps
   offline (read only, never written);
2. the **cache** ``<data root>/<name>.npz``, written by an earlier conversion; the data root is
   ``$MQGNN_DATA_ROOT``, else the per-user cache directory (``~/.cache/lightning_mqgnn`` on Linux);
3. the **source files**, downloaded with pooch into ``<data root>/raw/<name>/`` (unless
   ``download=False``), each checked against its sha256, then converted (``graph.convert``) and
   written to the cache. A download that fails or does not match leaves no file that a later run
   would take for data; a failure ends in one line naming the dataset, the URL, and the files and
   folder to fill by hand.

The OGB datasets (``arxiv``, ``products``, ``proteins``) are read from the mirror too when it holds
``<name>.npz``; otherwise OGB's own code fetches and parses them into ``<data root>/ogb``
(``graph.ogb``). The OGB link datasets (``ogbl_collab``, ``ogbl_ppa``, ``ogbl_citation2``,
``ogbl_ddi``) come with their own edge split, which a mirror's npz does not hold: they are always
read through OGB's files (``graph.ogb_link``). OGB publishes no checksums for its archives, so
none is checked there; what OGB parses is validated like every dataset.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_mqgnn.graph import convert
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.link_dataset import LinkDataset
from lightning_mqgnn.graph.npz import load_npz

DATA_ROOT_ENV = "MQGNN_DATA_ROOT"
MIRROR_ENV = "MQGNN_DATA_MIRROR"
# seconds to connect to, or hear from, a server before a download counts as failed
DOWNLOAD_TIMEOUT_S = 10.0

Converter = Callable[[dict[str, Path], str], dict[str, np.ndarray]]


@dataclass(frozen=True)
class RegisteredDataset:
    """A dataset by name: ``files`` (file name under ``base_url`` -> the sha256 of its content) and
    the ``convert`` function that turns them into the npz layout. A checksum ``"git-blob:<id>"``
    pins a file by its git blob id instead (the id the hosting repository lists for it), for a
    file whose sha256 could not be computed where the registry was written; ``None``: the
    publisher gives none (OGB's archives, fetched by OGB's downloader: ``ogb_name``)."""

    name: str
    description: str
    base_url: str
    files: dict[str, str | None]
    convert: Converter | None = None
    ogb_name: str | None = None


_PLANETOID = "https://github.com/kimiyoung/planetoid/raw/master/data"
_GRAPH_DATA = "https://github.com/EdisonLeeeee/GraphData/raw/master/datasets"
_HETEROPHILOUS = "https://github.com/yandex-research/heterophilous-graphs/raw/main/data"
_OGB = "http://snap.stanford.edu/ogb/data/nodeproppred"
_OGB_LINK = "http://snap.stanford.edu/ogb/data/linkproppred"
_PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def _planetoid(name: str, hashes: tuple[str, ...], description: str) -> RegisteredDataset:
    files = {f"ind.{name}.{part}": h for part, h in zip(_PLANETOID_PARTS, hashes)}
    return RegisteredDataset(name, description, _PLANETOID, files, convert.planetoid)


def _graph_data(name: str, file: str, sha256: str, description: str) -> RegisteredDataset:
    return RegisteredDataset(name, description, _GRAPH_DATA, {file: sha256}, convert.graph_data_npz)


DATASETS: dict[str, RegisteredDataset] = {
    d.name: d
    for d in (
        _planetoid(
            "cora",
            (
                "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
                "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
                "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
                "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
                "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
                "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
                "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
                "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
            ),
            "Cora citations, Planetoid files and public split (2,708 nodes, 7 classes)",
        ),
        _planetoid(
            "citeseer",
            (
                "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
                "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
                "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
                "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
                "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
                "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
                "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
                "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
            ),
            "CiteSeer citations, Planetoid files and public split (3,327 nodes, 6 classes)",
        ),
        _planetoid(
            "pubmed",
            (
                "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
                "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
                "git-blob:3b86bccf08111c37c632a9dd8ab63db25ea76361",
                "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
                "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
                "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
                "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
                "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5",
            ),
            "PubMed diabetes citations, Planetoid files and public split (19,717 nodes, 3 classes)",
        ),
        _graph_data(
            "amazon_photo",
            "amazon_photo.npz",
            "bdb98b54cd3125bfa69b23ba0aae84fabcb770c6727175b8f6eb1d64f3be4b2b",
            "Amazon co-purchase, photo (Shchur et al. 2018; 7,650 nodes, 8 classes), random 60/20/20",
        ),
        _graph_data(
            "amazon_computers",
            "amazon_cs.npz",
            "a6942db609f196b53503d91b99a02ad8d052d5d9be8ef41db976fb65f66ed1f3",
            "Amazon co-purchase, computers (Shchur et al. 2018; 13,752 nodes, 10 classes), random 60/20/20",
        ),
        _graph_data(
            "coauthor_cs",
            "coauthor_cs.npz",
            "7b7b51bf270d341f1c4231834c58a526bb04db003fd76a6d2f51ad7d252005ed",
            "Coauthor CS (Shchur et al. 2018; 18,333 nodes, 15 classes), random 60/20/20",
        ),
        _graph_data(
            "coauthor_physics",
            "coauthor_phy.npz",
            "1c930d99910763bc5f0c1aa90e8baa945f5ad6027663fe5332d0f08fde33cd7d",
            "Coauthor Physics (Shchur et al. 2018; 34,493 nodes, 5 classes), random 60/20/20",
        ),
        _graph_data(
            "dblp",
            "dblp.npz",
            "e1c460c864735b88158e230e715715b08a8f7bb7c94f7f6c3b5efc412558877d",
            "DBLP citations (Bojchevski & Günnemann 2018; 17,716 nodes, 4 classes), random 60/20/20",
        ),
        RegisteredDataset(
            "tolokers",
            "Tolokers (Platonov et al. 2023; 11,758 nodes, binary, ROC-AUC), first published split",
            _HETEROPHILOUS,
            {"tolokers.npz": "dacf3ac94cec53d03cd2adb5255c08b33dee1656c33ca8164a464bd9450a1667"},
            convert.heterophilous_npz,
        ),
        RegisteredDataset(
            "arxiv",
            "ogbn-arxiv (169,343 nodes, 40 classes)",
            _OGB,
            {"arxiv.zip": None},
            ogb_name="ogbn-arxiv",
        ),
        RegisteredDataset(
            "products",
            "ogbn-products (2,449,029 nodes, 47 classes)",
            _OGB,
            {"products.zip": None},
            ogb_name="ogbn-products",
        ),
        RegisteredDataset(
            "proteins",
            "ogbn-proteins (132,534 nodes, 112 binary tasks, ROC-AUC)",
            _OGB,
            {"proteins.zip": None},
            ogb_name="ogbn-proteins",
        ),
        RegisteredDataset(
            "ogbl_collab",
            "ogbl-collab (235,868 authors, 1.3M collaborations; Hits@50 over OGB's split by year)",
            _OGB_LINK,
            {"collab.zip": None},
            ogb_name="ogbl-collab",
        ),
        RegisteredDataset(
            "ogbl_ppa",
            "ogbl-ppa (576,289 proteins, 30M associations; Hits@100)",
            _OGB_LINK,
            {"ppassoc.zip": None},
            ogb_name="ogbl-ppa",
        ),
        RegisteredDataset(
            "ogbl_citation2",
            "ogbl-citation2 (2.9M papers, 30M directed citations; MRR over 1,000 negatives each)",
            _OGB_LINK,
            {"citation-v2.zip": None},
            ogb_name="ogbl-citation2",
        ),
        RegisteredDataset(
            "ogbl_ddi",
            "ogbl-ddi (4,267 drugs, 1.3M interactions, no node features; Hits@20)",
            _OGB_LINK,
            {"ddi.zip": None},
            ogb_name="ogbl-ddi",
        ),
    )
}


def data_root() -> Path:
    """Where downloads and converted files are kept: ``$MQGNN_DATA_ROOT``, else the per-user cache
    directory."""
    root = os.environ.get(DATA_ROOT_ENV)
    if root:
        return Path(root).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("lightning_mqgnn"))


def mirror_dir() -> Path | None:
    """``$MQGNN_DATA_MIRROR``: a read-only folder of converted ``<name>.npz`` files, or None."""
    mirror = os.environ.get(MIRROR_ENV)
    return Path(mirror).expanduser() if mirror else None


def _mirrored(name: str) -> Path | None:
    """The mirror's ``<name>.npz``, where there is a mirror holding it."""
    mirror = mirror_dir()
    if mirror is None or not (mirror / f"{name}.npz").is_file():
        return None
    return mirror / f"{name}.npz"


def registered(name: str) -> RegisteredDataset:
    """The registry entry of ``name``; an unknown name raises a ``ValueError`` listing the known."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} (known: {', '.join(sorted(DATASETS))})")
    return DATASETS[name]


def dataset_file(name: str, download: bool = True) -> Path:
    """The converted ``<name>.npz`` of a registered (non-OGB) dataset: from the mirror, else the
    cache, else downloaded and converted into the cache (see the module docstring)."""
    entry = registered(name)
    mirrored = _mirrored(name)
    if mirrored is not None:
        return mirrored
    if entry.convert is None:
        raise ValueError(
            f"{name}: an OGB dataset, loaded through OGB's own files, not an npz (unless mirrored)"
        )
    cached = data_root() / f"{name}.npz"
    if cached.is_file():
        return cached
    raw = data_root() / "raw" / name
    files = _fetch(entry, raw, download)
    convert.write_npz(entry.convert(files, name), cached)
    return cached


def _manual(entry: RegisteredDataset, raw: Path) -> str:
    """What to put where by hand: the error lines' second half."""
    mirror = f"{MIRROR_ENV}={mirror_dir()}" if mirror_dir() is not None else f"{MIRROR_ENV} unset"
    return (
        f"put {', '.join(entry.files)} from {entry.base_url}/ into {raw}/, "
        f"or a converted {entry.name}.npz into the folder named by {MIRROR_ENV} ({mirror})"
    )


def _fetch(entry: RegisteredDataset, raw: Path, download: bool) -> dict[str, Path]:
    """The source files under ``raw``, each downloaded (when missing or not matching its sha256)
    and checked by pooch."""
    missing = [f for f in entry.files if not (raw / f).is_file()]
    if missing and not download:
        raise FileNotFoundError(
            f"{entry.name}: not downloaded yet and downloads are off (download=false); {_manual(entry, raw)}"
        )
    import pooch
    import requests

    downloader = pooch.HTTPDownloader(progressbar=False, timeout=DOWNLOAD_TIMEOUT_S)
    paths = {}
    for file, checksum in entry.files.items():
        url = f"{entry.base_url}/{file}"
        try:
            paths[file] = _retrieve(url, checksum, raw / file, downloader)
        except (requests.RequestException, OSError) as err:
            raise FileNotFoundError(
                f"{entry.name}: {url} could not be downloaded ({_reason(err)}); {_manual(entry, raw)}"
            ) from err
        except ValueError as err:  # the content is not the published one; nothing was kept
            raise ValueError(
                f"{entry.name}: {url} does not match its checksum {checksum} (a corrupt or changed "
                f"file; nothing was kept); {_manual(entry, raw)}"
            ) from err
    return paths


def _retrieve(url: str, checksum: str | None, path: Path, downloader: Any) -> Path:
    """``path``, downloaded from ``url`` unless it is there with the right content. pooch downloads
    into a temporary file and moves it into place only once its sha256 matches."""
    import pooch

    if checksum is None or not checksum.startswith("git-blob:"):
        known = None if checksum is None else f"sha256:{checksum}"
        return Path(pooch.retrieve(url, known, fname=path.name, path=path.parent, downloader=downloader))
    want = checksum.removeprefix("git-blob:")
    if path.is_file() and git_blob_id(path) == want:
        return path
    path.unlink(missing_ok=True)
    pooch.retrieve(url, None, fname=path.name, path=path.parent, downloader=downloader)
    if git_blob_id(path) != want:
        path.unlink()
        raise ValueError(f"{path.name}: git blob id is not {want}")
    return path


def git_blob_id(path: Path) -> str:
    """The id git gives the file's content: sha1 of ``blob <size>``, a zero byte, then the bytes."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _reason(err: BaseException) -> str:
    """The innermost cause in one line: "Failed to resolve 'github.com' (...)", "404 Client Error:
    Not Found for url: ...", "Connection refused"."""
    while True:  # requests wraps urllib3's MaxRetryError, which holds the cause as .reason
        inner = getattr(err, "reason", None)
        if not isinstance(inner, BaseException) and err.args and isinstance(err.args[0], BaseException):
            inner = err.args[0]
        if not isinstance(inner, BaseException) or inner is err:
            break
        err = inner
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if "Connection(host=" in text and "): " in text:  # urllib3 names its connection object first
        text = text.split("): ", 1)[1]
    return text[:300]


def load_dataset(name: str, download: bool = True, **options: Any) -> GraphDataset | LinkDataset:
    """The registered dataset ``name``, validated. ``options`` go to ``load_npz`` (e.g.
    ``max_features``, ``normalize_features``) or, for OGB datasets, ``load_ogb``
    (``make_undirected``). An OGB link dataset (``ogbl_*``) is a ``LinkDataset``: its training
    graph and OGB's split, always read through OGB's files (``graph.ogb_link``)."""
    entry = registered(name)
    if entry.ogb_name is not None and entry.ogb_name.startswith("ogbl-"):
        from lightning_mqgnn.graph.ogb_link import load_ogb_link

        return load_ogb_link(entry.ogb_name, root=data_root() / "ogb", download=download, **options)
    if entry.ogb_name is not None and _mirrored(name) is None:
        from lightning_mqgnn.graph.ogb import load_ogb

        return load_ogb(entry.ogb_name, root=data_root() / "ogb", download=download, **options)
    return load_npz(dataset_file(name, download), name=name, **options)
