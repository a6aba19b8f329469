"""The dropout benchmark times our compiled ReLU + dropout beside torch's and the tensor mask."""

import subprocess
import sys

from helpers.paths import REPO


def test_dropout_benchmark_times_the_three_forms_at_each_rate(tmp_path):
    out = tmp_path / "dropout.md"
    cmd = [sys.executable, str(REPO / "recipes" / "bench.py"), "dropout", "--shape", "1024,256"]
    cmd += ["--rates", "0.5,0.2", "--repeats", "3", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| 0.")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("0.5", "1"), ("0.2", "16")]
    for row in rows:
        torch_ms, tensor_ms, compiled_ms = (float(c) for c in row[2:5])
        assert min(torch_ms, tensor_ms, compiled_ms) > 0
        assert abs(float(row[5].strip().rstrip("x")) - torch_ms / compiled_ms) < 0.02 * torch_ms / compiled_ms
