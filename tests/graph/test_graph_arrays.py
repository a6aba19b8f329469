"""Your own graph as arrays or files: GraphDataset.from_arrays, load_arrays, and their one-line errors."""

from __future__ import annotations

import gzip
import warnings

import numpy as np
import pytest
import torch
from helpers.recipe import assert_one_error_line, result_fields, run_recipe

from lightning_mqgnn import GraphDataset
from lightning_mqgnn.graph.arrays import load_arrays


def _arrays(n: int = 60, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, n, (2, 300), generator=g)
    features = torch.randn(n, 5, generator=g)
    labels = torch.randint(0, 3, (n,), generator=g)
    return edge_index, features, labels


def test_from_arrays_builds_a_simple_undirected_graph_and_a_seeded_split():
    edge_index, features, labels = _arrays()
    edge_index[:, 0] = torch.tensor([4, 4])  # a self loop: dropped
    ds = GraphDataset.from_arrays(edge_index, features, labels, seed=3)
    assert ds.graph.is_symmetric() and ds.num_nodes == 60 and ds.num_classes == 3
    want = {(int(u), int(v)) for u, v in edge_index.T.tolist() if u != v}
    want |= {(v, u) for u, v in want}
    assert set(zip(ds.graph.indices.tolist(), ds.graph.row_ids().tolist())) == want
    assert (ds.train_idx.numel(), ds.val_idx.numel(), ds.test_idx.numel()) == (36, 12, 12)
    same = GraphDataset.from_arrays(edge_index, features, labels, seed=3)
    other = GraphDataset.from_arrays(edge_index, features, labels, seed=4)
    assert torch.equal(same.train_idx, ds.train_idx) and not torch.equal(other.train_idx, ds.train_idx)
    directed = GraphDataset.from_arrays(edge_index, features, labels, make_undirected=False)
    assert not directed.graph.is_symmetric()


def test_from_arrays_takes_numpy_edge_rows_masks_and_multilabel():
    edge_index, features, labels = _arrays()
    rows = edge_index.T.numpy()  # [E, 2], one edge a row, as an edge list reads
    masks = {s: np.zeros(60, dtype=bool) for s in ("train", "val", "test")}
    masks["train"][:30], masks["val"][30:45], masks["test"][45:] = True, True, True
    ds = GraphDataset.from_arrays(rows, features.numpy(), labels.numpy(), splits=masks)
    assert torch.equal(ds.val_idx, torch.arange(30, 45))
    multi = (torch.rand(60, 4) > 0.5).float()
    ml = GraphDataset.from_arrays(edge_index, features, multi, metric="rocauc")
    assert ml.multilabel and ml.num_classes == 4


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"labels": torch.zeros(59, dtype=torch.int64)}, "field 'labels' has 59 entries, expected 60"),
        ({"edge_index": torch.tensor([[0, 1], [2, 60]])}, "node id 60 outside [0, 60)"),
        ({"edge_index": torch.zeros(3, 5, dtype=torch.int64)}, "field 'edge_index' has shape (3, 5)"),
        ({"features": torch.full((60, 5), float("nan"))}, "non-finite value nan at node 0"),
        (
            {
                "splits": {
                    "train": torch.arange(30),
                    "val": torch.arange(25, 40),
                    "test": torch.arange(40, 60),
                }
            },
            "fields 'train_idx' and 'val_idx' overlap: node id 25 is in both",
        ),
        ({"split_fractions": (0.8, 0.3, 0.1)}, "split_fractions must be three non-negative fractions"),
    ],
)
def test_bad_arrays_are_named(change, fragment):
    edge_index, features, labels = _arrays()
    kwargs = {"edge_index": edge_index, "features": features, "labels": labels, "name": "mine", **change}
    with pytest.raises(ValueError) as err:
        GraphDataset.from_arrays(**kwargs)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_load_arrays_reads_every_file_type(tmp_path):
    edge_index, features, labels = _arrays()
    np.savetxt(
        tmp_path / "edges.csv", edge_index.T.numpy(), fmt="%d", delimiter=",", header="src,dst", comments=""
    )
    np.save(tmp_path / "x.npy", features.numpy())
    torch.save(labels, tmp_path / "y.pt")
    np.savez(tmp_path / "splits.npz", train=np.arange(40), val=np.arange(40, 50), test=np.arange(50, 60))
    ds = load_arrays(
        tmp_path / "edges.csv", tmp_path / "x.npy", tmp_path / "y.pt", splits=tmp_path / "splits.npz"
    )
    ref = GraphDataset.from_arrays(
        edge_index,
        features,
        labels,
        splits={"train": np.arange(40), "val": np.arange(40, 50), "test": np.arange(50, 60)},
    )
    assert torch.equal(ds.graph.indices, ref.graph.indices) and torch.equal(ds.features, ref.features)
    assert torch.equal(ds.labels, ref.labels) and torch.equal(ds.test_idx, ref.test_idx)
    np.savez(tmp_path / "both.npz", edge_index=edge_index.numpy(), other=np.zeros(3))
    torch.save({"x": features}, tmp_path / "x.pt")
    again = load_arrays(tmp_path / "both.npz", tmp_path / "x.pt", tmp_path / "y.pt")
    assert torch.equal(again.graph.indptr, ref.graph.indptr)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("0,1\n1,2\n2,x\n", "edges.csv: line 3 is '2,x'; expected two integer node ids"),
        ("0,1\n1,2,3\n", "edges.csv: line 2 is '1,2,3'"),
        ("src,dst\n", "edges.csv: no edges: only the header line 'src,dst'"),
    ],
)
def test_malformed_edge_list_names_file_and_line(tmp_path, content, fragment):
    _, features, labels = _arrays()
    (tmp_path / "edges.csv").write_text(content)
    np.save(tmp_path / "x.npy", features.numpy())
    np.save(tmp_path / "y.npy", labels.numpy())
    with pytest.raises(ValueError) as err:
        load_arrays(tmp_path / "edges.csv", tmp_path / "x.npy", tmp_path / "y.npy")
    assert fragment in str(err.value)


def _write_xy(tmp_path, n: int = 60):
    _, features, labels = _arrays(n)
    np.save(tmp_path / "x.npy", features.numpy())
    np.save(tmp_path / "y.npy", labels.numpy())
    return tmp_path / "x.npy", tmp_path / "y.npy"


def _load_edges_strictly(edges, x, y):
    """``load_arrays`` with every warning an error: a message must not come with a numpy warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_arrays(edges, x, y)


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("edges.csv", "", "edges.csv: no edges: the file is empty"),
        ("edges.txt", "\n\n", "edges.txt: no edges: the file is empty"),
        ("edges.txt", "# FromNodeId\tToNodeId\n", "edges.txt: no edges: the file is only comments"),
    ],
)
def test_an_edge_file_without_edges_says_so(tmp_path, name, content, fragment):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError) as err:
        _load_edges_strictly(tmp_path / name, *_write_xy(tmp_path))
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("field", "name", "content", "fragment"),
    [
        (
            "edges",
            "e.npy",
            "0 1\n1 2\n",
            "e.npy: not a .npy file: it holds text (first line '0 1'); an edge list in text is read from a text file: name it e.txt",
        ),
        ("edges", "e.npy", "src,dst\n0,1\n", "name it e.csv"),
        ("edges", "e.npz", "0 1\n", "e.npz: not a .npz file: it holds text"),
        ("edges", "e.pt", "0 1\n", "e.pt: not a .pt file: it holds text"),
        (
            "features",
            "x.npy",
            "0.5,1.5\n",
            "x.npy: not a .npy file: it holds text (first line '0.5,1.5'); give features as an array written by numpy.save",
        ),
        ("labels", "y.npy", "", "y.npy: the file is empty; expected an array written by numpy.save"),
        ("labels", "y.npy", b"\x00\x01binary", "y.npy: not a .npy file (it lacks the .npy header)"),
    ],
)
def test_a_file_that_is_not_its_binary_format_says_what_it_is(tmp_path, field, name, content, fragment):
    edge_index, features, labels = _arrays()
    files = {"edges": tmp_path / "e0.npy", "features": tmp_path / "x0.npy", "labels": tmp_path / "y0.npy"}
    np.save(files["edges"], edge_index.numpy())
    np.save(files["features"], features.numpy())
    np.save(files["labels"], labels.numpy())
    files[field] = tmp_path / name
    if isinstance(content, bytes):
        files[field].write_bytes(content)
    else:
        files[field].write_text(content)
    with pytest.raises(ValueError) as err:
        load_arrays(**files)
    assert fragment in str(err.value) and "pickle" not in str(err.value)


_SNAP = "# Directed graph (each unordered pair of nodes is saved once)\n# FromNodeId\tToNodeId\n"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("edges.txt", "{u} {v}\n"),
        ("edges.csv", "{u} {v}\n"),  # whitespace under a .csv name
        ("edges.tsv", "{u}\t{v}\n"),
        ("edges", "{u}\t{v}\n"),
        ("edges.edges", "{u} {v} {{}}\n"),  # networkx's write_edgelist, data=True
        ("edges.txt", "{u} {v} {{'weight': 0.5, 'kind': 'a b'}}  # a comment\n"),
        ("edges.txt", "{u}  {v}  7\n"),  # a weight column
        ("edges.csv", "{u}, {v}\n"),
        ("edges.txt", "{u},{v},0.25\n"),  # CSV with a weight under a .txt name
    ],
)
def test_text_edge_lists_are_read_whatever_their_name(tmp_path, name, text):
    edge_index, features, labels = _arrays()
    header = "src,dst,w\n" if text.count(",") == 2 else _SNAP
    lines = header + "".join(text.format(u=u, v=v) for u, v in edge_index.T.tolist())
    (tmp_path / name).write_text(lines)
    ds = _load_edges_strictly(tmp_path / name, *_write_xy(tmp_path))
    ref = GraphDataset.from_arrays(edge_index, features, labels)
    assert torch.equal(ds.graph.indptr, ref.graph.indptr) and torch.equal(ds.graph.indices, ref.graph.indices)


def test_networkx_and_gzipped_snap_edge_lists_are_read(tmp_path):
    nx = pytest.importorskip("networkx")
    edge_index, features, labels = _arrays()
    ref = GraphDataset.from_arrays(edge_index, features, labels)
    graph = nx.Graph()
    graph.add_nodes_from(range(60))
    for k, (u, v) in enumerate(edge_index.T.tolist()):
        graph.add_edge(u, v, **({"weight": k} if k % 2 else {}))  # some edges without the weight
    x, y = _write_xy(tmp_path)
    for data in (True, False, ["weight"]):
        nx.write_edgelist(graph, tmp_path / "g.edgelist", data=data)
        ds = _load_edges_strictly(tmp_path / "g.edgelist", x, y)
        assert torch.equal(ds.graph.indices, ref.graph.indices), data
    with gzip.open(tmp_path / "snap.txt.gz", "wt") as f:
        f.write(_SNAP + "".join(f"{u}\t{v}\n" for u, v in edge_index.T.tolist()))
    ds = _load_edges_strictly(tmp_path / "snap.txt.gz", x, y)
    assert torch.equal(ds.graph.indices, ref.graph.indices)


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("edges.txt", "0 1\n1 x\n", "edges.txt: line 2 is '1 x'; expected two integer node ids"),
        ("edges.tsv", "# c\n0\t1\n2\n", "edges.tsv: line 3 is '2'; expected two integer node ids"),
        ("edges.txt", "0 1\n1.0 2.0\n", "edges.txt: line 2 is '1.0 2.0'"),
        ("edges", "a b\nc d\n", "edges: line 2 is 'c d'"),  # only a first line may be a header
        ("edges.csv", "src,dst,w\n0,1,2\n1,2\n", "edges.csv: line 3 is '1,2'; expected 3 comma-separated"),
        ("edges.csv", "0,1\n1,x,2\n", "edges.csv: line 2 is '1,x,2'"),
        ("edges.txt", b"0 1\n" * 2000 + b"1 2\xe9\n", "edges.txt: line 2001 is not UTF-8 text"),
        ("edges.txt", b"0 1\n1 2\xe9\n", "edges.txt: neither a .npy, .npz or .pt file nor a text edge list"),
        (
            "edges.edges",
            b"\x00\x01\x02",
            "edges.edges: neither a .npy, .npz or .pt file nor a text edge list",
        ),
    ],
)
def test_bad_lines_of_a_text_edge_list_name_file_and_line(tmp_path, name, content, fragment):
    if isinstance(content, bytes):
        (tmp_path / name).write_bytes(content)
    else:
        (tmp_path / name).write_text(content)
    with pytest.raises(ValueError) as err:
        _load_edges_strictly(tmp_path / name, *_write_xy(tmp_path))
    assert fragment in str(err.value)


def test_file_problems_are_named(tmp_path):
    edge_index, features, labels = _arrays()
    np.save(tmp_path / "e.npy", edge_index.numpy())
    np.save(tmp_path / "x.npy", features.numpy())
    with pytest.raises(FileNotFoundError, match=r"labels file not found: .*nope\.npy"):
        load_arrays(tmp_path / "e.npy", tmp_path / "x.npy", tmp_path / "nope.npy")
    np.savez(tmp_path / "y.npz", a=labels.numpy(), b=labels.numpy())
    with pytest.raises(
        ValueError, match=r"y\.npz: holds \['a', 'b'\]; expected one array or one named labels or y"
    ):
        load_arrays(tmp_path / "e.npy", tmp_path / "x.npy", tmp_path / "y.npz")
    (tmp_path / "y.parquet").write_text("")
    with pytest.raises(ValueError, match=r"unknown file type '\.parquet' for labels"):
        load_arrays(tmp_path / "e.npy", tmp_path / "x.npy", tmp_path / "y.parquet")
    np.save(tmp_path / "short.npy", labels.numpy()[:-1])
    with pytest.raises(
        ValueError,
        match=r"\(edges=.*e\.npy, features=.*x\.npy, labels=.*short\.npy\): field 'labels' has 59 entries",
    ):
        load_arrays(tmp_path / "e.npy", tmp_path / "x.npy", tmp_path / "short.npy")


def test_recipe_trains_on_array_files_and_names_a_bad_one(tmp_path):
    edge_index, _, labels = _arrays(n=200)
    features = torch.nn.functional.one_hot(labels, 3).float() + 0.1 * torch.randn(200, 3)  # learnable
    np.savetxt(tmp_path / "edges.csv", edge_index.T.numpy(), fmt="%d", delimiter=",")
    np.save(tmp_path / "x.npy", features.numpy())
    np.save(tmp_path / "y.npy", labels.numpy())
    files = [
        f"data.edges={tmp_path / 'edges.csv'}",
        f"data.features={tmp_path / 'x.npy'}",
        f"data.labels={tmp_path / 'y.npy'}",
    ]
    proc = run_recipe(tmp_path / "run", "data=arrays", *files, "data.name=mine", "trainer.max_steps=30")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mine: 200 nodes" in proc.stdout and float(result_fields(proc.stdout)["test"]) > 0.6
    (tmp_path / "edges.csv").write_text("0,1\n1,oops\n")
    bad = run_recipe(tmp_path / "bad", "data=arrays", *files)
    assert_one_error_line(bad, "edges.csv: line 2 is '1,oops'")
