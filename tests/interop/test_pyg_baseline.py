"""The PyG baseline recipe: its one-line error where PyG cannot sample, and (in the PyG environment,
where torch-sparse or pyg-lib imports) a run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers.paths import REPO

from lightning_mqgnn.graph.generated import generate_graph

EPOCHS = 4
BATCH = 128


@pytest.fixture
def recipe(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import pyg_baseline

    return pyg_baseline


@pytest.fixture(scope="module")
def graph():
    return generate_graph("arxiv", num_nodes=1200, num_features=32, num_classes=4, seed=0)


def test_without_a_sampling_backend_bench_prints_one_line_naming_the_env_script(recipe):
    # both backends hidden, so the check runs the same in the main and the PyG environment
    code = (
        "import runpy, sys\n"
        "sys.modules['torch_sparse'] = sys.modules['pyg_lib'] = None\n"
        "sys.argv = ['bench.py', 'pyg_baseline', '--data', 'generated:arxiv', '--epochs', '1']\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO / "recipes", capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"error: {recipe.NO_SAMPLER}"
    assert "pyg-lib or torch-sparse" in proc.stderr and "bash .ci/pyg_env.sh" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.pyg_sparse
@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_pyg_baseline_trains_and_reports_per_batch_times(recipe, graph, model):
    out = recipe.run_pyg_baseline(
        graph, model=model, fanouts=(5, 5), batch_size=BATCH, epochs=EPOCHS, hidden=32, lr=1e-2
    )
    per_epoch = -(-graph.train_idx.numel() // BATCH)
    assert (out["system"], out["model"], out["dataset"]) == ("pyg", model, graph.name)
    assert out["batches_per_epoch"] == per_epoch
    assert len(out["batch_times"]) == len(out["losses"]) == EPOCHS * per_epoch
    assert len(out["epoch_times"]) == len(out["val_scores"]) == len(out["test_scores"]) == EPOCHS
    assert out["wall_s"] == sorted(out["wall_s"]) and out["peak_rss_mb"] > 0
    assert all(t > 0 for t in out["batch_times"])
    assert out["train_time"] == pytest.approx(sum(out["epoch_times"]))
    assert out["best_epoch"] == max(range(EPOCHS), key=lambda e: out["val_scores"][e])
    assert out["test_metric"] == out["test_scores"][out["best_epoch"]]
    assert sum(out["losses"][-per_epoch:]) < sum(out["losses"][:per_epoch])
    majority = torch.bincount(graph.labels[graph.test_idx]).max().item() / graph.test_idx.numel()
    assert out["test_metric"] > majority + 0.1, (out["test_metric"], majority)


@pytest.mark.pyg_sparse
def test_max_time_ends_the_fit_at_the_first_epoch_past_it(recipe, graph):
    out = recipe.run_pyg_baseline(graph, batch_size=BATCH, epochs=50, hidden=16, max_time_s=1e-6)
    assert len(out["epoch_times"]) == len(out["val_scores"]) == 1
    assert len(out["batch_times"]) == out["batches_per_epoch"]


@pytest.mark.pyg_sparse
def test_main_writes_the_json_through_bench(tmp_path):
    # bench.py in a fresh process, as the benchmarks run it; generated graphs keep it offline
    path = tmp_path / "out.json"
    cmd = [sys.executable, "recipes/bench.py", "pyg_baseline", "--data", "generated:arxiv", "--scale", "0.01"]
    cmd += ["--epochs", "2", "--batch-size", "256", "--hidden", "16", "--threads", "1", "--json", str(path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("pyg-sage generated-arxiv-x0.01: "), proc.stdout
    result = json.loads(path.read_text())
    assert (result["system"], result["epochs"], result["fanouts"], result["batch_size"]) == (
        "pyg",
        2,
        [5, 5],
        256,
    )
    assert "bf16" not in result


@pytest.mark.pyg_sparse
@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_full_graph_inference_on_the_sparse_adjacency_equals_it_on_the_edge_list(recipe, graph, model):
    """The validation's layers on ``transposed_adjacency`` give the logits they give on
    ``edge_index`` (a message per edge, the memory of every edge's source row)."""
    from lightning_mqgnn.graph.pyg import to_pyg_data

    data = to_pyg_data(graph)
    adjacency = recipe.transposed_adjacency(data)
    assert adjacency.layout == torch.sparse_csr and adjacency.shape == (graph.num_nodes, graph.num_nodes)
    assert adjacency._nnz() == data.edge_index.shape[1]
    torch.manual_seed(0)
    net = recipe.PyGNet(model, graph.num_features, 16, graph.num_classes, 2, dropout=0.5).eval()
    with torch.no_grad():
        on_edges = net(data.x, data.edge_index)
    splits = (graph.val_idx, graph.test_idx)
    scores = recipe.evaluate(net, data.x, adjacency, graph, splits)
    assert scores == pytest.approx(recipe.split_scores(on_edges, graph, splits), abs=0.01)
    with torch.no_grad():
        assert torch.allclose(net(data.x, adjacency), on_edges, atol=1e-5)
