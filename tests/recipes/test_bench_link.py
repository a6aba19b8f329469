"""``bench link``: its loops (the plain-torch GAE reference, DGL's and PyG's, each in its own
environment) on one saved split, its report's tables, and (in the DGL environment) the whole
benchmark on cora, converted from its committed files: the report's structure, not its timings."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import pytest
import torch
from helpers.paths import REPO
from helpers.pipeline import small_dataset

from lightning_mqgnn.graph.link_split import random_link_split


@pytest.fixture
def benchmarks(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    import benchmarks

    return benchmarks


@pytest.fixture
def link_data(benchmarks):
    """A small graph's features and its split, as a loop reads them from the split file."""
    from benchmarks._link import LinkData

    dataset = small_dataset(num_nodes=600)
    graph, split = random_link_split(dataset.graph, seed=0, neg_per_source=10)
    return LinkData(dataset, graph, split)


def loop_args(**kw) -> argparse.Namespace:
    settings = dict(
        model="sage", fanouts=[4, 4], batch_size=256, epochs=3, lr=0.01, max_time_s=None, hidden=16
    )
    settings.update(dropout=0.5, hits_k=20, seed=0)
    return argparse.Namespace(**(settings | kw))


def check_fit(result: dict, epochs: int) -> None:
    assert result["epochs"] == epochs and len(result["wall_s"]) == epochs
    assert result["wall_s"] == sorted(result["wall_s"])
    assert result["best_val"] == max(result["val_scores"]) == result["val"]["hits"]
    for scores in (result["val"], result["test"]):
        assert set(scores) == {"hits", "mrr", "auc"} and all(0 <= v <= 1 for v in scores.values())


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_the_gae_reference_trains_full_batch_and_scores_the_splits_pairs(benchmarks, link_data, model):
    from benchmarks.gae_reference import normalized_adjacency, run_gae

    result = run_gae(link_data, loop_args(model=model, epochs=4))
    check_fit(result, 4)
    assert result["losses"][-1] < result["losses"][0]
    adjacency = normalized_adjacency(link_data, model).to_dense()
    if model == "sage":  # a mean: every row with neighbours sums to one
        sums = adjacency.sum(1)
        assert torch.allclose(sums[sums > 0], torch.ones(int((sums > 0).sum())))
    else:  # symmetric, with self loops
        assert torch.allclose(adjacency, adjacency.T) and bool((adjacency.diagonal() > 0).all())


def test_our_recipe_trains_on_the_saved_split_and_gives_its_curve_and_scores(benchmarks, tmp_path):
    from benchmarks import link

    args = argparse.Namespace(
        val=0.05, test=0.10, split_seed=3, neg_per_source=20, budget_s=120, gae_budget_s=120
    )
    split = link.write_split("generated_links", tmp_path / "split.npz", args)
    overrides = ["task=link", "model=sage", "trainer.max_steps=4", "val_every_batches=2", "val_share=null"]
    run = link.run_ours("sage", overrides, "generated_links", split, 0, args)
    assert "error" not in run, run
    assert run["config"] == {"overrides": " ".join(overrides), "split": split["fingerprint"]}
    assert len(run["curve"]) == 2 and all(len(c) == 4 for c in run["curve"])
    assert run["val"] == pytest.approx(max(c[2] for c in run["curve"]), abs=1e-4)
    assert set(run["val_scores"]) == set(run["test_scores"]) == {"hits", "mrr", "auc"}
    assert run["epoch_s"] > 0 and run["peak_rss_mb"] > 100


def test_pygs_batches_lose_their_positive_edges_in_both_directions(benchmarks):
    from benchmarks.pyg_link_baseline import without_positives

    edge_index = torch.tensor([[0, 1, 1, 2, 3, 0], [1, 0, 2, 1, 0, 3]])
    pairs, labels = torch.tensor([[0, 2], [1, 3]]), torch.tensor([1.0, 0.0])  # (2, 3) is a negative
    kept = without_positives(edge_index, pairs, labels, 4)
    assert kept.tolist() == [[1, 2, 3, 0], [2, 1, 0, 3]]


def result_of(graph: str, groups: dict, target: float = 0.6, reference: str | None = "dgl") -> dict:
    configs = {s: {"model": "sage", "lr": 0.01, "batch_size": 512} for s in groups}
    configs.update({s: "task=link model=sage" for s in groups if s in ("sage", "gcn")})
    return {"graph": graph, "configs": configs, "reference": reference, "target": target, "groups": groups}


def run(seed: int, curve: list[list[float]], test: float = 0.5) -> dict:
    scores = {"hits": test, "mrr": test / 2, "auc": 0.9}
    return {
        "seed": seed,
        "curve": curve,
        "val": max(c[2] for c in curve),
        "test": test,
        "val_scores": dict(scores, hits=max(c[2] for c in curve)),
        "test_scores": scores,
        "epoch_s": 1.5,
        "peak_rss_mb": 500.0,
    }


def test_the_table_times_every_system_to_the_faster_baselines_target(benchmarks):
    from benchmarks import link

    dgl = [run(s, [[2.0 * (s + 1), 0, 0.62, 1]]) for s in range(3)]  # 2, 4, 6 s
    sage = [run(s, [[1.0, 0, 0.65, 1]], test=0.55) for s in range(3)]
    gae = [run(s, [[0.5, 0, 0.7, 3]], test=0.5) for s in range(3)]
    result = result_of("g", {"gae-sage": gae, "dgl": dgl, "sage": sage})
    header, _, *rows = link.table([result], 50)
    assert "target (val Hits@50)" in header and "test MRR" in header
    cells = {row.split(" | ")[1]: row.split(" | ") for row in rows}
    assert cells["dgl"][3:6] == ["0.6000", "4.0 (2.0, 4.0, 6.0)", "1.00x"]
    assert cells["sage"][3:6] == ["0.6000", "1.0 (1.0, 1.0, 1.0)", "4.00x"]
    assert cells["sage"][-1] == "3/3 |" and cells["sage"][11:14] == ["0.5500", "0.2750", "0.9000"]
    (reference,) = link.reference_table([result])[2:]
    assert reference == "| g | sage | 0.5000 | 0.5500 | 0.2500 | 0.2750 | yes |"


@pytest.mark.dgl
def test_the_bench_runs_every_system_on_one_split_and_reports_them(
    benchmarks, tmp_path, served_data, monkeypatch
):
    from benchmarks import link, tta

    # every process reads cora from the data root the committed files were converted into
    monkeypatch.setitem(tta.quiet_env, "MQGNN_DATA_ROOT", str(served_data))
    monkeypatch.delitem(tta.quiet_env, "MQGNN_DATA_MIRROR", raising=False)
    out = tmp_path / "out"
    argv = [
        "--datasets=cora",
        "--seeds=0",
        "--systems=gae,dgl,sage,gcn",
        "--budget-s=3",
        "--gae-budget-s=3",
        "--max-epochs=2",
        "--gae-epochs=3",
        "--lrs=0.01",
        "--gae-lrs=0.01",
        f"--dgl-python={sys.executable}",
        "--sage=trainer.max_steps=3",
        "--gcn=trainer.max_steps=3",
        f"--out={out}",
    ]
    assert link.main(argv) == 0
    (result,) = json.loads((out / "link.json").read_text())
    assert set(result["groups"]) == {"gae-gcn", "gae-sage", "dgl", "sage", "gcn"}
    assert result["reference"] == "dgl" and result["target"] == pytest.approx(
        result["groups"]["dgl"][0]["val"] - 0.01
    )
    split = result["split"]
    assert (out / "splits" / "cora.npz").exists() and split["train"] > 10 * split["val"] > 0
    for system, (one,) in result["groups"].items():
        assert "error" not in one, (system, one)
        assert one["config"]["split"] == split["fingerprint"] and one["curve"] and one["epoch_s"] > 0
        assert set(one["test_scores"]) == {"hits", "mrr", "auc"}, system
    plotted = importlib.util.find_spec("matplotlib") is not None  # the DGL environment has none
    assert (out / "cora.png").exists() == plotted
    text = (out / "link.md").read_text()
    assert text.count("| cora |") == 7  # five systems, two models against the GAE
    assert "python recipes/bench.py link --datasets=cora" in text
    runs = (out / "runs.jsonl").read_text().splitlines()
    assert len(runs) == 5
    assert link.main(argv) == 0  # resumed from the log: nothing measured again
    assert (out / "runs.jsonl").read_text().splitlines() == runs


@pytest.mark.dgl
def test_dgls_loop_excludes_each_edges_reverse_and_scores_the_splits_pairs(benchmarks, link_data):
    from benchmarks.dgl_link_baseline import run_dgl_link, training_graph

    g, reverse = training_graph(link_data, self_loops=False)
    src, dst = g.edges()
    assert torch.equal(src[reverse], dst) and torch.equal(dst[reverse], src)
    for model in ("sage", "gcn"):
        check_fit(run_dgl_link(link_data, loop_args(model=model)), 3)


@pytest.mark.pyg_sparse
def test_pygs_loop_scores_the_splits_pairs(benchmarks, link_data):
    from benchmarks.pyg_link_baseline import run_pyg_link

    for model in ("sage", "gcn"):
        check_fit(run_pyg_link(link_data, loop_args(model=model)), 3)
