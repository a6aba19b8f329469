"""Link prediction: time to the baselines' Hits@K, and whether our models reach a full-batch GAE's.

    python recipes/bench.py link --datasets cora,citeseer,amazon_photo,coauthor_cs --seeds 0,1,2 \\
        --budget-s 60 --pyg-python .venv-pyg/bin/python --out docs/benchmarks/link

Per graph one split (``--split-seed``, 85/5/10 as the recipe's ``task=link``, fixed negatives:
as many per held-out split as it has positives, and ``--neg-per-source`` per positive for MRR),
saved once (``save_link_split``) and read by every run, so all score the same pairs. Every run
is a fresh process, one at a time (a timing: run it on a quiet machine), each bounded by
``--budget-s`` seconds of wall time (the GAE's by ``--gae-budget-s``):

1. **GAE reference** (``bench.py gae_reference``, this environment): a full-batch graph
   auto-encoder in plain torch, GCN and SAGE encoders of the width and dropout of our ``model=gcn``
   and ``model=sage``, the learning rate swept on the first seed (``--gae-lrs``, kept: the best
   validation Hits@K), each run bounded by ``--gae-budget-s``: the accuracy our sampled models
   should reach.
2. **DGL** (``bench.py dgl_link_baseline``, ``--dgl-python``): ``as_edge_prediction_sampler`` +
   ``NeighborSampler`` + ``Uniform(1)`` negatives, ``exclude="reverse_id"``, ``dgl.nn`` SAGE.
3. **PyG** (``bench.py pyg_link_baseline``, ``--pyg-python``, skipped without one):
   ``LinkNeighborLoader`` with binary negatives, a batch's positives dropped from its subgraph.
   Each baseline sweeps ``--lrs`` on the first seed, keeping the rate that reaches the sweep's
   best validation less ``--margin`` soonest (as ``bench tta``), then runs the other seeds.
   **Target**: the faster baseline's (the lower median time to its own target) mean best
   validation Hits@K over seeds, less ``--margin``.
4. **Ours**: ``recipes/train.py task=link model=sage`` and ``model=gcn`` (with ``--sage`` and
   ``--gcn`` overrides) on the saved split (``task.seeds.split_file``), with the recipe's own
   validation schedule and early stopping, bounded by the budget (``trainer.max_time``).

A run's **time to target** is the wall time since training started (validation included; data
loading and process start not) at its first validation at or above the target; the speed-up is
the faster baseline's median over seeds divided by the system's. **Epoch s**: training time per
pass over the training edges, validation excluded (the median over seeds). Best val: the best
validation Hits@K, with that validation's MRR and AUC; test: the scores of the weights of that
validation. Peak RSS: the training process's ``VmHWM``. Both baselines and the GAE validate with
exact full-graph inference after every epoch. ``--out DIR`` writes ``link.md``, every run with
its curve in ``link.json``, a plot per graph (validation Hits@K against wall time, the median
seed of each system; where matplotlib imports), the splits and ``runs.jsonl`` (``--jsonl``: resumed, runs already
there are not measured again).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

from benchmarks import tta
from benchmarks._recipe import recipe_config, result_fields
from benchmarks._report import machine_header, write_report

RECIPES = Path(__file__).resolve().parents[1]
REPO = RECIPES.parent
BASELINES = ("dgl", "pyg")
OURS = ("sage", "gcn")
SYSTEMS = ("gae", *BASELINES, *OURS)


def write_split(graph: str, path: Path, args) -> dict:
    """The split of ``graph`` (``random_link_split`` as ``task=link`` draws it) saved at ``path``;
    its sizes and a fingerprint of its arrays (a run is resumed only on the same split)."""
    import numpy as np

    from benchmarks._baseline import load_dataset
    from lightning_mqgnn.graph.link_split import random_link_split, save_link_split

    dataset = load_dataset(graph)
    _, split = random_link_split(
        dataset.graph, val=args.val, test=args.test, seed=args.split_seed, neg_per_source=args.neg_per_source
    )
    save_link_split(split, path)
    digest = hashlib.sha256()
    with np.load(path) as f:
        for key in sorted(f.files):
            digest.update(key.encode() + f[key].tobytes())
    return {
        "file": str(path),
        "fingerprint": digest.hexdigest()[:16],
        "num_nodes": split.num_nodes,
        "train": int(split.train.shape[1]),
        "val": int(split.val_pos.shape[1]),
        "test": int(split.test_pos.shape[1]),
    }


def run_loop(system: str, python: str, graph: str, split: dict, seed: int, config: dict, args) -> dict:
    """One fit of a loop of ``_link`` (``gae_reference``, ``dgl_link_baseline``,
    ``pyg_link_baseline``): its curve ``[wall_s, train_s, val Hits@K, epoch]`` per validation."""
    run: dict = dict(system=system, graph=graph, seed=seed, config=config)
    name = "gae_reference" if system.startswith("gae") else f"{system}_link_baseline"
    with tempfile.TemporaryDirectory(prefix="mqgnn-link-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [
            python,
            str(RECIPES / "bench.py"),
            name,
            f"--data={graph}",
            f"--split={split['file']}",
            f"--model={config['model']}",
            f"--lr={config['lr']}",
            f"--epochs={args.gae_epochs if name == 'gae_reference' else args.max_epochs}",
            f"--max-time-s={args.gae_budget_s if name == 'gae_reference' else args.budget_s}",
            f"--hidden={config.get('hidden', args.hidden)}",
            *([f"--dropout={config['dropout']}"] if "dropout" in config else []),
            f"--hits-k={args.hits_k}",
            f"--seed={seed}",
            f"--json={out}",
            *([] if name == "gae_reference" else [f"--batch-size={config['batch_size']}"]),
        ]
        try:
            rc, _, stderr, rss = run_process(cmd, max(args.budget_s, args.gae_budget_s) * 3 + 600)
        except OSError as err:  # no such python: the environment was not built
            run["error"] = f"cannot run {python}: {err.strerror}"
            return run
        if rc != 0 or not out.exists():
            run["error"] = tta.failure(stderr)
            return run
        result = json.loads(out.read_text())
    run.update(
        curve=[
            [w, t, v, e + 1]
            for e, (w, t, v) in enumerate(zip(result["wall_s"], result["train_s"], result["val_scores"]))
        ],
        val=result["best_val"],
        test=result["test"]["hits"],
        val_scores=result["val"],
        test_scores=result["test"],
        epochs=result["epochs"],
        best_epoch=result["best_epoch"] + 1,
        epoch_s=statistics.mean(result["epoch_times"]),
        peak_rss_mb=rss,
    )
    return run


def run_process(cmd: list[str], timeout: float) -> tuple[int, str, str, float]:
    """``tta.run_process`` with this tree first on the run's ``PYTHONPATH``: every environment
    then imports this ``lightning_mqgnn`` (the split file's reader), not one installed there."""
    path = os.pathsep.join(filter(None, [str(REPO), tta.quiet_env.get("PYTHONPATH")]))
    return tta.run_process(cmd, timeout, env={**tta.quiet_env, "PYTHONPATH": path})


def recipe_link_curve(run_dir: Path) -> list[list[float]]:
    """``[wall_s, train_s, val Hits@K, epoch, val MRR, val AUC]`` at every validation of a recipe
    run (its metrics log; NaN for a score the split lacks)."""
    (log,) = run_dir.glob("lightning_logs/version_*/metrics.csv")
    val: dict[str, list[float]] = {}
    times: dict[str, list[float]] = {}
    with log.open() as f:
        for row in csv.DictReader(f):
            if row.get("val/metric"):
                extra = [float(row.get(k) or "nan") for k in ("val/mrr", "val/auc")]
                val[row["step"]] = [float(row["val/metric"]), float(row["epoch"]) + 1, *extra]
            if row.get("time/wall_s"):
                times[row["step"]] = [float(row["time/wall_s"]), float(row["time/train_s"])]
    return sorted([*times[step], *val[step]] for step in val if step in times)


def run_ours(model: str, overrides: list[str], graph: str, split: dict, seed: int, args) -> dict:
    """One recipe fit of ``task=link model=<model>`` on the saved split, bounded by the budget."""
    config = {"overrides": " ".join(overrides), "split": split["fingerprint"]}
    run: dict = dict(system=model, graph=graph, seed=seed, config=config)
    with tempfile.TemporaryDirectory(prefix="mqgnn-link-") as run_dir:
        cmd = [
            sys.executable,
            str(RECIPES / "train.py"),
            f"data={graph}",
            *overrides,
            f"task.seeds.split_file={split['file']}",
            f"seed={seed}",
            f"+trainer.max_time='{tta.max_time(args.budget_s)}'",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ]
        rc, stdout, stderr, rss = run_process(cmd, args.budget_s * 3 + 600)
        fields = result_fields(stdout)
        if rc != 0 or fields is None:
            run["error"] = tta.failure(stderr)
            return run
        curve = recipe_link_curve(Path(run_dir))
    best = max(range(len(curve)), key=lambda i: curve[i][2]) if curve else None
    batch_size = int(recipe_config([f"data={graph}", *overrides]).loader.batch_size)
    batches_per_epoch = math.ceil(split["train"] / batch_size)
    val = {"hits": float(fields["val"])}
    if best is not None:
        val.update({k: v for k, v in zip(("mrr", "auc"), curve[best][4:]) if not math.isnan(v)})
    run.update(
        curve=[c[:4] for c in curve],
        val=float(fields["val"]),
        test=float(fields["test"]),
        val_scores=val,
        test_scores={"hits": float(fields["test"])}
        | {k: float(fields[f"test_{k}"]) for k in ("mrr", "auc") if f"test_{k}" in fields},
        epochs=int(fields["epochs"]),
        best_epoch=curve[best][3] if best is not None else None,
        epoch_s=float(fields["train_time_s"]) / max(int(fields["batches"]), 1) * batches_per_epoch,
        peak_rss_mb=rss,
    )
    return run


class LinkBench(tta.Bench):
    """The runs of one invocation, resumed from and appended to ``--jsonl`` (``tta.Bench``)."""

    def loop(self, system: str, graph: str, split: dict, seed: int, config: dict) -> dict:
        python = {"dgl": self.args.dgl_python, "pyg": self.args.pyg_python}.get(system, sys.executable)
        config = {**config, "split": split["fingerprint"]}
        measure = partial(run_loop, system, python, graph, split, seed, config, self.args)
        return self.run(system, graph, seed, config, measure)

    def sweep(self, system: str, graph: str, split: dict, lrs: list[float], base: dict, keep: str) -> dict:
        """The configuration of ``system`` on ``graph``: ``base`` at each rate of ``lrs`` on the
        first seed; kept (``keep``): the one of the best validation ("best"), or the one reaching
        the sweep's best less ``--margin`` soonest ("soonest")."""
        seed = self.args.seeds[0]
        runs = [self.loop(system, graph, split, seed, {**base, "lr": lr}) for lr in lrs]
        done = [r for r in runs if "error" not in r]
        if not done:
            return {**base, "lr": lrs[0]}  # every seed then fails the same way, and says why
        if keep == "best":
            chosen = max(done, key=lambda r: r["val"])
        else:
            target = max(r["val"] for r in done) - self.args.margin
            chosen = min(done, key=lambda r: (tta.time_to(r, target) or (math.inf, 0))[0])
        return {k: v for k, v in chosen["config"].items() if k != "split"}

    def graph(self, graph: str) -> dict:
        args = self.args
        split = write_split(graph, args.split_dir / f"{graph}.npz", args)
        groups: dict[str, list[dict]] = {}
        configs: dict[str, dict | str] = {}
        if "gae" in args.systems:
            for model in OURS:
                # the width and dropout of our model of that encoder
                module = recipe_config(self.overrides(model)).model.module
                base = {"model": model, "hidden": int(module.hidden), "dropout": float(module.dropout)}
                config = self.sweep(f"gae-{model}", graph, split, args.gae_lrs, base, "best")
                configs[f"gae-{model}"] = config
                groups[f"gae-{model}"] = [
                    self.loop(f"gae-{model}", graph, split, s, config) for s in args.seeds
                ]
        own_targets: dict[str, float] = {}
        for system in BASELINES:
            if system not in args.systems or (system == "pyg" and not args.pyg_python):
                continue
            base = {"model": args.baseline_model, "batch_size": args.batch_size}
            config = self.sweep(system, graph, split, args.lrs, base, "soonest")
            configs[system] = config
            groups[system] = [self.loop(system, graph, split, s, config) for s in args.seeds]
            done = [r for r in groups[system] if "error" not in r]
            if done:
                own_targets[system] = statistics.mean(r["val"] for r in done) - args.margin
        reference = min(
            own_targets, key=lambda s: tta.median_time(groups[s], own_targets[s]) or math.inf, default=None
        )
        target = own_targets[reference] if reference else math.nan
        for model in OURS:
            if model not in args.systems:
                continue
            overrides = self.overrides(model)
            configs[model] = " ".join(overrides)
            groups[model] = [self.ours_link(model, graph, split, s, overrides) for s in args.seeds]
        return {
            "graph": graph,
            "split": split,
            "configs": configs,
            "baseline_targets": own_targets,
            "reference": reference,
            "target": target,
            "groups": groups,
        }

    def overrides(self, model: str) -> list[str]:
        """The recipe overrides of our ``model`` run (the split file aside)."""
        args = self.args
        extra = (args.sage if model == "sage" else args.gcn).split()
        return ["task=link", f"model={model}", f"model.module.hits_k={args.hits_k}", *extra]

    def ours_link(self, model: str, graph: str, split: dict, seed: int, overrides: list[str]) -> dict:
        measure = partial(run_ours, model, overrides, graph, split, seed, self.args)
        return self.run(
            model, graph, seed, {"overrides": " ".join(overrides), "split": split["fingerprint"]}, measure
        )


def mean_of(runs: list[dict], part: str, key: str) -> str:
    values = [r[part][key] for r in runs if key in r[part]]
    return f"{statistics.mean(values):.4f}" if values else "-"


def table(results: list[dict], k: int) -> list[str]:
    """One row per (graph, system): time to the target, epoch time, and every score."""
    rows = [
        f"| graph | system | configuration | target (val Hits@{k}) | time to target s, median (per seed) "
        "| speed-up vs faster baseline | epoch s | epochs to target | best val Hits | val MRR | val AUC "
        "| test Hits | test MRR | test AUC | peak RSS MB | reached |",
        "|" + "---|" * 16,
    ]
    for result in results:
        target = result["target"]
        ref = result["reference"]
        ref_time = tta.median_time(result["groups"][ref], target) if ref else None
        for system, runs in result["groups"].items():
            done = [r for r in runs if "error" not in r]
            config = describe(result["configs"][system])
            if not done:
                rows.append(
                    f"| {result['graph']} | {system} | {config} | failed: {runs[0]['error']} |" + " |" * 12
                )
                continue
            times = [tta.time_to(r, target) for r in done] if not math.isnan(target) else [None] * len(done)
            reached = [t for t in times if t is not None]
            median = tta.median_time(runs, target) if not math.isnan(target) else None
            per_seed = ", ".join("-" if t is None else f"{t[0]:.1f}" for t in times)
            speedup = f"{ref_time / median:.2f}x" if median and ref_time else "-"
            rows.append(
                f"| {result['graph']} | {system} | {config} | {target:.4f} | "
                f"{'-' if median is None else f'{median:.1f}'} ({per_seed}) | {speedup} | "
                f"{statistics.median(r['epoch_s'] for r in done):.3f} | "
                f"{f'{statistics.median(t[1] for t in reached):g}' if reached else '-'} | "
                f"{statistics.mean(r['val'] for r in done):.4f} | {mean_of(done, 'val_scores', 'mrr')} | "
                f"{mean_of(done, 'val_scores', 'auc')} | {mean_of(done, 'test_scores', 'hits')} | "
                f"{mean_of(done, 'test_scores', 'mrr')} | {mean_of(done, 'test_scores', 'auc')} | "
                f"{statistics.median(r['peak_rss_mb'] for r in done):.0f} | {len(reached)}/{len(runs)} |"
            )
    return rows


def reference_table(results: list[dict]) -> list[str]:
    """Each of our models against the GAE reference of its encoder: test Hits@K and MRR, means
    over seeds, and whether ours is at least as high on both."""
    rows = [
        "| graph | model | GAE test Hits | ours test Hits | GAE test MRR | ours test MRR | ours >= GAE |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for model in OURS:
            ours = [r for r in result["groups"].get(model, []) if "error" not in r]
            gae = [r for r in result["groups"].get(f"gae-{model}", []) if "error" not in r]
            if not ours or not gae:
                continue
            figures = [mean_of(runs, "test_scores", key) for key in ("hits", "mrr") for runs in (gae, ours)]
            pairs = [(figures[0], figures[1]), (figures[2], figures[3])]
            at_least = all(o != "-" and g != "-" and float(o) >= float(g) for g, o in pairs)
            rows.append(
                f"| {result['graph']} | {model} | {' | '.join(figures)} | {'yes' if at_least else 'no'} |"
            )
    return rows


def describe(config: dict | str) -> str:
    if isinstance(config, str):
        return f"`{config}`"
    batch = f", batch {config['batch_size']}" if "batch_size" in config else ""
    width = f", hidden {config['hidden']}, dropout {config['dropout']:g}" if "hidden" in config else ""
    return f"{config['model']}, lr {config['lr']:g}{batch}{width}"


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py link", description=__doc__)
    parser.add_argument("--datasets", default="cora,citeseer,amazon_photo,coauthor_cs")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"of: {', '.join(SYSTEMS)}")
    parser.add_argument("--budget-s", type=float, default=60.0, help="each run's wall-time budget")
    parser.add_argument("--max-epochs", type=int, default=200, help="the baselines' epoch budget")
    parser.add_argument(
        "--gae-epochs", type=int, default=1000, help="the GAE's epoch budget (full-batch steps)"
    )
    parser.add_argument(
        "--gae-budget-s",
        type=float,
        default=120.0,
        help="each GAE run's wall-time budget (a reference, not timed)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.01,
        help="target: the faster baseline's best less this (Hits@K moves in steps of one positive: 0.004 on cora)",
    )
    parser.add_argument("--lrs", default="0.003,0.01,0.03", help="each baseline's learning rates, swept")
    parser.add_argument("--gae-lrs", default="0.003,0.01,0.03", help="the GAE's learning rates, swept")
    parser.add_argument("--batch-size", type=int, default=512, help="the baselines' positive edges per batch")
    parser.add_argument("--baseline-model", choices=OURS, default="sage", help="the baselines' encoder")
    parser.add_argument("--hidden", type=int, default=128, help="the baselines' and GAE's width")
    parser.add_argument("--hits-k", type=int, default=50)
    parser.add_argument("--sage", default="", help="recipe overrides of our model=sage run, space separated")
    parser.add_argument("--gcn", default="", help="recipe overrides of our model=gcn run, space separated")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--val", type=float, default=0.05)
    parser.add_argument("--test", type=float, default=0.10)
    parser.add_argument(
        "--neg-per-source", type=int, default=100, help="each held-out positive's negatives (MRR)"
    )
    parser.add_argument("--dgl-python", default=str(REPO / ".venv-dgl" / "bin" / "python"))
    default_pyg = REPO / ".venv-pyg" / "bin" / "python"
    parser.add_argument(
        "--pyg-python",
        default=str(default_pyg) if default_pyg.exists() else "",
        help="the PyG environment's python (.ci/pyg_env.sh); empty: PyG is not run",
    )
    parser.add_argument(
        "--jsonl", type=Path, help="append every finished run here; runs already there are kept"
    )
    parser.add_argument("--out", type=Path, help="folder for link.md, link.json, runs.jsonl and the splits")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.lrs, args.gae_lrs = floats(args.lrs), floats(args.gae_lrs)
    args.systems = args.systems.split(",")
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if args.out is not None and args.jsonl is None:
        args.jsonl = args.out / "runs.jsonl"
    for folder in (args.out, args.jsonl and args.jsonl.parent):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqgnn-link-splits-") as tmp:
        args.split_dir = args.out / "splits" if args.out is not None else Path(tmp)
        bench = LinkBench(args)
        results = [bench.graph(graph) for graph in args.datasets.split(",")]
    notes = [
        f"- split: seed {args.split_seed}, {1 - args.val - args.test:.0%}/{args.val:.0%}/{args.test:.0%}, fixed "
        f"negatives, {args.neg_per_source} per positive for MRR; "
        + "; ".join(
            f"{r['graph']}: {r['split']['train']}/{r['split']['val']}/{r['split']['test']} edges"
            for r in results
        ),
        f"- target: the faster baseline's mean best val Hits@{args.hits_k} less {args.margin}; "
        + "; ".join(f"{r['graph']}: {r['reference'] or 'no baseline'}" for r in results),
    ]
    if not args.pyg_python and "pyg" in args.systems:
        notes.append("- PyG: not run (no --pyg-python; build it with .ci/pyg_env.sh)")
    text = write_report(
        f"Link prediction: time to the baselines' Hits@{args.hits_k}, and the GAE reference",
        machine_header("link", argv) + tta.environment_versions(args) + notes,
        [
            *table(results, args.hits_k),
            "",
            "Our models against the full-batch GAE reference:",
            "",
            *reference_table(results),
        ],
        None,
    )
    if args.out is not None:
        (args.out / "link.md").write_text(text)
        (args.out / "link.json").write_text(json.dumps(results, indent=1))
        plots = importlib.util.find_spec("matplotlib") is not None  # not in the DGL environment
        for result in results:
            if plots and not math.isnan(result["target"]):
                label = f"{result['reference']}'s best - margin"
                tta.plot(result, args.out / f"{result['graph']}.png", target_label=label)
    failed = [r for result in results for runs in result["groups"].values() for r in runs if "error" in r]
    return 1 if failed else 0
