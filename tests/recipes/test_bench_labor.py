"""The LABOR benchmark's vertex counts run end to end (its imports follow the library), and LABOR
samples fewer input vertices than node-wise sampling on the default generated graph."""

import re
import subprocess
import sys

from helpers.paths import REPO


def test_labor_counts_run_and_labor_samples_fewer_input_vertices(tmp_path):
    cmd = [sys.executable, str(REPO / "recipes" / "bench.py"), "labor", "--parts", "counts"]
    cmd += ["--datasets", "generated", "--models", "sage,labor_sage", "--seeds", "0"]
    cmd += ["--count-batches", "3", "--batch-size", "256", "--out", str(tmp_path / "labor")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = dict(re.findall(r"^generated (\w+) seed 0: (\d+) input vertices", proc.stdout, re.M))
    assert set(counts) == {"sage", "labor_sage"}, proc.stdout[-2000:]
    assert 0 < int(counts["labor_sage"]) < int(counts["sage"])
