"""On-disk datasets: written in chunks and renamed into place, opened memory-mapped, every damaged
or mismatched folder refused in one line, and a full disk leaving nothing behind."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import REPO

from lightning_mqgnn.graph import GraphDataset, generate_graph, generated, ondisk
from lightning_mqgnn.graph.generated import write_generated_graph
from lightning_mqgnn.graph.ondisk import MappedDataset, OnDiskError, open_dataset, write_dataset


@pytest.fixture(scope="module")
def small() -> GraphDataset:
    return generate_graph(preset="arxiv", scale=0.02, seed=3)


def _same(a: GraphDataset, b: GraphDataset) -> None:
    for get in (
        lambda d: d.graph.indptr,
        lambda d: d.graph.indices,
        lambda d: d.features,
        lambda d: d.labels,
        lambda d: d.train_idx,
        lambda d: d.val_idx,
        lambda d: d.test_idx,
    ):
        x, y = get(a), get(b)
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert (a.name, a.num_classes, a.metric, a.num_nodes) == (b.name, b.num_classes, b.metric, b.num_nodes)


def _mapped_file(t: torch.Tensor) -> str:
    """What is mapped at ``t``'s first byte in this process: a path, [heap], or '' (anonymous)."""
    address = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in parts[0].split("-"))
        if low <= address < high:
            return parts[5].strip() if len(parts) > 5 else ""
    raise AssertionError(f"address {address:#x} is not mapped")


def test_round_trip_maps_the_files_and_travels_as_its_folder(small, tmp_path):
    folder = write_dataset(small, tmp_path / "arxiv")
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*(f"{a}.npy" for a in ondisk.ARRAYS), "manifest.json"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["arxiv"]  # no partial folder beside it
    opened = open_dataset(folder)
    _same(small, opened)
    assert isinstance(opened, MappedDataset) and opened.folder == folder.resolve()
    for name, t in (("features", opened.features), ("indices", opened.graph.indices)):
        assert _mapped_file(t) == str(folder.resolve() / f"{name}.npy")  # the file's pages, not a copy
    blob = pickle.dumps(opened)
    assert len(blob) < 1000  # the folder, not the arrays
    _same(small, pickle.loads(blob))
    assert opened.share_memory_() is opened and not opened.features.is_shared()
    assert not _mapped_file(small.features).endswith(".npy")  # (the check tells memory from a file)
    # standard .npy files: numpy reads every array without this package
    assert np.array_equal(np.load(folder / "indices.npy"), small.graph.indices.numpy())


def test_a_multilabel_dataset_keeps_its_float_labels(tmp_path):
    ds = generate_graph(preset="proteins", scale=0.005, seed=0)
    assert ds.multilabel
    _same(ds, open_dataset(write_dataset(ds, tmp_path / "proteins")))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_features_stored_in_half_precision_are_the_rounded_values_in_half_the_bytes(small, tmp_path, dtype):
    name = str(dtype).removeprefix("torch.")
    full = write_dataset(small, tmp_path / "full")
    folder = write_dataset(small, tmp_path / name, features_dtype=name)
    opened = open_dataset(folder)
    assert opened.features.dtype == dtype
    assert torch.equal(opened.features, small.features.to(dtype))  # rounded to nearest, as torch rounds
    assert _mapped_file(opened.features) == str(folder.resolve() / "features.npy")
    ratio = (folder / "features.npy").stat().st_size / (full / "features.npy").stat().st_size
    assert 0.49 < ratio < 0.51
    assert json.loads((folder / "manifest.json").read_text())["arrays"]["features"]["dtype"] == name
    words = np.load(folder / "features.npy")  # numpy reads the file: float16, or bfloat16's uint16 words
    assert words.dtype == (np.float16 if dtype == torch.float16 else np.uint16)
    signed = words.view(np.int16) if words.dtype == np.uint16 else words  # torch < 2.3 has no uint16
    assert torch.equal(torch.from_numpy(signed).view(dtype), opened.features)
    again = pickle.loads(pickle.dumps(opened))  # a worker maps it again, as the same dtype
    assert again.features.dtype == dtype and torch.equal(again.features, opened.features)
    # and a half-precision dataset converts onwards (widened per chunk, narrowed again)
    _same(opened, open_dataset(write_dataset(opened, tmp_path / "again", features_dtype=name)))


def test_a_generated_graph_is_drawn_straight_into_half_precision(tmp_path, monkeypatch):
    monkeypatch.setattr(generated, "FEATURE_CHUNK_ELEMENTS", 4096)
    in_memory = generate_graph(preset="arxiv", scale=0.01, seed=5)
    folder = write_generated_graph(
        tmp_path / "g", preset="arxiv", scale=0.01, seed=5, features_dtype="bfloat16"
    )
    assert torch.equal(open_dataset(folder).features, in_memory.features.to(torch.bfloat16))


def test_a_value_beyond_float16s_range_is_refused_naming_node_and_column(small, tmp_path):
    features = small.features.clone()
    features[57, 3] = 1e6
    wide = GraphDataset(**{**small.__dict__, "features": features})
    with pytest.raises(ValueError) as err:
        write_dataset(wide, tmp_path / "d", features_dtype="float16")
    line = _one_line(err)
    assert line.startswith(f"{tmp_path / 'd'}: field 'features' has value 1000000.0 at node 57, column 3")
    assert "bfloat16" in line  # what to do instead
    assert list(tmp_path.iterdir()) == []
    assert open_dataset(write_dataset(wide, tmp_path / "b", features_dtype="bfloat16")).features[
        57, 3
    ] == torch.tensor(1e6, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match=r"features dtype must be one of \('float32', 'float16', 'bfloat16'\), got 'int8'"
    ):
        write_dataset(small, tmp_path / "e", features_dtype="int8")
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    features[57, 3] = 3.4e38  # a float32 that rounds past bfloat16's largest value (3.39e38)
    with pytest.raises(ValueError) as err:
        write_dataset(wide, tmp_path / "f", features_dtype="bfloat16")
    assert _one_line(err).endswith("beyond the range of bfloat16; store the features as float32")


def test_rows_are_written_in_chunks(small, tmp_path, monkeypatch):
    monkeypatch.setattr(ondisk, "CHUNK_BYTES", 1000)  # a few rows per write
    _same(small, open_dataset(write_dataset(small, tmp_path / "chunked")))


def test_an_existing_folder_is_kept_unless_overwrite(small, tmp_path):
    folder = write_dataset(small, tmp_path / "d")
    with pytest.raises(OnDiskError, match=f"{folder}: already exists; pass overwrite=True"):
        write_dataset(small, folder)
    other = generate_graph(preset="arxiv", scale=0.02, seed=4)
    write_dataset(other, folder, overwrite=True)
    _same(other, open_dataset(folder))
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_truncated_array_is_refused_naming_the_file(small, tmp_path):
    folder = write_dataset(small, tmp_path / "d")
    path = folder / "features.npy"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4)
    with pytest.raises(OnDiskError) as err:
        open_dataset(folder)
    assert _one_line(err).startswith(f"{path}: ") and "truncated" in str(err.value)


def test_a_missing_or_foreign_folder_is_refused(small, tmp_path):
    with pytest.raises(OnDiskError, match="no such folder"):
        open_dataset(tmp_path / "nowhere")
    with pytest.raises(OnDiskError, match="not an on-disk dataset: manifest.json is missing"):
        open_dataset(tmp_path)
    folder = write_dataset(small, tmp_path / "d")
    (folder / "labels.npy").unlink()
    with pytest.raises(OnDiskError, match="labels.npy: missing"):
        open_dataset(folder)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda m: m.update(format="other"), "field 'format' is 'other'"),
        (lambda m: m.update(version=99), "field 'version' is 99"),
        (lambda m: m.update(num_nodes=m["num_nodes"] + 1), "array 'indptr' has shape"),
        (lambda m: m["arrays"]["features"].update(dtype="float16"), "holds float32"),
        (lambda m: m["arrays"]["features"].update(dtype="bfloat16"), "holds float32"),
        (lambda m: m["arrays"]["features"].update(dtype="int64"), "array 'features' has dtype 'int64'"),
        (lambda m: m["arrays"].pop("val_idx"), "field 'arrays' lacks ['val_idx']"),
        (lambda m: m.pop("metric"), "not a readable manifest"),
    ],
)
def test_a_manifest_that_does_not_match_its_files_is_refused(small, tmp_path, edit, fragment):
    folder = write_dataset(small, tmp_path / "d")
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OnDiskError) as err:
        open_dataset(folder)
    assert fragment in _one_line(err)


def test_indptr_that_does_not_end_at_the_edge_count_is_refused(small, tmp_path):
    folder = write_dataset(small, tmp_path / "d")
    indptr = np.load(folder / "indptr.npy", mmap_mode="r+")
    indptr[-1] -= 1
    indptr.flush()
    del indptr
    with pytest.raises(OnDiskError, match="indptr.npy: runs from 0 to"):
        open_dataset(folder)


_FULL_DISK = """
import resource, sys
from pathlib import Path
from lightning_mqgnn.graph import generate_graph
from lightning_mqgnn.graph.ondisk import OnDiskError, write_dataset
ds = generate_graph(preset="arxiv", scale=0.02, seed=3)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    write_dataset(ds, Path(sys.argv[1]))
except OnDiskError as err:
    print(err)
    sys.exit(3)
"""


def test_a_full_disk_leaves_nothing_behind_and_says_so(tmp_path):
    # the topology and features (~0.3 and 0.9 MB) cannot be written under a 100 kB file size limit
    target = tmp_path / "d"
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(target)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    line = proc.stdout.strip()
    assert re.fullmatch(rf"{re.escape(str(target))}: writing \w+\.npy failed \(File too large\); .*", line), (
        line
    )
    assert line.endswith("nothing was left behind")
    assert list(tmp_path.iterdir()) == []


def test_a_crashed_writes_leftovers_are_removed_by_the_next_write(small, tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    leftover = tmp_path / f".d.partial-{dead.stdout.strip()}"
    leftover.mkdir()
    (leftover / "features.npy").write_bytes(b"half")
    with pytest.raises(OnDiskError, match="not an on-disk dataset"):
        open_dataset(leftover)  # a hidden partial folder has no manifest: never opened
    write_dataset(small, tmp_path / "d")
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


@pytest.mark.parametrize("preset", ["arxiv", "proteins"])
def test_a_generated_graph_written_as_drawn_is_generate_graphs_bit_for_bit(tmp_path, monkeypatch, preset):
    # small chunks: several feature chunks, drawn from the one stream in order on both paths
    monkeypatch.setattr(generated, "FEATURE_CHUNK_ELEMENTS", 4096)
    in_memory = generate_graph(preset=preset, scale=0.01, seed=5)
    folder = write_generated_graph(tmp_path / preset, preset=preset, scale=0.01, seed=5)
    _same(in_memory, open_dataset(folder))


_DRAWN = """
import resource, sys
from lightning_mqgnn.graph import generated
generated.FEATURE_CHUNK_ELEMENTS = 1 << 22  # 16 MiB chunks
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
generated.write_generated_graph(sys.argv[1], num_nodes=40_000, mean_degree=5, num_features=4096, num_classes=4)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_writing_a_generated_graph_never_holds_its_feature_matrix(tmp_path):
    folder = tmp_path / "wide"
    proc = subprocess.run(
        [sys.executable, "-c", _DRAWN, str(folder)], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew_mb = float(proc.stdout.strip())
    features_mb = 40_000 * 4096 * 4 / 2**20  # 625 MiB
    assert open_dataset(folder).features.shape == (40_000, 4096)
    assert grew_mb < features_mb / 2, grew_mb  # chunks, freed memory the allocator keeps: not the matrix
