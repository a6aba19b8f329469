"""Test metric of model x dataset through the recipe, mean ± std over seeds.

    python recipes/bench.py accuracy --models gcn,sage --datasets cora,citeseer,dblp --seeds 0,1,2

Each run is ``recipes/train.py`` in a fresh process (early stopping on, at most ``--max-steps``
batches), so the table shows exactly what a user of the recipe gets.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._report import machine_header, write_report

TRAIN = Path(__file__).resolve().parents[1] / "train.py"


def run_recipe(overrides: list[str], timeout: float) -> dict[str, str]:
    """Run the recipe once and return its RESULT fields; raise with the error line if it failed."""
    cmd = [sys.executable, str(TRAIN), *overrides, "trainer.enable_progress_bar=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"recipe failed ({' '.join(overrides)}): {tail}")
    return dict(item.split("=", 1) for item in lines[-1].split()[1:])


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py accuracy", description=__doc__)
    parser.add_argument("--models", default="gcn,sage")
    parser.add_argument("--datasets", default="cora,citeseer,dblp")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--extra", default="", help="more recipe overrides, space separated")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    models, datasets = args.models.split(","), args.datasets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]

    rows = []
    for dataset in datasets:
        for model in models:
            tests, vals, times = [], [], []
            for seed in seeds:
                overrides = [
                    f"model={model}",
                    f"data={dataset}",
                    f"seed={seed}",
                    "trainer.max_epochs=-1",
                    f"trainer.max_steps={args.max_steps}",
                    *args.extra.split(),
                ]
                t0 = time.perf_counter()
                result = run_recipe(overrides, args.timeout)
                times.append(time.perf_counter() - t0)
                tests.append(float(result["test"]))
                vals.append(float(result["val"]))
                print(f"{dataset} {model} seed={seed}: val={vals[-1]:.4f} test={tests[-1]:.4f}", flush=True)
            rows.append(
                f"| {dataset} | {model} | {mean_std(vals)} | {mean_std(tests)} | "
                f"{statistics.mean(times):.0f} |"
            )
    table = [
        "| dataset | model | val (best) | test at best val | wall s / run |",
        "|---|---|---|---|---|",
        *rows,
    ]
    write_report("Test metric through the recipe", machine_header("accuracy", argv), table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
