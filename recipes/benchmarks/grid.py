"""Paper-style comparison grid: model x dataset x configuration, with DGL and sequential baselines.

    python recipes/bench.py grid --models sage,gcn --datasets cora,amazon_computers \\
        --configs sequential,pipeline,dgl --seeds 0,1,2 --epochs 5 --out bench_out/grid

Every configuration trains the same graph, split, model, fan-out, batch size, hidden size and
number of epochs (early stopping off, one validation per epoch, test at the best epoch):
- ``sequential``: this project's loop, sample -> gather -> compute in one process (no overlap);
- ``pipeline``: the MQ multi-queue pipeline (``loader=pipeline``);
- ``pipeline_gns``: the pipeline with the GNS feature cache;
- ``dgl``: DGL's DataLoader + NeighborSampler + dgl.nn (run with the DGL environment's python);
- ``ddp`` / ``mqgnn``: 2 CPU ranks, plain DDP vs MQGNNStrategy, both over the pipeline.
Writes ``grid.md`` (table with speed-ups), ``grid.json`` (all runs), ``speedup.png`` (speed-up per
epoch against DGL and against the sequential loop) and ``utilisation.png`` (cores busy over time,
one panel per configuration, as the paper's Fig. 3) to --out. ``--replot`` redraws the two PNGs
from the ``grid.json`` already in --out and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks._recipe import (
    epoch_seconds,
    fixed_epochs_overrides,
    network_overrides,
    recipe_config,
    result_fields,
)
from benchmarks._report import machine_header, write_report

RECIPES = Path(__file__).resolve().parents[1]
REPO = RECIPES.parent
TWO_RANKS = ["trainer.accelerator=cpu", "trainer.devices=2", "loader=pipeline"]
CONFIG_OVERRIDES = {
    "sequential": ["loader=sequential"],
    "sequential_bf16": ["loader=sequential", "trainer.precision=bf16-mixed"],
    "pipeline": ["loader=pipeline"],
    "pipeline_gns": ["loader=pipeline"],  # with model=<model>_gns
    "ddp": [*TWO_RANKS, "strategy=ddp"],
    "mqgnn": [*TWO_RANKS, "strategy=mqgnn"],
}
DGL_CONFIGS = ("dgl", "dgl_bf16")  # DGL's loop, and the same with its forward under bf16 autocast


def dgl_of(config: str) -> str:
    """The DGL run a configuration is compared with: the one in the same precision."""
    return "dgl_bf16" if config.endswith("_bf16") else "dgl"


class GPUProbe:
    """NVML utilisation of GPU 0 (percent of the last sample period with a kernel running), read
    without creating a CUDA context in this process; ``read()`` is None where there is no GPU."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:  # no pynvml, no driver or no GPU: CPU-only timeline
            self._handle = None

    def read(self) -> float | None:
        if self._handle is None:
            return None
        return self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0


def monitored(
    cmd: list[str], timeout: float, interval: float = 0.25
) -> tuple[subprocess.CompletedProcess, list]:
    """Run ``cmd``, sampling the CPU use of it and its children (in cores) and the GPU busy
    fraction (None without a GPU) every ``interval`` s: timeline of (seconds, cores, gpu)."""
    gpu = GPUProbe()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = psutil.Popen(cmd, stdout=out, stderr=err, text=True, cwd=REPO)
        timeline, start, seen = [], time.perf_counter(), {}
        while proc.poll() is None:
            if time.perf_counter() - start > timeout:
                for p in [*proc.children(recursive=True), proc]:
                    p.kill()
                raise TimeoutError(f"{' '.join(cmd)} ran past {timeout} s")
            busy = 0.0
            try:
                for p in [proc, *proc.children(recursive=True)]:
                    if p.pid not in seen:
                        seen[p.pid] = p
                        p.cpu_percent(None)  # first call primes the counter
                    else:
                        busy += seen[p.pid].cpu_percent(None) / 100.0
            except psutil.Error:
                pass
            timeline.append((round(time.perf_counter() - start, 2), round(busy, 3), gpu.read()))
            time.sleep(interval)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read()), timeline


def run_ours(config: str, model: str, dataset: str, seed: int, args) -> dict:
    if config == "pipeline_gns":  # with model=<model>'s network: every configuration trains one model
        chosen = [f"model={model}_gns", *network_overrides(model, extra=args.extra.split())]
    else:
        chosen = [f"model={model}"]
    overrides = [
        *chosen,
        f"data={dataset}",
        f"seed={seed}",
        *CONFIG_OVERRIDES[config],
        f"loader.batch_size={args.batch_size}",
        *fixed_epochs_overrides(args.epochs),
        *args.extra.split(),
    ]
    cmd = [sys.executable, str(RECIPES / "train.py"), *overrides]
    proc, timeline = monitored(cmd, args.timeout)
    fields = result_fields(proc.stdout)
    if proc.returncode != 0 or fields is None:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{config} {model} {dataset} seed {seed} failed:\n{tail}")
    return {
        "batch_time_ms": float(fields["batch_time_ms"]),
        "batch_time_std_ms": float(fields["batch_time_std_ms"]),
        "train_time_s": float(fields["train_time_s"]),
        "epoch_time_s": epoch_seconds(fields),
        "metric": float(fields["test"]),
        "gpu_busy": float(fields["gpu_busy"]) if "gpu_busy" in fields else None,
        "producer": fields.get("producer"),  # pipelined fits: who produced the batches
        "timeline": timeline,
    }


def recipe_module(model: str, extra: str) -> tuple[float, int]:
    """The learning rate and hidden width our fits of ``model`` train at, which DGL's loop takes
    too: the grid compares their epoch times and test metrics after the same epochs."""
    module = recipe_config([f"model={model}", *extra.split()]).model.module
    hidden = module.hidden if "hidden" in module else module.layers.hidden  # PyG's stacks nest it
    return float(module.lr), int(hidden)


def run_dgl(model: str, dataset: str, seed: int, args, bf16: bool = False) -> dict:
    lr, hidden = recipe_module(model, args.extra)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dgl.json"
        cmd = [
            args.dgl_python,
            str(RECIPES / "bench.py"),
            "dgl_baseline",
            f"--data={dataset}",
            f"--model={model.split('_')[0]}",  # a variant's DGL baseline is its base model
            f"--epochs={args.epochs}",
            f"--batch-size={args.batch_size}",
            f"--lr={lr}",
            f"--hidden={hidden}",
            f"--seed={seed}",
            f"--json={out}",
            *(["--bf16"] if bf16 else []),
        ]
        proc, timeline = monitored(cmd, args.timeout)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"dgl {model} {dataset} seed {seed} failed:\n{tail}")
        result = json.loads(out.read_text())
    times = result["batch_times"]
    kept = times[20:-20] if len(times) > 40 else times
    return {
        "batch_time_ms": 1e3 * statistics.mean(kept),
        "batch_time_std_ms": 1e3 * (statistics.stdev(kept) if len(kept) > 1 else 0.0),
        "train_time_s": result["train_time"],
        "epoch_time_s": result["train_time"] / len(result["epoch_times"]),
        "metric": result["test_metric"],
        "gpu_busy": None,
        "timeline": timeline,
    }


def pm(values: list[float], digits: int) -> str:
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def busy_cell(runs: list[dict]) -> str:
    busy = [r["gpu_busy"] for r in runs if r.get("gpu_busy") is not None]
    return f"{100 * statistics.mean(busy):.0f}%" if busy else "-"


def run_order(configs: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """(config, seed) pairs, a seed's configurations back to back so that each ratio compares runs
    made minutes apart on a machine whose speed drifts; the order of the configurations rotates
    from one seed to the next, so that none always runs first."""
    order = []
    for i, seed in enumerate(seeds):
        shift = i % len(configs)
        order += [(config, seed) for config in configs[shift:] + configs[:shift]]
    return order


def per_seed_speedups(rs: list[dict], base: list[dict]) -> str:
    """Each seed's epoch time of ``base`` over that of ``rs`` (the runs of one configuration)."""
    ref = {r["seed"]: r["epoch_time_s"] for r in base}
    ratios = [f"{ref[r['seed']] / r['epoch_time_s']:.2f}" for r in rs if r["seed"] in ref]
    return ", ".join(ratios) or "-"


def summarise(runs: list[dict]) -> list[str]:
    """One table row per (dataset, model, config): means over seeds and speed-ups per epoch, of
    the means and seed by seed."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["dataset"], run["model"], run["config"]), []).append(run)
    epoch = {key: statistics.mean(r["epoch_time_s"] for r in rs) for key, rs in groups.items()}
    on_gpu = any(r.get("gpu_busy") is not None for r in runs)
    rows = [
        "| dataset | model | configuration | batch time ms (mean ± std) | train time s | epoch time s | "
        "test metric (mean ± std) | speed-up vs sequential (per seed) | speed-up vs DGL (per seed) |"
        + (" GPU busy (training) |" if on_gpu else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if on_gpu else ""),
    ]
    for (dataset, model, config), rs in groups.items():
        speedups = []
        for base in ("sequential", dgl_of(config)):
            ref = epoch.get((dataset, model, base))
            speedups.append(
                f"{ref / epoch[(dataset, model, config)]:.2f}x "
                f"({per_seed_speedups(rs, groups[(dataset, model, base)])})"
                if ref
                else "-"
            )
        batch = statistics.mean(r["batch_time_ms"] for r in rs)
        batch_std = statistics.mean(r["batch_time_std_ms"] for r in rs)
        rows.append(
            f"| {dataset} | {model} | {config} | {batch:.2f} ± {batch_std:.2f} | "
            f"{pm([r['train_time_s'] for r in rs], 2)} | {epoch[(dataset, model, config)]:.3f} | "
            f"{pm([r['metric'] for r in rs], 4)} | {speedups[0]} | {speedups[1]} |"
            + (f" {busy_cell(rs)} |" if on_gpu else "")
        )
    return rows


def plot(runs: list[dict], out: Path) -> None:
    """``speedup.png``: epoch-time speed-up of each configuration against DGL and against the
    sequential loop, one bar group per (dataset, model); ``utilisation.png``: CPU (and GPU) busy
    over time, one panel per configuration, for the first (dataset, model, seed) of the grid.
    Reads only ``runs`` (``grid.json``), so ``--replot`` redraws a saved grid on any machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[float]] = {}
    for run in runs:
        groups.setdefault((run["dataset"], run["model"], run["config"]), []).append(run["epoch_time_s"])
    epoch = {k: statistics.mean(v) for k, v in groups.items()}
    pairs = list(dict.fromkeys((d, m) for d, m, _ in epoch))
    configs = list(dict.fromkeys(c for _, _, c in epoch))
    ours = [c for c in configs if c not in DGL_CONFIGS]
    panels = [
        ("dgl", [c for c in ours if dgl_of(c) in configs]),  # each against DGL in its precision
        ("sequential", [c for c in ours if c != "sequential"] if "sequential" in configs else []),
    ]
    panels = [(base, shown) for base, shown in panels if shown]
    if panels:
        fig, axes = plt.subplots(
            len(panels), 1, figsize=(max(6, 1.1 * len(pairs)), 4.2 * len(panels)), squeeze=False
        )
        for ax, (base, shown) in zip(axes[:, 0], panels):
            width = 0.8 / len(shown)
            for i, config in enumerate(shown):
                ref = dgl_of(config) if base == "dgl" else base
                xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(pairs))]
                values = [
                    epoch[(d, m, ref)] / epoch[(d, m, config)]
                    if (d, m, config) in epoch and (d, m, ref) in epoch
                    else float("nan")
                    for d, m in pairs
                ]
                bars = ax.bar(xs, values, width, label=config)
                ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=1)
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_xticks(range(len(pairs)))
            ax.set_xticklabels([f"{d}\n{m}" for d, m in pairs], rotation=30, ha="right", fontsize=8)
            name = "DGL in the same precision" if base == "dgl" else "the sequential loop"
            ax.set_title(f"epoch-time speed-up vs {name} (>1: faster)")
            ax.set_ylabel(f"{base} epoch time / epoch time")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "speedup.png", dpi=120)
        plt.close(fig)

    first = runs[0]
    shown_runs = [
        run
        for run in runs
        if (run["dataset"], run["model"], run["seed"]) == (first["dataset"], first["model"], first["seed"])
    ]
    with_gpu = any(g is not None for run in shown_runs for *_, g in run["timeline"])
    peak = max((c for run in shown_runs for _, c, *_ in run["timeline"]), default=1.0)
    end = max((t for run in shown_runs for t, *_ in run["timeline"]), default=1.0)
    fig, axes = plt.subplots(
        len(shown_runs), 1, figsize=(9, 1.9 * len(shown_runs) + 0.6), sharex=True, squeeze=False
    )
    for ax, run in zip(axes[:, 0], shown_runs):
        ts = [t for t, *_ in run["timeline"]]
        cores = [c for _, c, *_ in run["timeline"]]
        ax.fill_between(ts, cores, step="post", alpha=0.35)
        ax.step(ts, cores, where="post", lw=1, label="CPU (cores busy)")
        ax.set_ylim(0, max(1.0, peak) * 1.1)
        ax.set_xlim(0, end)
        ax.set_ylabel("cores busy")
        ax.set_title(f"{run['config']}: {run['epoch_time_s']:.3f} s an epoch", fontsize=9, loc="left")
        if with_gpu:
            gpu_ax = ax.twinx()
            gpu_ax.plot(ts, [100.0 * (g or 0.0) for *_, g in run["timeline"]], color="tab:red", lw=1)
            gpu_ax.set_ylim(0, 105)
            gpu_ax.set_ylabel("GPU busy, %", color="tab:red")
    axes[-1, 0].set_xlabel("seconds since the process started (data loading included)")
    fig.suptitle(f"utilisation over time: {first['dataset']}, {first['model']}, seed {first['seed']}")
    fig.tight_layout()
    fig.savefig(out / "utilisation.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py grid", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="sage")
    parser.add_argument("--datasets", default="cora")
    parser.add_argument("--configs", default="sequential,pipeline")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--extra", default="", help="more recipe overrides for our runs, space separated")
    parser.add_argument("--dgl-python", default=str(REPO / ".venv-dgl" / "bin" / "python"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", type=Path, default=REPO / "bench_out" / "grid")
    parser.add_argument(
        "--replot", action="store_true", help="redraw the PNGs from --out/grid.json; runs nothing"
    )
    args = parser.parse_args(argv)
    if args.replot:
        saved = args.out / "grid.json"
        if not saved.is_file():
            parser.error(f"--replot: {saved} does not exist (run the grid with --out {args.out} first)")
        plot(json.loads(saved.read_text()), args.out)
        print(f"wrote {args.out / 'speedup.png'} and {args.out / 'utilisation.png'} from {saved}")
        return 0
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in DGL_CONFIGS and c not in CONFIG_OVERRIDES]
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {sorted(CONFIG_OVERRIDES) + ['dgl']}")
    args.out.mkdir(parents=True, exist_ok=True)

    runs = []
    for dataset in args.datasets.split(","):
        for model in args.models.split(","):
            for config, seed in run_order(configs, [int(s) for s in args.seeds.split(",")]):
                if config in DGL_CONFIGS:
                    result = run_dgl(model, dataset, seed, args, bf16=config == "dgl_bf16")
                else:
                    result = run_ours(config, model, dataset, seed, args)
                result.update(dataset=dataset, model=model, config=config, seed=seed)
                runs.append(result)
                print(
                    f"{dataset:>18} {model:>10} {config:>13} seed {seed}: epoch "
                    f"{result['epoch_time_s']:.3f} s, batch {result['batch_time_ms']:.1f} ms, "
                    f"test {result['metric']:.4f}"
                    + (f", producer {result['producer']}" if result.get("producer") else "")
                    + (
                        f", GPU busy {100 * result['gpu_busy']:.0f}%"
                        if result.get("gpu_busy") is not None
                        else ""
                    ),
                    flush=True,
                )
    (args.out / "grid.json").write_text(json.dumps(runs))
    plot(runs, args.out)
    write_report("Comparison grid", machine_header("grid", argv), summarise(runs), args.out / "grid.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
