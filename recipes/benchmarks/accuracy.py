"""Test metric of model x dataset through the recipe, mean ± std over seeds.

    python recipes/bench.py accuracy --models gcn,sage --datasets cora,citeseer,dblp --seeds 0,1,2

With ``--jobs N`` N recipe runs go at once (one torch thread each); a run that fails is reported
in the table and the exit status, and does not stop the others.

Each run is ``recipes/train.py`` in a fresh process (early stopping on, at most ``--max-steps``
batches), so the table shows exactly what a user of the recipe gets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks._recipe import result_fields
from benchmarks._report import machine_header, write_report

TRAIN = Path(__file__).resolve().parents[1] / "train.py"


def run_recipe(overrides: list[str], timeout: float) -> dict[str, str]:
    """Run the recipe once and return its RESULT fields; raise with the error line if it failed."""
    with tempfile.TemporaryDirectory(prefix="mqgnn-accuracy-") as run_dir:
        # its own output folder: parallel runs started in the same second never share checkpoints
        cmd = [
            sys.executable,
            str(TRAIN),
            *overrides,
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    fields = result_fields(proc.stdout)
    if proc.returncode != 0 or fields is None:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"recipe failed ({' '.join(overrides)}): {tail}")
    return fields


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def run_one(model: str, dataset: str, seed: int, args: argparse.Namespace) -> dict:
    overrides = [
        f"model={model}",
        f"data={dataset}",
        f"seed={seed}",
        "trainer.max_epochs=-1",
        f"trainer.max_steps={args.max_steps}",
        *args.extra.split(),
    ]
    t0 = time.perf_counter()
    run = dict(model=model, dataset=dataset, seed=seed)
    try:
        result = run_recipe(overrides, args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        run["error"] = str(err).splitlines()[-1]
        print(f"{dataset} {model} seed={seed}: FAILED {run['error']}", flush=True)
        return run
    run.update(test=float(result["test"]), val=float(result["val"]), wall_s=time.perf_counter() - t0)
    run["batches"] = int(result["batches"])
    print(f"{dataset} {model} seed={seed}: val={run['val']:.4f} test={run['test']:.4f}", flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py accuracy", description=__doc__)
    parser.add_argument("--models", default="gcn,sage")
    parser.add_argument("--datasets", default="cora,citeseer,dblp")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--extra", default="", help="more recipe overrides, space separated")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--jobs", type=int, default=1, help="recipe runs at a time (each with one torch thread when > 1)"
    )
    parser.add_argument("--jsonl", type=Path, help="append every finished run here as it ends")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    models, datasets = args.models.split(","), args.datasets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.jobs > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the runs: no oversubscribed cores

    todo = [(m, d, s) for d in datasets for m in models for s in seeds]
    runs = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for run in pool.map(lambda job: run_one(*job, args), todo):
            runs.append(run)
            if args.jsonl is not None:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps(run) + "\n")
    write_report("Test metric through the recipe", machine_header("accuracy", argv), table(runs), args.out)
    return 0 if all("error" not in r for r in runs) else 1


def table(runs: list[dict]) -> list[str]:
    """One row per (dataset, model): val and test as mean ± std over the seeds that finished."""
    rows = [
        "| dataset | model | val (best) | test at best val | seeds | batches | wall s / run |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["dataset"], run["model"]), []).append(run)
    for (dataset, model), group in groups.items():
        done = [r for r in group if "error" not in r]
        if not done:
            rows.append(f"| {dataset} | {model} | failed | failed | 0/{len(group)} | - | - |")
            continue
        rows.append(
            f"| {dataset} | {model} | {mean_std([r['val'] for r in done])} | "
            f"{mean_std([r['test'] for r in done])} | {len(done)}/{len(group)} | "
            f"{statistics.mean(r['batches'] for r in done):.0f} | {statistics.mean(r['wall_s'] for r in done):.0f} |"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
