"""The Hydra recipe end to end, and its one-line errors on bad input."""

import numpy as np
import pytest
from helpers.recipe import assert_one_error_line, result_fields, run_recipe


def test_default_recipe_trains_on_the_generated_graph(tmp_path):
    proc = run_recipe(tmp_path, "data.scale=0.02", "trainer.max_epochs=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["model"] == "sage"
    # 40 classes: chance is 0.025; the generated graph is learnable
    assert float(result["test"]) > 0.2
    assert float(result["val"]) > 0.2
    assert int(result["batches"]) > 0


def test_run_shorter_than_the_validation_interval_scores_its_last_weights(tmp_path):
    """max_steps below val_every_batches: no checkpoint was saved, yet the run reports val and test."""
    proc = run_recipe(tmp_path, "data.scale=0.02", "trainer.max_epochs=-1", "trainer.max_steps=5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert int(result["batches"]) == 5
    assert 0.0 <= float(result["val"]) <= 1.0 and 0.0 <= float(result["test"]) <= 1.0


def test_unknown_config_name_is_one_error_line(tmp_path):
    proc = run_recipe(tmp_path, "model=nonexistent_model")
    line = assert_one_error_line(proc, "model", "nonexistent_model")
    assert "sage" in line  # lists the available options


def write_npz(path, **overrides):
    n = 6
    arrays = dict(
        indptr=np.array([0, 1, 2, 3, 4, 5, 6]),
        indices=np.array([1, 0, 3, 2, 5, 4]),
        x_indptr=np.arange(n + 1),
        x_indices=np.zeros(n, dtype=np.int64),
        x_data=np.ones(n, dtype=np.float32),
        x_shape=np.array([n, 2]),
        y=np.array([0, 1, 0, 1, 0, 1]),
        train_idx=np.array([0, 1]),
        val_idx=np.array([2, 3]),
        test_idx=np.array([4, 5]),
        metric=np.array("accuracy"),
    )
    arrays.update(overrides)
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "override,fragments",
    [
        ({"indices": np.array([1, 0, 3, 2, 5, 9])}, ["indices", "9"]),
        ({"x_data": np.array([1, 1, np.nan, 1, 1, 1], dtype=np.float32)}, ["x_data", "nan", "node 2"]),
        ({"y": np.array([0, 1, 0, 1, 0, -3])}, ["label", "-3"]),
    ],
)
def test_malformed_npz_is_one_error_line(tmp_path, override, fragments):
    bad = write_npz(tmp_path / "bad.npz", **override)
    proc = run_recipe(tmp_path, "data=cora", f"data.path={bad}", "data.name=bad")
    line = assert_one_error_line(proc)
    low = line.lower()
    for fragment in fragments:
        assert fragment.lower() in low, line


def test_missing_ogb_root_is_one_error_line(tmp_path):
    root = f"paths.ogb_root={tmp_path / 'nowhere'}"
    assert_one_error_line(
        run_recipe(tmp_path, "data=arxiv", root, "data.download=false"), "nowhere", "download=false"
    )


def test_gns_model_trains_through_the_pipeline(tmp_path):
    """The sampler's GNS cache reaches the pipelined DataModule, which keeps it on the device."""
    overrides = ["model=sage_gns", "model.sampler.fraction=0.1", "loader=pipeline", "data.scale=0.02"]
    proc = run_recipe(tmp_path, *overrides, "trainer.max_epochs=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["model"] == "sage_gns"
    assert float(result["test"]) > 0.2  # 40 classes: chance is 0.025
    rates = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "cache hit rate" in line]
    assert len(rates) == 1, proc.stdout[-2000:]
    per_epoch = [float(r) for r in rates[0].split(":")[1].split(",")]
    assert len(per_epoch) == 4 and all(0.0 < r < 1.0 for r in per_epoch)


@pytest.mark.slow  # two rank processes each import the stack; the strategy itself is tested on forked ranks
@pytest.mark.distributed
def test_full_graph_strategy_trains_on_partitions(tmp_path):
    """strategy=pipeqs picks the fullgraph loader and model through Hydra defaults, runs 2 gloo
    ranks and reports the halo bytes per epoch."""
    proc = run_recipe(
        tmp_path,
        "strategy=pipeqs",
        "data.scale=0.01",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert int(result["batches"]) == 3  # one step per epoch: the partition
    assert int(result["comm_bytes"]) > 0
    assert 0.0 <= float(result["test"]) <= 1.0


def test_full_graph_model_with_a_sampled_loader_is_one_error_line(tmp_path):
    proc = run_recipe(tmp_path, "strategy=graph_parallel", "loader=sequential", "data.scale=0.01")
    assert_one_error_line(proc, "do not fit", "strategy=graph_parallel")


@pytest.mark.slow  # two rank processes each import the stack; the strategy itself is tested on forked ranks
@pytest.mark.distributed
def test_gnnpipe_recipe_reports_bytes_staleness_and_memory(tmp_path):
    """strategy=gnnpipe with a deep GCNII on 2 ranks (2 stages): the RESULT line carries the bytes
    per epoch, the share of stale history reads and every rank's peak memory."""
    proc = run_recipe(
        tmp_path,
        "strategy=gnnpipe",
        "model=gcnii_8",
        "data.scale=0.01",
        "strategy.num_chunks=4",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert int(result["batches"]) == 3
    assert int(result["comm_bytes"]) > 0
    assert 0.0 < float(result["stale_reads"]) < 1.0
    assert result["max_staleness"] == "1"
    assert len(result["peak_rss_mb"].split("/")) == 2
    assert 0.0 <= float(result["test"]) <= 1.0


def test_impossible_pipeline_layout_is_one_error_line(tmp_path):
    """More stages than the model has convolutions: one error line naming both numbers."""
    proc = run_recipe(tmp_path, "strategy=gnnpipe", "model=gcnii_8", "strategy.stages=9", "data.scale=0.01")
    assert_one_error_line(proc, "9 pipeline stages", "8 graph convolutions")
