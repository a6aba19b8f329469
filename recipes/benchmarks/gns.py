"""GNS against node-wise sampling: accuracy, feature traffic and time to accuracy, per graph.

    python recipes/bench.py gns --datasets amazon_photo,dblp --models sage,gcn --seeds 0,1,2

Every run is ``recipes/train.py`` to early stopping in a fresh process, one after another (time to
accuracy is a timing: run it on a quiet machine). Variants (``--variants``):

- ``nodewise``: ``model=<m>``, node-wise sampling, every input row gathered and moved;
- ``gns``: ``model=<m>_gns`` as shipped (1% cache, cached neighbours first, uncached ones filling
  up to the fan-out with one per ``fill_weight`` of them at most, LABOR-* layers);
- ``gns_full``: the same filled up to the fan-out, as the paper (``model.sampler.fill_weight=null``);
- ``gns_fill1``: the same with one uncached neighbour per node (``model.sampler.fill_weight=inf``);
- ``gns_neighbor``: ``gns`` with node-wise layers (``model.sampler.sampling=neighbor``);
- ``cached_only``: the GNS authors' rule, cached neighbours only, node-wise upper layer;
- ``labor_star``: ``model=labor_star_<m>``, LABOR-* without a cache (what the cache adds).

Every variant trains at one learning rate (``--lr``) and with the hidden width and weight start of
``model=<m>_gns`` (``model=sage``'s own defaults differ), so the table compares the samplers. Per
(graph, model) the target is node-wise sampling's best validation metric (mean over its seeds)
minus ``--margin``; a run's time to it is the training time (validation excluded, ``time/train_s``
of the run's metrics log) at its first validation at or above the target.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._recipe import network_overrides, result_fields
from benchmarks._report import machine_header, write_report

TRAIN = Path(__file__).resolve().parents[1] / "train.py"
VARIANTS = {
    "nodewise": ["model={m}", "loader.aggregate_inputs=false"],
    "gns": ["model={m}_gns"],
    "gns_full": ["model={m}_gns", "model.sampler.fill_weight=null"],
    "gns_fill1": ["model={m}_gns", "model.sampler.fill_weight=inf"],
    "gns_neighbor": ["model={m}_gns", "model.sampler.sampling=neighbor"],
    "cached_only": ["model={m}_gns", "model.sampler.sampling=neighbor", "model.sampler.rule=cached_only"],
    "labor_star": ["model=labor_star_{m}", "loader.aggregate_inputs=false"],
}


def validation_curve(run_dir: Path) -> list[tuple[float, float, float]]:
    """``(train_s, wall_s, val)`` at every validation of a run, from its CSV metrics log."""
    (log,) = run_dir.glob("lightning_logs/version_*/metrics.csv")
    val: dict[str, float] = {}
    times: dict[str, tuple[float, float]] = {}
    with log.open() as f:
        for row in csv.DictReader(f):
            if row.get("val/metric"):
                val[row["step"]] = float(row["val/metric"])
            if row.get("time/train_s"):
                times[row["step"]] = (float(row["time/train_s"]), float(row["time/wall_s"]))
    return sorted((*times[step], metric) for step, metric in val.items() if step in times)


def run_one(model: str, data: str, seed: int, variant: str, extra: list[str], timeout: float) -> dict:
    """One recipe run to early stopping: its RESULT fields and validation curve, or its error."""
    overrides = [o.format(m=model) for o in VARIANTS[variant]]
    run: dict = dict(model=model, data=data, seed=seed, variant=variant)
    with tempfile.TemporaryDirectory(prefix="mqgnn-gns-") as run_dir:
        cmd = [
            sys.executable,
            str(TRAIN),
            *overrides,
            *data.split(),
            *extra,
            f"seed={seed}",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        run["process_s"] = time.perf_counter() - t0
        fields = result_fields(proc.stdout)
        if proc.returncode != 0 or fields is None:
            run["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            return run
        run["curve"] = validation_curve(Path(run_dir))
    run.update(
        val=float(fields["val"]),
        test=float(fields["test"]),
        batches=int(fields["batches"]),
        train_time_s=float(fields["train_time_s"]),
        rows=float(fields["feature_rows_per_batch"]),
        mb=float(fields["feature_mb_per_batch"]),
        hit_rate=float(fields.get("cache_hit_rate", "nan")),
    )
    return run


def time_to(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at the first validation at or above ``target``; None if never."""
    return next((train_s for train_s, _, val in curve if val >= target), None)


def table(runs: list[dict], margin: float) -> list[str]:
    """One row per (graph, model, variant): test per seed and mean, traffic against node-wise,
    and median time to node-wise's best validation minus ``margin``."""
    rows = [
        "| graph | model | variant | test (per seed) | mean | Δ vs node-wise | rows / batch | MB / batch "
        "| bytes vs node-wise | cache hits | time to target s (median) | reached |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):  # a resumed JSONL may hold them out of order
        groups.setdefault((run["data"], run["model"]), {}).setdefault(run["variant"], []).append(run)
    for (data, model), variants in groups.items():
        base = [r for r in variants.get("nodewise", []) if "error" not in r]
        target = statistics.mean(r["val"] for r in base) - margin if base else None
        base_test = statistics.mean(r["test"] for r in base) if base else None
        base_mb = statistics.mean(r["mb"] for r in base) if base else None
        graph = data.removeprefix("data=")
        for variant, group in variants.items():
            done = [r for r in group if "error" not in r]
            if not done:
                rows.append(f"| {graph} | {model} | {variant} | failed: {group[0]['error']} |" + " |" * 8)
                continue
            test = statistics.mean(r["test"] for r in done)
            mb = statistics.mean(r["mb"] for r in done)
            times = [time_to(r["curve"], target) for r in done] if target is not None else []
            reached = [t for t in times if t is not None]
            median = f"{statistics.median(reached):.1f}" if len(reached) * 2 > len(times) else "-"
            hits = statistics.mean(r["hit_rate"] for r in done)
            tests = ", ".join(f"{r['test']:.3f}" for r in done)
            rows.append(
                f"| {graph} | {model} | {variant} | {tests} | {test:.3f} | "
                f"{'' if base_test is None else f'{100 * (test - base_test):+.1f}'} | "
                f"{statistics.mean(r['rows'] for r in done):,.0f} | {mb:.2f} | "
                f"{'' if base_mb is None else f'{mb / base_mb:.2f}x'} | "
                f"{'' if hits != hits else f'{hits:.3f}'} | {median} | {len(reached)}/{len(times)} |"
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py gns", description=__doc__)
    parser.add_argument("--datasets", default="amazon_photo,dblp,coauthor_physics")
    parser.add_argument(
        "--data-overrides",
        default="",
        help="extra overrides per graph, e.g. 'products_like=data.scale=0.05' (';' between graphs)",
    )
    parser.add_argument("--models", default="sage,gcn")
    parser.add_argument(
        "--lr",
        type=float,
        default=1e-3,
        help="every variant's learning rate (the node-wise models' default differs from the GNS ones')",
    )
    parser.add_argument("--extra", default="", help="more recipe overrides for every run, space separated")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--margin", type=float, default=0.01, help="target: node-wise best val minus this")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--jsonl", type=Path, help="append every finished run here; runs already there are kept"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.data_overrides.split(";") if item)
    overrides = [f"model.module.lr={args.lr:g}", *args.extra.split()]  # --extra may set another
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - VARIANTS.keys())
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    runs = []
    if args.jsonl is not None and args.jsonl.exists():
        runs = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
    done = {(r["model"], r["data"], r["seed"], r["variant"]) for r in runs}
    for name in args.datasets.split(","):
        data = f"data={name} {extra.get(name, '')}".strip()
        for model in args.models.split(","):
            network = [*network_overrides(f"{model}_gns", ("hidden", "glorot_init")), *overrides]
            for variant in variants:
                for seed in (int(s) for s in args.seeds.split(",")):
                    if (model, data, seed, variant) in done:
                        continue
                    run = run_one(model, data, seed, variant, network, args.timeout)
                    runs.append(run)
                    status = run.get("error") or f"test={run['test']:.4f} rows={run['rows']:.0f}"
                    print(f"{data} {model} {variant} seed={seed}: {status}", flush=True)
                    if args.jsonl is not None:
                        with args.jsonl.open("a") as f:
                            f.write(json.dumps(run) + "\n")
    write_report(
        "GNS against node-wise sampling", machine_header("gns", argv), table(runs, args.margin), args.out
    )
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
