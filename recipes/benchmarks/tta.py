"""Time to accuracy: the wall time until a model is as good as the one DGL's loop would give.

    python recipes/bench.py tta --datasets cora,dblp --seeds 0,1,2 --out docs/benchmarks/tta

Per graph, one model (``--model``, GraphSAGE by default), every run a fresh process, one at a time
(a timing: run it on a quiet machine):

1. **DGL, tuned**: DGL's own loop (``bench.py dgl_baseline``: ``DataLoader`` + ``NeighborSampler`` +
   ``dgl.nn``, fan-out 5,5, hidden 256, Adam) with validation after every epoch, for a budget of
   ``--budget-s`` seconds or ``--max-epochs`` epochs. Seed 0 sweeps the learning rate
   (``--dgl-lrs``) at the first batch size of ``--dgl-batches``, then the other batch sizes at the
   best rate; the configuration kept is the one reaching the sweep's best validation metric less
   ``--margin`` soonest. It then runs the other seeds. **Target**: the mean over seeds of its best
   validation metric, less ``--margin``.
2. **PyG** (when ``--pyg-python`` runs): PyG's ``NeighborLoader`` loop (``bench.py pyg_baseline``)
   with DGL's tuned configuration.
3. **Ours**: each ``--candidates`` entry is recipe overrides (``defaults``: none beyond the data and
   ``model=<--model>``; ``best``: ``--best``, which may name another model), run with the
   recipe's own validation schedule and early stopping, bounded by the same budget
   (``trainer.max_time``). ``tuned``: ``--best`` swept per graph as DGL is, on the first seed over
   ``--tune-lrs`` at the first of ``--tune-batches``, then the other batch sizes at the rate that
   reached the target soonest; kept: the configuration that reached DGL's target soonest (DGL
   keeps the one reaching its own sweep's best less the margin soonest: about the same target).

A run's **time to target** is the wall time since training started (training and validation both
counted; data loading and process start not) at its first validation at or above the target; the
speed-up is the ratio of the medians over seeds, DGL's over each system's. Both sides validate with
exact full-neighbourhood inference; DGL and PyG after every epoch, the recipe on its own schedule
(every ``val_every_batches``, and with ``val_share`` only while validation stays within that
share of the work, or with ``val_budget=time`` of the wall time). Peak RSS is the training process's (``VmHWM``, data loading
included; sampler worker processes not). ``--out DIR`` writes ``tta.md``, every run with its curve
in ``tta.json`` and a plot per graph (validation metric against wall time, the median seed of
each system).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil

from benchmarks._recipe import result_fields
from benchmarks._report import machine_header, write_report

RECIPES = Path(__file__).resolve().parents[1]
REPO = RECIPES.parent
CANDIDATES = {"defaults": ""}  # "best" comes from --best
# DGL neither writes ~/.dgl/config.json nor prints its backend notice; OGB does not check its version online
quiet_env = {**os.environ, "DGLBACKEND": "pytorch", "OUTDATED_IGNORE": "1"}


READING_SHARE = 0.02  # of the run's CPU time, at most, spent reading its memory


def run_process(
    cmd: list[str],
    timeout: float,
    peak: Callable[[int], float] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str, float]:
    """Run ``cmd``; ``(exit status, stdout, stderr, peak RSS in MB)``. The peak is ``peak(pid)``'s
    largest reading, every 0.1 s while it runs, or less often when a reading costs more than
    ``READING_SHARE`` of that (the PSS of processes that map a large file takes a walk of their
    page tables: a third of a core at 0.1 s beside a 46 GB mapping); by default the process's own
    ``VmHWM`` since its exec (not its children's; ``tree_pss_mb`` sums a process tree):
    ``ru_maxrss`` would also count the launching process's pages, which a vfork-ed child holds
    until it execs. Killed after ``timeout`` seconds; ``env``: its environment (``quiet_env``)."""
    peak = peak or high_water_mb
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=quiet_env if env is None else env)
        deadline = time.monotonic() + timeout
        peak_mb = 0.0
        while proc.poll() is None:
            start = time.perf_counter()
            peak_mb = max(peak_mb, peak(proc.pid))
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                break
            time.sleep(max(0.1, (time.perf_counter() - start) / READING_SHARE))
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), peak_mb


def high_water_mb(pid: int) -> float:
    """``VmHWM`` of a running process in MB; 0 once it has exited (or where /proc is missing)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else 0.0


def tree_pss_mb(pid: int) -> float:
    """The proportional set size (``Pss`` of ``/proc/<pid>/smaps_rollup``) of a running process
    and its descendants (sampler workers), summed, in MB: the memory they occupy together. Their
    RSS would count each page they share (forked copy-on-write pages, shared memory, the page
    cache's mapped pages) once per process that maps it."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0.0
    total_kb = 0
    for proc in procs:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{proc.pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


def failure(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["(no output)"])[-1]


def run_baseline(system: str, python: str, graph: str, seed: int, config: dict, args) -> dict:
    """One fit of DGL's or PyG's loop: its curve ``[wall_s, train_s, val, epoch]`` per validation."""
    run: dict = dict(system=system, graph=graph, seed=seed, config=config)
    with tempfile.TemporaryDirectory(prefix="mqgnn-tta-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [
            python,
            str(RECIPES / "bench.py"),
            f"{system}_baseline",
            f"--data={graph}",
            f"--model={args.model}",
            f"--lr={config['lr']}",
            f"--batch-size={config['batch_size']}",
            f"--num-workers={config.get('num_workers', 0)}",
            f"--epochs={args.max_epochs}",
            f"--max-time-s={args.budget_s}",
            f"--seed={seed}",
            f"--json={out}",
        ]
        rc, _, stderr, rss = run_process(cmd, args.budget_s * 3 + 600)
        if rc != 0 or not out.exists():
            run["error"] = failure(stderr)
            return run
        result = json.loads(out.read_text())
    run.update(
        curve=[
            [w, t, v, e + 1]
            for e, (w, t, v) in enumerate(zip(result["wall_s"], result["train_s"], result["val_scores"]))
        ],
        val=result["best_val"],
        test=result["test_metric"],
        epochs=result["epochs"],
        best_epoch=result["best_epoch"] + 1,
        peak_rss_mb=rss,
    )
    return run


def recipe_curve(run_dir: Path) -> list[list[float]]:
    """``[wall_s, train_s, val, epoch]`` at every validation of a recipe run (its metrics log; the
    epoch counted from 1 is the one the validation ran in)."""
    (log,) = run_dir.glob("lightning_logs/version_*/metrics.csv")
    val: dict[str, tuple[float, float]] = {}
    times: dict[str, tuple[float, float]] = {}
    with log.open() as f:
        for row in csv.DictReader(f):
            if row.get("val/metric"):
                val[row["step"]] = (float(row["val/metric"]), float(row["epoch"]) + 1)
            if row.get("time/wall_s"):
                times[row["step"]] = (float(row["time/wall_s"]), float(row["time/train_s"]))
    return sorted([*times[step], *val[step]] for step in val if step in times)


def max_time(seconds: float) -> str:
    """``Trainer(max_time=)`` as ``DD:HH:MM:SS`` (a dict from the command line reaches the Trainer
    as an OmegaConf mapping, which it does not take)."""
    total = math.ceil(seconds)
    return f"{total // 86400:02d}:{total // 3600 % 24:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def run_ours(candidate: str, overrides: list[str], graph: str, seed: int, args) -> dict:
    """One recipe fit with ``overrides``, bounded by the budget."""
    run: dict = dict(system=candidate, graph=graph, seed=seed, config={"overrides": " ".join(overrides)})
    with tempfile.TemporaryDirectory(prefix="mqgnn-tta-") as run_dir:
        cmd = [
            sys.executable,
            str(RECIPES / "train.py"),
            f"data={graph}",
            *([] if any(o.startswith("model=") for o in overrides) else [f"model={args.model}"]),
            *overrides,
            f"seed={seed}",
            f"+trainer.max_time='{max_time(args.budget_s)}'",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ]
        rc, stdout, stderr, rss = run_process(cmd, args.budget_s * 3 + 600)
        fields = result_fields(stdout)
        if rc != 0 or fields is None:
            run["error"] = failure(stderr)
            return run
        curve = recipe_curve(Path(run_dir))
    best = max(range(len(curve)), key=lambda i: curve[i][2]) if curve else None
    run.update(
        curve=curve,
        val=float(fields["val"]),
        test=float(fields["test"]),
        epochs=int(fields["epochs"]),
        best_epoch=curve[best][3] if best is not None else None,
        peak_rss_mb=rss,
    )
    return run


def time_to(run: dict, target: float) -> tuple[float, float] | None:
    """``(wall seconds, epoch)`` at the run's first validation at or above ``target``; None if never."""
    return next(((w, e) for w, _, v, e in run.get("curve", []) if v >= target), None)


def median_run(runs: list[dict], target: float) -> dict | None:
    """The run whose time to target is the median (the slower middle one of an even count; runs
    that never get there count as slowest)."""
    done = [r for r in runs if "error" not in r]
    if not done:
        return None
    ordered = sorted(done, key=lambda r: (time_to(r, target) or (math.inf, 0))[0])
    return ordered[len(ordered) // 2]


def median_time(runs: list[dict], target: float) -> float | None:
    """Median time to target over the runs; None unless more than half of them get there."""
    times = [t[0] for r in runs if "error" not in r and (t := time_to(r, target)) is not None]
    return statistics.median(times) if len(times) * 2 > len(runs) else None


class Bench:
    """The runs of one invocation: resumed from ``--jsonl`` (all but failed ones), appended to it as
    they finish."""

    def __init__(self, args) -> None:
        self.args = args
        self.runs: list[dict] = []
        if args.jsonl is not None and args.jsonl.exists():
            self.runs = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]

    def find(self, system: str, graph: str, seed: int, config: dict) -> dict | None:
        return next(
            (
                r
                for r in self.runs
                if (r["system"], r["graph"], r["seed"], r["config"]) == (system, graph, seed, config)
                and "error" not in r  # a failed run is measured again
            ),
            None,
        )

    def run(self, system: str, graph: str, seed: int, config: dict, measure: Callable[[], dict]) -> dict:
        """The run of (system, graph, seed, config), measured now unless the log already has it."""
        found = self.find(system, graph, seed, config)
        if found is not None:
            return found
        run = measure()
        self.runs.append(run)
        status = run.get("error") or f"best val {run['val']:.4f} test {run['test']:.4f}"
        print(f"{graph} {system} {config} seed={seed}: {status}", flush=True)
        if self.args.jsonl is not None:
            with self.args.jsonl.open("a") as f:
                f.write(json.dumps(run) + "\n")
        return run

    def dgl(self, graph: str, seed: int, config: dict) -> dict:
        args = self.args
        measure = partial(run_baseline, "dgl", args.dgl_python, graph, seed, config, args)
        return self.run("dgl", graph, seed, config, measure)

    def tune_dgl(self, graph: str) -> dict:
        """DGL's configuration for ``graph``: the sweep on the first seed (see the module's doc)."""
        args = self.args
        seed = args.seeds[0]
        batches = args.dgl_batches
        sweep = [self.dgl(graph, seed, {"lr": lr, "batch_size": batches[0]}) for lr in args.dgl_lrs]
        if all("error" in r for r in sweep):
            raise RuntimeError(f"DGL's loop failed on {graph} at every learning rate: {sweep[0]['error']}")
        best_lr = max((r for r in sweep if "error" not in r), key=lambda r: r["val"])["config"]["lr"]
        sweep += [self.dgl(graph, seed, {"lr": best_lr, "batch_size": b}) for b in batches[1:]]
        done = [r for r in sweep if "error" not in r]
        target = max(r["val"] for r in done) - args.margin
        chosen = min(done, key=lambda r: (time_to(r, target) or (math.inf, 0))[0])
        return chosen["config"]

    def graph(self, graph: str) -> dict:
        """Every run of one graph, measured or read back, grouped by system."""
        args = self.args
        config = self.tune_dgl(graph)
        groups: dict[str, list[dict]] = {"dgl": [self.dgl(graph, s, config) for s in args.seeds]}
        if args.pyg_python:
            groups["pyg"] = [
                self.run(
                    "pyg",
                    graph,
                    s,
                    config,
                    partial(run_baseline, "pyg", args.pyg_python, graph, s, config, args),
                )
                for s in args.seeds
            ]
        base = [r for r in groups["dgl"] if "error" not in r]
        target = statistics.mean(r["val"] for r in base) - args.margin if base else math.nan
        for name in args.candidates:
            if name == "tuned":
                overrides = self.tune_ours(graph, target)
            else:
                overrides = (args.best if name == "best" else CANDIDATES[name]).split()
            groups[name] = [self.ours(name, graph, s, overrides) for s in args.seeds]
        return {"graph": graph, "dgl_config": config, "target": target, "groups": groups}

    def ours(self, name: str, graph: str, seed: int, overrides: list[str]) -> dict:
        measure = partial(run_ours, name, overrides, graph, seed, self.args)
        return self.run(name, graph, seed, {"overrides": " ".join(overrides)}, measure)

    def tune_ours(self, graph: str, target: float) -> list[str]:
        """Our configuration for ``graph``, swept as DGL's is: ``--best`` with each of
        ``--tune-lrs`` at the first of ``--tune-batches`` on the first seed, then the other batch
        sizes at the learning rate that got to ``target`` soonest (the highest validation if none
        did); kept: the configuration that gets to ``target`` soonest."""
        args = self.args
        seed = args.seeds[0]

        def sweep_run(lr: float, batch: int) -> tuple[list[str], dict]:
            overrides = [*args.best.split(), f"model.module.lr={lr:g}", f"loader.batch_size={batch}"]
            return overrides, self.ours("tuned", graph, seed, overrides)

        def soonest(entry: tuple[list[str], dict]) -> tuple[float, float]:
            run = entry[1]
            if "error" in run:
                return (math.inf, math.inf)
            reached = time_to(run, target)
            return (reached[0], 0.0) if reached else (math.inf, -run["val"])

        sweep = [sweep_run(lr, args.tune_batches[0]) for lr in args.tune_lrs]
        best_lr = args.tune_lrs[sweep.index(min(sweep, key=soonest))]
        sweep += [sweep_run(best_lr, b) for b in args.tune_batches[1:]]
        return min(sweep, key=soonest)[0]


def table(results: list[dict]) -> list[str]:
    """One row per (graph, system): its median time to DGL's target and the speed-up against DGL."""
    rows = [
        "| graph | system | configuration | target (val) | time to target s, median (per seed) | speed-up vs DGL "
        "| epochs to target | best val | test at best val | peak RSS MB | reached |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        target = result["target"]
        dgl_time = median_time(result["groups"]["dgl"], target)
        for system, runs in result["groups"].items():
            done = [r for r in runs if "error" not in r]
            if not done:
                rows.append(f"| {result['graph']} | {system} | failed: {runs[0]['error']} |" + " |" * 8)
                continue
            times = [time_to(r, target) for r in done]
            reached = [t for t in times if t is not None]
            median = median_time(runs, target)
            per_seed = ", ".join("-" if t is None else f"{t[0]:.1f}" for t in times)
            speedup = f"{dgl_time / median:.2f}x" if median and dgl_time else "-"
            config = result["dgl_config"] if system in ("dgl", "pyg") else runs[0]["config"]["overrides"]
            rows.append(
                f"| {result['graph']} | {system} | {describe(config)} | {target:.4f} | "
                f"{'-' if median is None else f'{median:.1f}'} ({per_seed}) | {speedup} | "
                f"{statistics.median(t[1] for t in reached) if reached else '-'} | "
                f"{statistics.mean(r['val'] for r in done):.4f} | {statistics.mean(r['test'] for r in done):.4f} "
                f"| {statistics.median(r['peak_rss_mb'] for r in done):.0f} | {len(reached)}/{len(runs)} |"
            )
    return rows


def describe(config: dict | str) -> str:
    if isinstance(config, str):
        return f"`{config}`" if config else "recipe defaults"
    return f"lr {config['lr']:g}, batch {config['batch_size']}, workers {config.get('num_workers', 0)}"


def plot(result: dict, path: Path, target_label: str = "DGL's best - margin") -> None:
    """Validation metric against wall time, the median seed of each system, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    target = result["target"]
    for system, runs in result["groups"].items():
        run = median_run(runs, target)
        if run is None or not run["curve"]:
            continue
        walls, vals = [c[0] for c in run["curve"]], [c[2] for c in run["curve"]]
        ax.plot(walls, vals, marker=".", ms=3, lw=1, label=f"{system} (seed {run['seed']})")
    ax.axhline(target, color="grey", ls="--", lw=0.8, label=target_label)
    ax.set_xscale("log")
    ax.set_xlabel("wall time since training start, s (validation included)")
    ax.set_ylabel("validation metric")
    ax.set_title(result["graph"], fontsize=10, loc="left")
    low = min(
        (c[2] for runs in result["groups"].values() for r in runs for c in r.get("curve", [])), default=0
    )
    ax.set_ylim(max(low, target - 0.15), None)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def environment_versions(args) -> list[str]:
    """The baselines' library versions, read in their own environments."""
    lines = []
    for name, python, module in (
        ("DGL", args.dgl_python, "dgl"),
        ("PyG", args.pyg_python, "torch_geometric"),
    ):
        if not python:
            continue
        code = f"import torch, {module}; print({module}.__version__, torch.__version__)"
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=quiet_env)
        found = proc.stdout.split() if proc.returncode == 0 else ["not", "found"]
        lines.append(f"- {name} environment: {module} {found[0]}, torch {found[-1]} ({python})")
    return lines


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py tta", description=__doc__)
    parser.add_argument("--datasets", default="cora,citeseer,amazon_photo,dblp")
    parser.add_argument("--model", choices=("sage", "gcn"), default="sage")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--candidates", default="defaults,best", help="of: defaults, best, tuned")
    parser.add_argument(
        "--best", default="", help="our best configuration: recipe overrides, space separated"
    )
    parser.add_argument("--budget-s", type=float, default=120.0, help="each run's wall-time budget")
    parser.add_argument("--max-epochs", type=int, default=200, help="DGL's and PyG's epoch budget")
    parser.add_argument("--margin", type=float, default=0.005, help="target: DGL's best val less this")
    parser.add_argument("--dgl-lrs", default="0.003,0.01,0.03")
    parser.add_argument("--dgl-batches", default="1024,512")
    parser.add_argument("--tune-lrs", default="0.003,0.01,0.03", help="the tuned candidate's rates")
    parser.add_argument("--tune-batches", default="512,1024", help="the tuned candidate's batch sizes")
    parser.add_argument("--dgl-python", default=str(REPO / ".venv-dgl" / "bin" / "python"))
    parser.add_argument("--pyg-python", default="", help="the PyG environment's python (.ci/pyg_env.sh)")
    parser.add_argument(
        "--jsonl", type=Path, help="append every finished run here; runs already there are kept"
    )
    parser.add_argument("--out", type=Path, help="folder for tta.md, tta.json and a plot per graph")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.dgl_lrs = floats(args.dgl_lrs)
    args.dgl_batches = [int(b) for b in args.dgl_batches.split(",")]
    args.tune_lrs = floats(args.tune_lrs)
    args.tune_batches = [int(b) for b in args.tune_batches.split(",")]
    args.candidates = args.candidates.split(",")
    unknown = sorted(set(args.candidates) - {*CANDIDATES, "best", "tuned"})
    if unknown:
        parser.error(f"unknown candidates {unknown}; known: defaults, best, tuned")
    if {"best", "tuned"} & set(args.candidates) and not args.best:
        parser.error("--candidates has best or tuned: give its recipe overrides with --best")
    if args.out is not None and args.jsonl is None:
        args.jsonl = args.out / "runs.jsonl"
    for folder in (args.out, args.jsonl and args.jsonl.parent):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    bench = Bench(args)
    results = [bench.graph(graph) for graph in args.datasets.split(",")]
    text = write_report(
        f"Time to DGL's accuracy ({args.model})",
        machine_header("tta", argv) + environment_versions(args),
        table(results),
        None,
    )
    if args.out is not None:
        (args.out / "tta.md").write_text(text)
        (args.out / "tta.json").write_text(json.dumps(results, indent=1))
        for result in results:
            plot(result, args.out / f"{result['graph']}.png")
    failed = [r for result in results for runs in result["groups"].values() for r in runs if "error" in r]
    return 1 if failed else 0
