"""The dataset registry against a local HTTP server holding files at the registry's own paths: the
real Planetoid files of cora (tests/fixtures/planetoid), and small files in the other published
formats. Download, checksum, conversion, cache, mirror, and every way a download can fail; with
-m mirror, that the conversion is the mirror's cora."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import pickle
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from helpers.paths import MIRROR, PLANETOID_FILES

from lightning_mqgnn.graph import registry
from lightning_mqgnn.graph.registry import DATASETS, load_dataset


@pytest.fixture(autouse=True)
def data_root(tmp_path, monkeypatch) -> Path:
    """An empty data root and no mirror, as on a fresh machine."""
    root = tmp_path / "cache"
    monkeypatch.setenv(registry.DATA_ROOT_ENV, str(root))
    monkeypatch.delenv(registry.MIRROR_ENV, raising=False)
    return root


def _serve_entry(httpserver, monkeypatch, name: str, contents: dict[str, bytes], **changes) -> None:
    """Serve ``contents`` at the URL paths of ``name``'s registry entry, and point the entry at the
    server (same paths, local host)."""
    entry = dataclasses.replace(DATASETS[name], **changes)
    path = urlparse(entry.base_url).path
    for file, data in contents.items():
        httpserver.expect_request(f"{path}/{file}").respond_with_data(data)
    local = dataclasses.replace(entry, base_url=httpserver.url_for(path).rstrip("/"))
    monkeypatch.setitem(DATASETS, name, local)


def _cora_files() -> dict[str, bytes]:
    return {f: (PLANETOID_FILES / f).read_bytes() for f in DATASETS["cora"].files}


def test_cora_is_downloaded_checked_converted_and_cached(httpserver, monkeypatch, data_root):
    _serve_entry(httpserver, monkeypatch, "cora", _cora_files())
    ds = load_dataset("cora")
    assert len(httpserver.log) == 8  # the eight published files, against their real sha256
    assert (ds.num_nodes, ds.num_classes, ds.num_features) == (2708, 7, 1433)
    assert (ds.train_idx.numel(), ds.val_idx.numel(), ds.test_idx.numel()) == (140, 500, 1000)
    assert ds.graph.num_edges == 2 * 5278 and ds.graph.is_symmetric()
    cached = data_root / "cora.npz"
    assert cached.is_file() and sorted(p.name for p in (data_root / "raw" / "cora").iterdir()) == sorted(
        DATASETS["cora"].files
    )
    again = load_dataset("cora")
    assert len(httpserver.log) == 8  # a cache hit: nothing downloaded
    assert torch.equal(again.features, ds.features) and torch.equal(again.labels, ds.labels)


@pytest.mark.mirror
def test_the_conversion_reproduces_the_mirrors_cora_bit_for_bit(served_data_root):
    with np.load(served_data_root / "cora.npz") as ours, np.load(MIRROR / "cora.npz") as theirs:
        assert sorted(ours.files) == sorted(theirs.files)
        for key in ours.files:
            assert ours[key].dtype == theirs[key].dtype and np.array_equal(ours[key], theirs[key]), key


def test_pygs_planetoid_reads_the_same_files_to_the_same_graph(httpserver, monkeypatch, tmp_path):
    pyg_datasets = pytest.importorskip("torch_geometric.datasets")
    from lightning_mqgnn.graph.pyg import load_pyg_dataset

    _serve_entry(httpserver, monkeypatch, "cora", _cora_files())
    monkeypatch.setattr(pyg_datasets.Planetoid, "url", DATASETS["cora"].base_url)
    theirs = load_pyg_dataset("torch_geometric.datasets.Planetoid", tmp_path / "pyg", kwargs={"name": "Cora"})
    ours = load_dataset("cora", normalize_features=False)
    assert torch.equal(theirs.graph.indptr, ours.graph.indptr) and torch.equal(
        theirs.graph.indices, ours.graph.indices
    )
    assert torch.equal(theirs.labels, ours.labels) and torch.allclose(theirs.features, ours.features)
    for split in ("train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(theirs, split), getattr(ours, split)), split


def _npy_object(value) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array(value, dtype=object), allow_pickle=True)
    return buffer.getvalue()


def _npz_bytes(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _graph_data_file(n: int = 40, seed: int = 0) -> tuple[bytes, sp.csr_matrix, np.ndarray]:
    """A file in GraphData's layout: pickled scipy matrices, one-way edges with a self loop."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 120), rng.integers(0, n, 120)
    adj = sp.csr_matrix((np.ones(120), (src, dst)), shape=(n, n))
    attr = sp.csr_matrix((rng.random((n, 9)) > 0.6).astype(np.float32))
    labels = rng.integers(0, 3, n).astype(np.int32)
    return (
        _npz_bytes(
            {
                "adj_matrix": np.array(adj, dtype=object),
                "node_attr": np.array(attr, dtype=object),
                "node_label": labels,
            }
        ),
        adj,
        labels,
    )


def test_graph_data_npz_layout_with_seeded_split(httpserver, monkeypatch):
    data, adj, labels = _graph_data_file()
    digest = hashlib.sha256(data).hexdigest()
    _serve_entry(httpserver, monkeypatch, "dblp", {"dblp.npz": data}, files={"dblp.npz": digest})
    ds = load_dataset("dblp")
    want = ((adj + adj.T) != 0).astype(np.int64).tolil()
    want.setdiag(0)
    want = sp.csr_matrix(want)
    want.eliminate_zeros()
    assert torch.equal(ds.graph.indptr, torch.from_numpy(want.indptr.astype(np.int64)))
    assert torch.equal(ds.labels, torch.from_numpy(labels.astype(np.int64)))
    assert (ds.train_idx.numel(), ds.val_idx.numel(), ds.test_idx.numel()) == (24, 8, 8)
    all_ids = torch.cat([ds.train_idx, ds.val_idx, ds.test_idx]).sort().values
    assert torch.equal(all_ids, torch.arange(40))


def test_heterophilous_layout_takes_the_first_published_split(httpserver, monkeypatch):
    n, rng = 30, np.random.default_rng(3)
    masks = np.zeros((10, 3, n), dtype=bool)
    for k in range(10):
        part = rng.integers(0, 3, n)
        masks[k] = [part == 0, part == 1, part == 2]
    data = _npz_bytes(
        {
            "node_features": rng.random((n, 4)).astype(np.float32),
            "node_labels": rng.integers(0, 2, n),
            "edges": rng.integers(0, n, (80, 2)),
            "train_masks": masks[:, 0],
            "val_masks": masks[:, 1],
            "test_masks": masks[:, 2],
        }
    )
    files = {"tolokers.npz": hashlib.sha256(data).hexdigest()}
    _serve_entry(httpserver, monkeypatch, "tolokers", {"tolokers.npz": data}, files=files)
    ds = load_dataset("tolokers", normalize_features=False)
    assert ds.metric == "rocauc" and ds.num_features == 4
    assert torch.equal(ds.train_idx, torch.from_numpy(np.nonzero(masks[0, 0])[0]))
    assert torch.equal(ds.test_idx, torch.from_numpy(np.nonzero(masks[0, 2])[0]))


def _leftovers(data_root: Path) -> list[str]:
    """Every file under the data root: after a failed download there must be none a later run
    could take for data."""
    return sorted(str(p.relative_to(data_root)) for p in data_root.rglob("*") if p.is_file())


def test_checksum_mismatch_is_an_error_and_keeps_nothing(httpserver, monkeypatch, data_root):
    files = _cora_files()
    files["ind.cora.allx"] = files["ind.cora.allx"][:-1] + b"\x00"
    _serve_entry(httpserver, monkeypatch, "cora", files)
    with pytest.raises(
        ValueError, match=r"cora: http://\S+/ind\.cora\.allx does not match its checksum 9419ba2f"
    ) as err:
        load_dataset("cora")
    assert "\n" not in str(err.value)
    assert "ind.cora.allx" not in _leftovers(data_root) and "cora.npz" not in _leftovers(data_root)


class _TruncatingHandler(http.server.BaseHTTPRequestHandler):
    """Announces the whole file and sends half of it, then hangs up; whole files once ``heal``."""

    files: dict[str, bytes] = {}
    heal = False

    def do_GET(self) -> None:
        data = self.files[Path(self.path).name]
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data if self.heal else data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


def test_truncated_transfer_is_an_error_and_the_next_call_downloads_again(monkeypatch, data_root):
    handler = type("Handler", (_TruncatingHandler,), {"files": _cora_files(), "heal": False})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_port}/data"
        monkeypatch.setitem(DATASETS, "cora", dataclasses.replace(DATASETS["cora"], base_url=base))
        with pytest.raises(
            (FileNotFoundError, ValueError), match=r"cora: http://127\.0\.0\.1:\d+/data/ind\.cora\.x "
        ):
            load_dataset("cora")
        assert _leftovers(data_root) == []
        handler.heal = True
        assert load_dataset("cora").num_nodes == 2708
        server.shutdown()


def test_404_is_one_line_naming_url_files_and_folder(httpserver, monkeypatch, data_root):
    entry = DATASETS["cora"]
    path = urlparse(entry.base_url).path
    httpserver.expect_request(f"{path}/ind.cora.x").respond_with_data("gone", status=404)
    monkeypatch.setitem(
        DATASETS, "cora", dataclasses.replace(entry, base_url=httpserver.url_for(path).rstrip("/"))
    )
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cora")
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "\n" not in message and "404" in message
    assert f"{httpserver.url_for(path).rstrip('/')}/ind.cora.x could not be downloaded" in message
    assert (
        "ind.cora.x, ind.cora.tx, ind.cora.allx" in message
        and f"into {data_root / 'raw' / 'cora'}/" in message
    )
    assert "MQGNN_DATA_MIRROR" in message
    assert _leftovers(data_root) == []


@pytest.mark.parametrize("base", ["http://127.0.0.1:{closed}/data", "http://nohost.invalid/data"])
def test_unreachable_host_is_one_line_within_seconds(monkeypatch, data_root, base):
    with http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as probe:
        closed = probe.server_port  # free once the with block ends: nothing listens there
    base = base.format(closed=closed)
    monkeypatch.setitem(DATASETS, "cora", dataclasses.replace(DATASETS["cora"], base_url=base))
    start = time.monotonic()
    with pytest.raises(
        FileNotFoundError, match=rf"cora: {base}/ind\.cora\.x could not be downloaded \("
    ) as err:
        load_dataset("cora")
    assert time.monotonic() - start < 5 and "\n" not in str(err.value)
    assert _leftovers(data_root) == []


def test_downloads_off_is_one_line_and_touches_no_network(monkeypatch, data_root):
    monkeypatch.setitem(
        DATASETS, "cora", dataclasses.replace(DATASETS["cora"], base_url="http://127.0.0.1:9/x")
    )
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cora", download=False)
    message = str(err.value)
    assert message.startswith(
        "cora: not downloaded yet and downloads are off (download=false); put ind.cora.x"
    )
    assert f"from http://127.0.0.1:9/x/ into {data_root / 'raw' / 'cora'}/" in message


def test_mirror_is_read_first_and_never_written(tmp_path, monkeypatch, data_root):
    from helpers.graphs import valid_npz_arrays, write_npz

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    write_npz(mirror / "cora.npz", **valid_npz_arrays())
    write_npz(mirror / "arxiv.npz", **valid_npz_arrays(num_nodes=12))
    monkeypatch.setenv(registry.MIRROR_ENV, str(mirror))
    monkeypatch.setitem(
        DATASETS, "cora", dataclasses.replace(DATASETS["cora"], base_url="http://127.0.0.1:9/x")
    )
    ds = load_dataset("cora")
    assert ds.name == "cora" and ds.num_nodes == 10
    ogb = load_dataset("arxiv", download=False)  # an OGB name too: no OGB folder needed
    assert ogb.name == "arxiv" and ogb.num_nodes == 12
    assert sorted(p.name for p in mirror.iterdir()) == ["arxiv.npz", "cora.npz"] and not data_root.exists()


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown dataset 'coraa' \(known: amazon_computers, amazon_photo, arxiv, citeseer, coauthor_cs, coauthor_physics, cora, dblp, ogbl_citation2, ogbl_collab, ogbl_ddi, ogbl_ppa, products, proteins, pubmed, tolokers\)",
    ):
        load_dataset("coraa")


def test_a_file_pinned_by_git_blob_id(httpserver, monkeypatch, data_root):
    files = _cora_files()
    blob = registry.git_blob_id(PLANETOID_FILES / "ind.cora.x")
    assert blob == "c4a91d008245403e7f26aa616b437191509793c0"  # the id kimiyoung/planetoid lists
    pinned = dict(DATASETS["cora"].files, **{"ind.cora.x": f"git-blob:{blob}"})
    _serve_entry(httpserver, monkeypatch, "cora", files, files=pinned)
    assert load_dataset("cora").num_nodes == 2708
    (data_root / "cora.npz").unlink()
    (data_root / "raw" / "cora" / "ind.cora.x").write_bytes(b"tampered")
    assert load_dataset("cora").num_nodes == 2708  # the wrong copy was replaced by a download
    bad = dict(pinned, **{"ind.cora.x": "git-blob:" + "0" * 40})
    monkeypatch.setitem(DATASETS, "cora", dataclasses.replace(DATASETS["cora"], files=bad))
    (data_root / "cora.npz").unlink()
    with pytest.raises(ValueError, match="does not match its checksum git-blob:0000"):
        load_dataset("cora")
    assert not (data_root / "raw" / "cora" / "ind.cora.x").exists()


def test_pickles_that_would_run_code_are_refused(httpserver, monkeypatch, data_root):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    files = _cora_files()
    files["ind.cora.x"] = pickle.dumps(Evil())
    pinned = dict(DATASETS["cora"].files, **{"ind.cora.x": hashlib.sha256(files["ind.cora.x"]).hexdigest()})
    _serve_entry(httpserver, monkeypatch, "cora", files, files=pinned)
    with pytest.raises(
        ValueError, match=r"ind\.cora\.x: not a readable data pickle \(refusing to load builtins\.print"
    ):
        load_dataset("cora")
    assert not (data_root / "cora.npz").exists()
