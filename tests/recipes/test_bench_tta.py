"""``bench tta``: how a run's time to target is read, the baselines' shared epoch loop, the peak RSS
of a process, and (in the DGL environment) the whole benchmark on a real graph: cora, converted from
its committed files."""

from __future__ import annotations

import argparse
import sys
import time

import pytest
from helpers.paths import REPO


@pytest.fixture
def tta(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import tta

    return tta


@pytest.fixture
def baseline(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import _baseline

    return _baseline


def run(seed: int, curve: list[list[float]]) -> dict:
    return {"seed": seed, "curve": curve, "val": max(c[2] for c in curve), "test": 0.5, "peak_rss_mb": 500.0}


def test_time_to_target_is_the_first_validation_at_or_above_it(tta):
    curve = [[1.0, 0.8, 0.50, 1], [2.0, 1.6, 0.70, 2], [3.0, 2.4, 0.65, 3], [4.0, 3.2, 0.80, 4]]
    assert tta.time_to(run(0, curve), 0.70) == (2.0, 2)
    assert tta.time_to(run(0, curve), 0.75) == (4.0, 4)
    assert tta.time_to(run(0, curve), 0.81) is None
    assert tta.time_to({"error": "failed"}, 0.5) is None


def test_median_counts_runs_that_never_get_there_as_slowest(tta):
    fast, slow = run(0, [[1.0, 1.0, 0.9, 1]]), run(1, [[5.0, 5.0, 0.9, 3]])
    never = run(2, [[9.0, 9.0, 0.1, 9]])
    assert tta.median_time([fast, slow, never], 0.8) == 3.0  # two of three reached: their median
    assert tta.median_time([fast, never, dict(never, seed=3)], 0.8) is None  # a minority reached
    assert tta.median_run([never, slow, fast], 0.8)["seed"] == 1
    assert tta.median_run([{"error": "x"}], 0.8) is None


def test_max_time_is_the_trainers_days_hours_minutes_seconds(tta):
    assert tta.max_time(120) == "00:00:02:00"
    assert tta.max_time(90061.2) == "01:01:01:02"  # rounded up: the budget is never cut short


def test_run_process_reports_the_childs_own_peak_rss_and_kills_it_at_the_timeout(tta):
    # the pages touched, then held long enough to be read (the launching test process is far larger)
    grow = "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ok'); time.sleep(1)"
    rc, out, _, rss = tta.run_process([sys.executable, "-c", grow], timeout=60)
    assert (rc, out.strip()) == (0, "ok")
    assert 300 < rss < 600, rss
    t0 = time.perf_counter()
    rc, *_ = tta.run_process([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert rc != 0 and time.perf_counter() - t0 < 10


_SHARED_AFTER_FORK = """
import os, time
b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])
if os.fork() == 0:  # a worker: the 300 MiB are its parent's pages, shared until written
    time.sleep(3); os._exit(0)
print('ok', flush=True); time.sleep(3); os.wait()
"""


def test_the_pss_of_a_process_and_its_workers_counts_their_shared_pages_once(tta):
    rc, out, _, pss = tta.run_process([sys.executable, "-c", _SHARED_AFTER_FORK], 60, peak=tta.tree_pss_mb)
    assert (rc, out.strip()) == (0, "ok")
    assert 300 < pss < 450, pss  # the RSS of the two would sum to 600 MiB and more


def test_fit_epochs_records_the_clock_at_every_validation_and_stops_at_the_budget(baseline):
    scores = iter([(0.5, 0.4), (0.7, 0.6), (0.6, 0.5), (0.9, 0.8)])
    curve = baseline.fit_epochs(lambda: time.sleep(0.02), lambda: (time.sleep(0.01), next(scores))[1], 4)
    assert curve.val_scores == [0.5, 0.7, 0.6, 0.9] and curve.test_scores == [0.4, 0.6, 0.5, 0.8]
    assert all(b > a for a, b in zip(curve.wall_s, curve.wall_s[1:]))
    for wall, train, k in zip(curve.wall_s, curve.train_s, range(1, 5)):
        assert train >= 0.02 * k and wall - train >= 0.01 * k  # validation counted in wall only
    summary = curve.summary()
    assert (summary["best_epoch"], summary["best_val"], summary["test_metric"], summary["epochs"]) == (
        3,
        0.9,
        0.8,
        4,
    )
    short = baseline.fit_epochs(lambda: time.sleep(0.05), lambda: (0.5, 0.5), 100, max_time_s=0.12)
    assert len(short.epoch_times) == 3  # the first epoch's end past 0.12 s
    with pytest.raises(ValueError, match="epochs must be at least 1, got 0"):
        baseline.fit_epochs(lambda: None, lambda: (0.0, 0.0), 0)


def test_a_recipe_run_gives_its_validation_curve_against_wall_time(tta, tmp_path):
    args = type("Args", (), {"model": "sage", "budget_s": 120})()
    overrides = ["data.scale=0.02", "val_every_batches=2", "val_share=null", "trainer.max_steps=6"]
    result = tta.run_ours("defaults", overrides, "generated", 0, args)
    assert "error" not in result, result
    walls = [c[0] for c in result["curve"]]
    assert len(walls) == 3 and walls == sorted(walls) and walls[0] > 0
    assert all(train <= wall and 0 <= val <= 1 and epoch >= 1 for wall, train, val, epoch in result["curve"])
    assert result["val"] == pytest.approx(max(c[2] for c in result["curve"]), abs=1e-4)
    assert result["peak_rss_mb"] > 100


def test_table_gives_each_systems_median_time_to_dgls_target_and_the_speed_up(tta):
    dgl = [run(s, [[2.0 * (s + 1), 0, 0.80, 2], [9.0, 0, 0.90, 4]]) for s in range(3)]  # 2, 4, 6 s
    ours = [run(s, [[1.0, 0, 0.85, 1]]) for s in range(2)] + [run(2, [[3.0, 0, 0.70, 1]])]
    result = {
        "graph": "g",
        "dgl_config": {"lr": 0.01, "batch_size": 1024},
        "target": 0.80,
        "groups": {"dgl": dgl, "best": [dict(r, config={"overrides": "model.module.lr=0.01"}) for r in ours]},
    }
    rows = {row.split(" | ")[1]: row.split(" | ") for row in tta.table([result])[2:]}
    assert rows["dgl"][2:6] == ["lr 0.01, batch 1024, workers 0", "0.8000", "4.0 (2.0, 4.0, 6.0)", "1.00x"]
    assert rows["best"][2:6] == ["`model.module.lr=0.01`", "0.8000", "1.0 (1.0, 1.0, -)", "4.00x"]
    assert rows["best"][-1] == "2/3 |"


def test_a_sweep_that_fails_at_every_rate_says_so_with_dgls_error(tta, tmp_path):
    args = argparse.Namespace(
        model="sage",
        seeds=[0],
        dgl_lrs=[0.01],
        dgl_batches=[1024],
        budget_s=10,
        max_epochs=2,
        margin=0.005,
        dgl_python=sys.executable,  # the main environment: no DGL
        jsonl=None,
    )
    with pytest.raises(RuntimeError, match=r"DGL's loop failed on cora at every learning rate: .*dgl"):
        tta.Bench(args).tune_dgl("cora")


@pytest.mark.dgl
def test_dgl_is_tuned_on_the_first_seed_and_its_configuration_kept_by_time_to_target(
    tta, tmp_path, served_data, monkeypatch
):
    # the baseline's processes read cora from the data root the committed files were converted into
    monkeypatch.setitem(tta.quiet_env, "MQGNN_DATA_ROOT", str(served_data))
    monkeypatch.delitem(tta.quiet_env, "MQGNN_DATA_MIRROR", raising=False)
    args = argparse.Namespace(
        model="sage",
        seeds=[0, 1],
        dgl_lrs=[0.003, 0.01],
        dgl_batches=[1024, 512],
        budget_s=30,
        max_epochs=12,
        margin=0.005,
        dgl_python=sys.executable,
        jsonl=tmp_path / "runs.jsonl",
    )
    bench = tta.Bench(args)
    config = bench.tune_dgl("cora")
    sweep = bench.runs
    assert [r["config"] for r in sweep] == [
        {"lr": 0.003, "batch_size": 1024},
        {"lr": 0.01, "batch_size": 1024},
        {"lr": max(sweep[:2], key=lambda r: r["val"])["config"]["lr"], "batch_size": 512},
    ]
    assert all("error" not in r and r["seed"] == 0 and 1 <= len(r["curve"]) <= 12 for r in sweep)
    target = max(r["val"] for r in sweep) - 0.005
    kept = min(sweep, key=lambda r: tta.time_to(r, target) or (float("inf"), 0))
    assert config == kept["config"]
    walls = [c[0] for c in kept["curve"]]
    assert walls == sorted(walls) and kept["peak_rss_mb"] > 100
    again = tta.Bench(args)  # resumed from the log: nothing measured twice
    assert again.tune_dgl("cora") == config and len(again.runs) == 3


def test_plot_draws_the_median_seed_of_each_system(tta, tmp_path):
    curve = [[0.5, 0.4, 0.6, 1], [1.0, 0.8, 0.8, 2]]
    result = {
        "graph": "g",
        "target": 0.75,
        "groups": {"dgl": [run(0, curve), run(1, curve)], "defaults": [run(0, curve), {"error": "x"}]},
    }
    tta.plot(result, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 1000


def test_the_reported_command_quotes_an_argument_with_spaces(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks._report import machine_header

    header = machine_header("tta", ["--best", "model.module.lr=0.01 val_every_batches=10"])
    assert (
        header[0]
        == "- command: `python recipes/bench.py tta --best 'model.module.lr=0.01 val_every_batches=10'`"
    )


def test_the_tuned_candidate_sweeps_rates_then_batches_and_keeps_the_soonest_to_target(tta, monkeypatch):
    """Rates at the first batch size, then the other sizes at the rate that got there soonest; the
    kept configuration's run on the first seed is the sweep's, not measured twice."""
    reach_s = {("0.003", "512"): None, ("0.01", "512"): 3.0, ("0.03", "512"): 2.0, ("0.03", "1024"): 1.5}
    measured = []

    def fake_run_ours(name, overrides, graph, seed, args):
        settings = dict(o.split("=", 1) for o in overrides)
        key = (settings["model.module.lr"], settings["loader.batch_size"])
        measured.append((key, seed))
        seconds = reach_s.get(key)
        curve = [[seconds, 0, 0.9, 1]] if seconds else [[9.0, 0, 0.6 + 0.1 * (key[0] == "0.01"), 1]]
        return dict(run(seed, curve), system=name, graph=graph, config={"overrides": " ".join(overrides)})

    monkeypatch.setattr(tta, "run_ours", fake_run_ours)
    args = argparse.Namespace(
        seeds=[0, 1],
        best="val_every_batches=10",
        tune_lrs=[0.003, 0.01, 0.03],
        tune_batches=[512, 1024],
        jsonl=None,
    )
    bench = tta.Bench(args)
    kept = bench.tune_ours("g", target=0.8)
    assert kept == ["val_every_batches=10", "model.module.lr=0.03", "loader.batch_size=1024"]
    assert [key for key, _ in measured] == [
        ("0.003", "512"),
        ("0.01", "512"),
        ("0.03", "512"),
        ("0.03", "1024"),
    ]
    assert [bench.ours("tuned", "g", s, kept)["seed"] for s in args.seeds] == [0, 1]
    assert measured[4:] == [(("0.03", "1024"), 1)]  # seed 0's run came from the sweep
