"""The grid's order and ratios: a seed's configurations run back to back, in an order that rotates
from seed to seed, and each speed-up is given seed by seed beside the ratio of the means."""

import pytest
from helpers.paths import REPO


@pytest.fixture
def grid(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import grid

    return grid


def test_a_seeds_configurations_run_back_to_back_in_rotating_order(grid):
    order = grid.run_order(["sequential", "pipeline", "dgl"], [1, 2, 3, 4])
    assert order == [
        ("sequential", 1), ("pipeline", 1), ("dgl", 1),
        ("pipeline", 2), ("dgl", 2), ("sequential", 2),
        ("dgl", 3), ("sequential", 3), ("pipeline", 3),
        ("sequential", 4), ("pipeline", 4), ("dgl", 4),
    ]  # fmt: skip


def test_the_table_gives_each_seeds_speedup_beside_the_ratio_of_means(grid):
    def run(config, seed, epoch):
        return dict(
            dataset="d", model="sage", config=config, seed=seed, epoch_time_s=epoch,
            train_time_s=5 * epoch, batch_time_ms=10.0, batch_time_std_ms=1.0, metric=0.8,
        )  # fmt: skip

    runs = [run("dgl", 1, 1.0), run("sequential", 1, 0.5), run("sequential", 2, 0.8), run("dgl", 2, 1.2)]
    rows = grid.summarise(runs)
    sequential = next(r for r in rows if "| sequential |" in r)
    # mean epochs: DGL 1.1 s, ours 0.65 s; per seed 1.0 / 0.5 and 1.2 / 0.8
    assert "| 1.00x (1.00, 1.00) | 1.69x (2.00, 1.50) |" in sequential
    dgl = next(r for r in rows if "| dgl |" in r)
    assert "| 0.59x (0.50, 0.67) | 1.00x (1.00, 1.00) |" in dgl


def test_dgls_loop_trains_at_the_learning_rate_and_width_of_our_fits(grid):
    """The grid compares epoch times and test metrics after the same epochs, so both sides take
    the recipe's rate and hidden width."""
    assert grid.recipe_module("sage", "") == (0.01, 128)
    assert grid.recipe_module("gcn", "") == (0.01, 256)
    assert grid.recipe_module("ladies", "") == (1e-3, 256)
    assert grid.recipe_module("sage_pyg", "") == (1e-3, 256)
    assert grid.recipe_module("sage", "loader.batch_size=1024 model.module.lr=0.003") == (0.003, 128)
    assert grid.recipe_module("sage", "preset=paper model.module.hidden=256") == (1e-3, 256)
