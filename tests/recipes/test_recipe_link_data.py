"""``task=link`` on data that bring their own edge split: OGB's ogbl datasets (tiny ones in OGB's
layout, fetched from a local server) scored by OGB's metric, and your own files (an edge list
without features or labels, split files); bad input ends in one ``error:`` line naming the file."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.ogb_link import served_ogb_link, write_tiny_ogb_link
from helpers.recipe import assert_one_error_line, result_fields, run_recipe

from lightning_mqgnn.graph import registry

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")

SHORT = ("trainer.max_epochs=1", "loader=sequential", "loader.batch_size=64")


@pytest.fixture(scope="module")
def ogb_env(tmp_path_factory) -> dict[str, str]:
    """A data root holding ogbl-collab as downloaded from a local server by OGB's downloader, and
    ogbl-ddi and ogbl-citation2 in OGB's layout; the recipes read it with downloads off."""
    root = tmp_path_factory.mktemp("data_root")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(registry.DATA_ROOT_ENV, str(root))
        mp.delenv(registry.MIRROR_ENV, raising=False)
        with served_ogb_link(tmp_path_factory.mktemp("served"), "ogbl-collab", mp):
            registry.load_dataset("ogbl_collab")
    for name in ("ogbl-ddi", "ogbl-citation2"):
        write_tiny_ogb_link(root / "ogb", name)
    return {registry.DATA_ROOT_ENV: str(root), registry.MIRROR_ENV: ""}


def test_ogbl_collab_trains_on_ogbs_split_scored_at_its_hits_k(tmp_path, ogb_env):
    proc = run_recipe(tmp_path, "task=link", "data=ogbl_collab", "data.download=false", *SHORT, env=ogb_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "ogbl-collab: 60 nodes" in proc.stdout and "link split: 246 undirected training edges" in proc.stdout
    )
    result = result_fields(proc.stdout)
    assert (result["data"], result["task"], result["metric"]) == ("ogbl-collab", "link", "hits@50")
    assert 0.0 <= float(result["val"]) <= 1.0 and "test_auc" in result
    # the command line's K over the data's
    proc = run_recipe(
        tmp_path / "k", "task=link", "data=ogbl_collab", "data.download=false", "model.module.hits_k=5", *SHORT,
        env=ogb_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result_fields(proc.stdout)["metric"] == "hits@5"


def test_ogbl_ddi_learns_node_inputs_and_is_scored_at_hits_20(tmp_path, ogb_env):
    proc = run_recipe(tmp_path, "task=link", "data=ogbl_ddi", "data.download=false", *SHORT, env=ogb_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["metric"] == "hits@20" and float(result["feature_mb_per_batch"]) == 0.0


def test_ogbl_citation2_is_scored_by_mrr(tmp_path, ogb_env):
    proc = run_recipe(
        tmp_path, "task=link", "data=ogbl_citation2", "data.download=false", *SHORT, env=ogb_env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["metric"] == "mrr" and 0.0 < float(result["val"]) <= 1.0 and "test_hits" in result


def test_link_data_under_node_classification_is_one_line(tmp_path, ogb_env):
    proc = run_recipe(tmp_path, "data=ogbl_ddi", "data.download=false", env=ogb_env)
    assert_one_error_line(
        proc, "'ogbl-ddi' is a link-prediction dataset with its own edge split", "task=link"
    )


@pytest.fixture
def own_files(tmp_path):
    """An edge list of 80 nodes and a split of its undirected edges into files."""
    rng = np.random.default_rng(3)
    src = rng.integers(0, 80, 600)
    edges = np.unique(np.sort(np.stack([src, (src + rng.integers(1, 8, 600)) % 80], 1), 1), axis=0)
    np.savetxt(tmp_path / "edges.csv", edges, fmt="%d", delimiter=",")
    perm = rng.permutation(edges)
    taken = {tuple(e) for e in edges.tolist()}
    neg = []
    while len(neg) < 40:
        u, v = sorted(int(x) for x in rng.integers(0, 80, 2))
        if u != v and (u, v) not in taken:
            taken.add((u, v))
            neg.append((u, v))
    files = {"train": perm[40:], "val_pos": perm[:20], "test_pos": perm[20:40]}
    files.update(val_neg=np.asarray(neg[:20]), test_neg=np.asarray(neg[20:]))
    paths = {}
    for field, pairs in files.items():
        paths[field] = tmp_path / (f"{field}.csv" if field.startswith("t") else f"{field}.npy")
        if paths[field].suffix == ".csv":
            np.savetxt(paths[field], pairs, fmt="%d", delimiter=",")
        else:
            np.save(paths[field], pairs)
    return tmp_path / "edges.csv", paths, files


def split_overrides(paths) -> list[str]:
    return [f"data.link_split.{field}={path}" for field, path in paths.items()]


def test_own_edge_list_and_split_files_without_features_or_labels(tmp_path, own_files):
    edges, paths, _ = own_files
    proc = run_recipe(
        tmp_path, "task=link", "data=arrays", f"data.edges={edges}", *split_overrides(paths), *SHORT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "arrays: 80 nodes, no features; link split:" in proc.stdout
    result = result_fields(proc.stdout)
    assert result["metric"] == "hits@50" and 0.0 <= float(result["test"]) <= 1.0
    # an edge list alone: a random split of it
    proc = run_recipe(tmp_path / "alone", "task=link", "data=arrays", f"data.edges={edges}", *SHORT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test_mrr" in result_fields(proc.stdout)


def test_bad_own_link_data_is_one_line_naming_the_file(tmp_path, own_files):
    edges, paths, files = own_files
    bad = files["test_neg"].copy()
    bad[:4] = files["train"][:4]
    np.save(tmp_path / "bad_neg.npy", bad)
    overrides = split_overrides({**paths, "test_neg": tmp_path / "bad_neg.npy"})
    proc = run_recipe(tmp_path / "a", "task=link", "data=arrays", f"data.edges={edges}", *overrides)
    assert_one_error_line(proc, f"'test_neg' ({tmp_path / 'bad_neg.npy'}) holds 4 true edges")
    # node classification of a graph without labels
    proc = run_recipe(tmp_path / "b", "data=arrays", f"data.edges={edges}")
    assert_one_error_line(proc, "data 'arrays' has no node labels to classify", "task=link")
    # a decoder built for another width than the encoder's embeddings
    decoder = (
        "model.module.decoder={_target_:lightning_mqgnn.models.link_predictor.HadamardMLPDecoder,width:16}"
    )
    proc = run_recipe(tmp_path / "c", "task=link", "data=arrays", f"data.edges={edges}", decoder)
    assert_one_error_line(
        proc, "decoder HadamardMLPDecoder does not take the encoder's embeddings of width 128"
    )
