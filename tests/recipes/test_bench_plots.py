"""The benchmarks that BENCHMARKS.md shows as plots write them from their saved JSON: a real
samplers run at toy scale writes its table, JSON and PNG, and ``--replot`` of both the samplers
bench and the grid redraws the PNGs from the JSON alone."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO


def bench(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "recipes" / "bench.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_samplers_writes_table_json_and_plot_and_replots(tmp_path):
    out = tmp_path / "samplers"
    proc = bench(
        "samplers",
        *("--nodes", "4000", "--batch-size", "32", "--batches", "2", "--scipy-batches", "1"),
        *("--rounds", "1", "--variants", "fastgcn", "ladies_f", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads((out / "samplers.json").read_text())
    by_name = {row["sampler"]: row for row in saved["rows"]}
    assert set(by_name) == {"neighbor (gcn)", "gns (mean, 1% cache)", "fastgcn", "ladies_f"}
    assert by_name["neighbor (gcn)"]["scipy"] is None
    for name in ("fastgcn", "ladies_f"):
        row = by_name[name]
        assert row["ours"] > 0 and row["scipy"] > 0 and row["ratio_low"] <= row["ratio_high"]
    table = (out / "samplers.md").read_text()
    assert "- command: `python recipes/bench.py samplers" in table and "| ladies_f |" in table
    assert is_png(out / "samplers.png")

    (out / "samplers.png").unlink()
    proc = bench("samplers", "--replot", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert is_png(out / "samplers.png")


def test_samplers_replot_without_a_saved_run_names_the_missing_file(tmp_path):
    proc = bench("samplers", "--replot", "--out", str(tmp_path))
    assert proc.returncode != 0
    assert str(tmp_path / "samplers.json") in proc.stderr


def test_grid_replot_draws_both_pngs_from_grid_json(tmp_path):
    runs = [
        {
            "dataset": "toy",
            "model": model,
            "config": config,
            "seed": 0,
            "epoch_time_s": epoch,
            "timeline": [[0.0, 0.0, None], [0.25, 1.5, None], [0.5, 2.0, None]],
        }
        for model in ("sage", "gcn")
        for config, epoch in (("sequential", 1.0), ("pipeline", 0.8), ("dgl", 1.2))
    ]
    (tmp_path / "grid.json").write_text(json.dumps(runs))
    proc = bench("grid", "--replot", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert is_png(tmp_path / "speedup.png") and is_png(tmp_path / "utilisation.png")

    missing = bench("grid", "--replot", "--out", str(tmp_path / "none"))
    assert missing.returncode != 0 and "grid.json" in missing.stderr
